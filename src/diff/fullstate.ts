// Full-state consumption: the whole node-local state at every Sync, as kpng's
// fullstate.Sink gives it (services sorted by ns/name, endpoints by path).
import { LocalSet, type Service, type Endpoint, type LocalNode, type ServiceCIDR } from '../api/model.js';
import type { LocalOp, LocalSink } from './ops.js';

export interface ServiceEndpoints {
  readonly service: Service;
  readonly endpoints: readonly Endpoint[];
}

export interface FullState {
  readonly services: readonly ServiceEndpoints[];
  readonly node?: LocalNode;
  readonly serviceCIDRs: readonly ServiceCIDR[];
}

export class FullStateSink implements LocalSink {
  private readonly services = new Map<string, { service: Service; endpoints: Map<string, Endpoint> }>();
  private readonly orphans = new Map<string, Map<string, Endpoint>>();
  private node?: LocalNode;
  private readonly cidrs = new Map<string, ServiceCIDR>();

  constructor(private readonly callback: (state: FullState) => void | Promise<void>) {}

  send(op: LocalOp): void | Promise<void> {
    switch (op.kind) {
      case 'reset':
        this.services.clear();
        this.orphans.clear();
        this.node = undefined;
        this.cidrs.clear();
        return;
      case 'sync':
        return this.callback(this.state());
      case 'set':
        return this.set(op.set, op.path, op.value);
      case 'delete':
        return this.delete(op.set, op.path);
    }
  }

  /** The current state (what the next Sync will report). */
  state(): FullState {
    const services = [...this.services.entries()]
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
      .map(([, s]) => ({
        service: s.service,
        endpoints: [...s.endpoints.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)).map(([, e]) => e),
      }));
    const serviceCIDRs = [...this.cidrs.entries()].sort(([a], [b]) => (a < b ? -1 : 1)).map(([, c]) => c);
    return { services, node: this.node, serviceCIDRs };
  }

  private set(set: LocalSet, path: string, value: unknown) {
    switch (set) {
      case LocalSet.ServicesSet: {
        const prev = this.services.get(path);
        const endpoints = prev?.endpoints ?? this.orphans.get(path) ?? new Map<string, Endpoint>();
        this.orphans.delete(path);
        this.services.set(path, { service: value as Service, endpoints });
        return;
      }
      case LocalSet.EndpointsSet: {
        const [svcKey, epKey] = splitEndpointPath(path);
        const s = this.services.get(svcKey);
        if (s) s.endpoints.set(epKey, value as Endpoint);
        else {
          let m = this.orphans.get(svcKey);
          if (!m) this.orphans.set(svcKey, (m = new Map()));
          m.set(epKey, value as Endpoint);
        }
        return;
      }
      case LocalSet.NodesSet:
        this.node = value as LocalNode;
        return;
      case LocalSet.ServiceCIDRsSet:
        this.cidrs.set(path, value as ServiceCIDR);
        return;
    }
  }

  private delete(set: LocalSet, path: string) {
    switch (set) {
      case LocalSet.ServicesSet:
        this.services.delete(path);
        this.orphans.delete(path);
        return;
      case LocalSet.EndpointsSet: {
        const [svcKey, epKey] = splitEndpointPath(path);
        this.services.get(svcKey)?.endpoints.delete(epKey);
        this.orphans.get(svcKey)?.delete(epKey);
        return;
      }
      case LocalSet.NodesSet:
        this.node = undefined;
        return;
      case LocalSet.ServiceCIDRsSet:
        this.cidrs.delete(path);
        return;
    }
  }
}

/** "ns/svc/key" -> ["ns/svc", "key"] */
export function splitEndpointPath(path: string): [string, string] {
  const a = path.indexOf('/');
  const b = path.indexOf('/', a + 1);
  return [path.slice(0, b), path.slice(b + 1)];
}
