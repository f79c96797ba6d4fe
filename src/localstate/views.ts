// Service views shared by every node that sees a service the same way.
//
// A node's view of a service depends on the node only through locality (does
// it host an endpoint, is it named in a node hint) and its zone (only if the
// endpoints carry zone hints). Nodes of the same "class" share one computed
// view, so one change costs one computation per class, not per node.
import type { Store } from '../store/store.js';
import { computeServiceView, type ServiceView } from './service-view.js';
import type { NodeContext } from './topology.js';

interface Entry {
  version: number;
  /** nodes hosting an endpoint of the service or named in a node hint */
  specialNodes: Set<string>;
  usesZones: boolean;
  byClass: Map<string, ServiceView | undefined>;
}

export class ServiceViews {
  private readonly entries = new Map<string, Entry>();
  private readonly unsubscribe: () => void;
  /** views computed (cache misses), for benchmarks and stats */
  computed = 0;

  constructor(
    private readonly store: Store,
    readonly proxyName = '',
  ) {
    // drop entries of deleted services as soon as the store forgets them
    this.unsubscribe = store.subscribe((change) => {
      for (const key of change.services) {
        if (!store.getService(key) && store.slicesOfService(key).length === 0) this.entries.delete(key);
      }
    });
  }

  /** Stops following the store (a ServiceViews that outlives its use would leak). */
  close(): void {
    this.unsubscribe();
    this.entries.clear();
  }

  view(key: string, node: NodeContext): ServiceView | undefined {
    const version = this.store.serviceVersion(key);
    let e = this.entries.get(key);
    if (!e || e.version !== version) {
      e = this.newEntry(key, version);
      this.entries.set(key, e);
    }
    const zone = e.usesZones ? `z:${node.zone}` : '*';
    const cls = e.specialNodes.has(node.name) ? `n:${node.name}|${zone}` : zone;
    if (e.byClass.has(cls)) return e.byClass.get(cls);
    const stored = this.store.getService(key);
    const view = stored ? computeServiceView(stored.service, this.store.slicesOfService(key), node, this.proxyName) : undefined;
    this.computed++;
    e.byClass.set(cls, view);
    return view;
  }

  private newEntry(key: string, version: number): Entry {
    const specialNodes = new Set<string>();
    let usesZones = false;
    for (const slice of this.store.slicesOfService(key)) {
      for (const info of slice.endpoints) {
        if (info.Topology?.Node) specialNodes.add(info.Topology.Node);
        for (const n of info.Hints?.Nodes ?? []) specialNodes.add(n);
        if ((info.Hints?.Zones.length ?? 0) > 0) usesZones = true;
      }
    }
    return { version, specialNodes, usesZones, byClass: new Map() };
  }
}
