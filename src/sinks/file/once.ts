// One node's state for `to-file --once`, computed straight from the store one
// Service at a time as it is written: the same services, endpoints and order
// as LocalDiff's first diff through FullStateSink, without the views, ops and
// full state a stream that goes on keeps (most of the process's memory,
// and a good part of its time, for one write).
import type { Store } from '../../store/store.js';
import type { LocalNode, ServiceCIDR } from '../../api/model.js';
import type { ServiceEndpoints } from '../../diff/fullstate.js';
import { localNodeOf } from '../../diff/local-diff.js';
import { computeServiceView } from '../../localstate/service-view.js';

export interface NodeStateOnce {
  readonly node?: LocalNode;
  readonly serviceCIDRs: readonly ServiceCIDR[];
  /** computed as they are iterated (once), sorted by key as FullStateSink sorts them */
  readonly services: Iterable<ServiceEndpoints>;
}

const byString = (a: string, b: string) => (a < b ? -1 : a > b ? 1 : 0);

/** The node's state as it stands in the store now: iterate it before the store changes. */
export function nodeStateOnce(store: Store, nodeName: string, proxyName: string): NodeStateOnce {
  const stored = store.getNode(nodeName)?.node;
  const ctx = { name: nodeName, zone: stored?.Topology?.Zone ?? '' };
  const keys = [...store.serviceKeys()].sort(byString);
  function* services(): Generator<ServiceEndpoints> {
    for (const key of keys) {
      const s = store.getService(key);
      const slices = s && store.slicesOfService(key).map((sl) => ({ endpoints: store.sliceEndpointsOnce(sl) }));
      const v = s && computeServiceView(s.service, slices!, ctx, proxyName, false);
      if (!v) continue;
      // a view's endpoints are sorted by path and unique, all under the service's key: FullStateSink's order
      yield { service: v.service, endpoints: v.endpoints.map((e) => e.endpoint) };
    }
  }
  return { node: stored && localNodeOf(stored), serviceCIDRs: store.serviceCIDRs().map((c) => c.cidr), services: services() };
}
