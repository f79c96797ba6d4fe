// A synthetic cluster on the test API server (Services, EndpointSlices,
// Nodes, a ServiceCIDR) and a seeded churn of the changes a real cluster
// sees: pods come and go, readiness flaps, and many updates that change
// nothing a proxy uses (heartbeats, annotations, status, resourceVersion
// bumps). Plus the expected node-local state computed from the server's
// objects with the converter, for comparison with what a source built.
import type { Store } from '../../src/store/store.js';
import { ServiceViews } from '../../src/localstate/views.js';
import { LocalDiff } from '../../src/diff/local-diff.js';
import { FullStateSink, type FullState } from '../../src/diff/fullstate.js';
import { nodeStateDocument, globalStateDocument } from '../../src/sinks/file/index.js';
import { LocalSet } from '../../src/api/model.js';
import { convertObject, InvalidObject } from '../../src/sources/objects.js';
import { node, service, slice, syncedStore } from './k8s.js';
import { TestApiServer, RESOURCES, type KubeObject, type ResourceName } from './apiserver.js';

export const PROXY_NAME_LABEL = 'service.kubernetes.io/service-proxy-name';

/** mulberry32: a small seeded PRNG, so a failing churn can be replayed */
export function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export interface Pod {
  name: string;
  ip: string;
  node: string;
  ready: boolean;
}

/** A Node as the kubelet keeps it: hostname and zone labels, a heartbeat condition. */
export function nodeObject(name: string, i: number, zone = `zone-${i % 3}`): KubeObject {
  const n = node(name, zone, [`192.168.${i >> 8}.${i & 255}`], { spec: { podCIDR: `10.244.${i}.0/24`, podCIDRs: [`10.244.${i}.0/24`] } });
  n.metadata.labels['kubernetes.io/hostname'] = name;
  n.status.conditions = [{ type: 'Ready', status: 'True', lastHeartbeatTime: new Date(0).toISOString() }];
  return n as KubeObject;
}

export function serviceObject(ns: string, name: string, clusterIP: string, extra: { type?: string; itpLocal?: boolean; labels?: Record<string, string>; port?: number } = {}): KubeObject {
  const port: Record<string, unknown> = { name: 'http', port: extra.port ?? 80, protocol: 'TCP', targetPort: 8080 };
  if (extra.type === 'NodePort') port.nodePort = 30000 + (Number(clusterIP.split('.')[3]) % 2000);
  const spec = { type: extra.type ?? 'ClusterIP', clusterIP, ports: [port], internalTrafficPolicy: extra.itpLocal ? 'Local' : 'Cluster' };
  return service(ns, name, spec, { metadata: { labels: { app: name, ...extra.labels }, annotations: {} }, status: { loadBalancer: {} } }) as KubeObject;
}

/** An EndpointSlice as the EndpointSlice controller writes it (managed-by label, pod targetRefs). */
export function sliceObject(ns: string, name: string, svc: string, pods: Pod[], labels: Record<string, string> = {}): KubeObject {
  const eps = pods.map((p) => ({ ip: p.ip, node: p.node, ready: p.ready, pod: p.name }));
  const o = slice(ns, name, svc, eps, [{ name: 'http', port: 8080 }], { labels: { 'endpointslice.kubernetes.io/managed-by': 'endpointslice-controller.k8s.io', ...labels } });
  o.metadata.annotations = {};
  return o as KubeObject;
}

export interface ClusterShape {
  services: number;
  pods: number;
  nodes: number;
  namespaces?: number;
}

interface Svc {
  ns: string;
  name: string;
  slice: string;
  pods: Pod[];
  proxyName?: string;
}

export type ChurnOp =
  | 'createService'
  | 'deleteService'
  | 'addPod'
  | 'removePod'
  | 'replacePod'
  | 'readinessFlap'
  | 'changePort'
  | 'toggleProxyName'
  | 'createInvalid'
  // no-ops for a proxy
  | 'serviceAnnotation'
  | 'serviceStatus'
  | 'serviceBump'
  | 'sliceAnnotation'
  | 'sliceBump'
  | 'nodeHeartbeat'
  | 'otherNodeLabel';

export const NOOP_OPS: readonly ChurnOp[] = ['serviceAnnotation', 'serviceStatus', 'serviceBump', 'sliceAnnotation', 'sliceBump', 'nodeHeartbeat'];

export class SyntheticCluster {
  readonly nodes: string[] = [];
  private readonly services: Svc[] = [];
  private ipCounter = 0;
  private podCounter = 0;
  private svcCounter = 0;
  private invalid: string[] = [];

  constructor(
    readonly server: TestApiServer,
    readonly rand: () => number,
  ) {}

  private pick<T>(list: readonly T[]): T {
    return list[Math.floor(this.rand() * list.length)];
  }

  private nextClusterIP(): string {
    const n = ++this.ipCounter;
    return `10.96.${(n >> 8) & 255}.${n & 255}`;
  }

  private newPod(svc: string, node = this.pick(this.nodes)): Pod {
    const n = ++this.podCounter;
    return { name: `${svc}-${n.toString(36)}`, ip: `10.${128 + ((n >> 16) & 127)}.${(n >> 8) & 255}.${n & 255}`, node, ready: true };
  }

  populate(shape: ClusterShape): void {
    for (let i = 0; i < shape.nodes; i++) {
      const name = `node-${i}`;
      this.nodes.push(name);
      this.server.put(nodeObject(name, i));
    }
    this.server.put({ kind: 'ServiceCIDR', metadata: { name: 'kubernetes' }, spec: { cidrs: ['10.96.0.0/16'] } });
    const nss = shape.namespaces ?? 10;
    for (let i = 0; i < shape.services; i++) {
      // spread the pods so the total is shape.pods
      const pods = Math.floor(((i + 1) * shape.pods) / shape.services) - Math.floor((i * shape.pods) / shape.services);
      this.createService(`ns-${i % nss}`, pods);
    }
  }

  createService(ns = `ns-${Math.floor(this.rand() * 10)}`, pods = 1 + Math.floor(this.rand() * 3)): void {
    const name = `svc-${(++this.svcCounter).toString(36)}`;
    const svc: Svc = { ns, name, slice: `${name}-${Math.floor(this.rand() * 1e6).toString(36)}`, pods: [] };
    for (let i = 0; i < pods; i++) svc.pods.push(this.newPod(name));
    const r = this.rand();
    this.server.put(serviceObject(ns, name, this.nextClusterIP(), { type: r < 0.2 ? 'NodePort' : 'ClusterIP', itpLocal: r > 0.9 }));
    this.putSlice(svc);
    this.services.push(svc);
  }

  private putSlice(svc: Svc): void {
    this.server.put(sliceObject(svc.ns, svc.slice, svc.name, svc.pods, svc.proxyName ? { [PROXY_NAME_LABEL]: svc.proxyName } : {}));
  }

  private someService(): Svc | undefined {
    return this.services.length ? this.pick(this.services) : undefined;
  }

  /** Performs one change; returns false when it could not (e.g. nothing to delete). */
  apply(op: ChurnOp): boolean {
    const s = this.server;
    const svc = this.someService();
    switch (op) {
      case 'createService':
        this.createService();
        return true;
      case 'deleteService': {
        if (!svc || this.services.length < 5) return false;
        this.services.splice(this.services.indexOf(svc), 1);
        s.delete('EndpointSlice', `${svc.ns}/${svc.slice}`);
        s.delete('Service', `${svc.ns}/${svc.name}`);
        return true;
      }
      case 'addPod':
        if (!svc) return false;
        svc.pods.push(this.newPod(svc.name));
        this.putSlice(svc);
        return true;
      case 'removePod':
        if (!svc || !svc.pods.length) return false;
        svc.pods.splice(Math.floor(this.rand() * svc.pods.length), 1);
        this.putSlice(svc);
        return true;
      case 'replacePod': {
        if (!svc || !svc.pods.length) return false;
        const i = Math.floor(this.rand() * svc.pods.length);
        svc.pods[i] = this.newPod(svc.name);
        this.putSlice(svc);
        return true;
      }
      case 'readinessFlap': {
        if (!svc || !svc.pods.length) return false;
        const p = this.pick(svc.pods);
        p.ready = !p.ready;
        this.putSlice(svc);
        return true;
      }
      case 'changePort':
        if (!svc) return false;
        s.modify('Service', `${svc.ns}/${svc.name}`, (o) => (o.spec.ports[0].port = o.spec.ports[0].port === 80 ? 8000 : 80));
        return true;
      case 'toggleProxyName':
        // the EndpointSlice controller copies the Service's labels to its slices
        if (!svc) return false;
        svc.proxyName = svc.proxyName ? undefined : 'other-proxy';
        s.modify('Service', `${svc.ns}/${svc.name}`, (o) => {
          if (svc.proxyName) o.metadata.labels[PROXY_NAME_LABEL] = svc.proxyName;
          else delete o.metadata.labels[PROXY_NAME_LABEL];
        });
        this.putSlice(svc);
        return true;
      case 'createInvalid': {
        const name = `bad-${(++this.svcCounter).toString(36)}`;
        const o = serviceObject('ns-bad', name, this.nextClusterIP());
        o.spec.ports[0].port = 'eighty';
        s.put(o);
        this.invalid.push(`ns-bad/${name}`);
        return true;
      }
      case 'serviceAnnotation':
        if (!svc) return false;
        s.modify('Service', `${svc.ns}/${svc.name}`, (o) => (o.metadata.annotations['example.com/touched'] = String(this.rand())));
        return true;
      case 'serviceStatus':
        if (!svc) return false;
        s.modify('Service', `${svc.ns}/${svc.name}`, (o) => (o.status.conditions = [{ type: 'Example', status: this.rand() < 0.5 ? 'True' : 'False' }]));
        return true;
      case 'serviceBump':
        if (!svc) return false;
        s.modify('Service', `${svc.ns}/${svc.name}`);
        return true;
      case 'sliceAnnotation':
        if (!svc) return false;
        s.modify('EndpointSlice', `${svc.ns}/${svc.slice}`, (o) => (o.metadata.annotations['endpoints.kubernetes.io/last-change-trigger-time'] = new Date().toISOString()));
        return true;
      case 'sliceBump':
        if (!svc) return false;
        s.modify('EndpointSlice', `${svc.ns}/${svc.slice}`);
        return true;
      case 'nodeHeartbeat': {
        const n = this.pick(this.nodes);
        s.modify('Node', n, (o) => (o.status.conditions[0].lastHeartbeatTime = new Date(Date.now() + Math.floor(this.rand() * 1e6)).toISOString()));
        return true;
      }
      case 'otherNodeLabel': {
        const n = this.pick(this.nodes.slice(1));
        s.modify('Node', n, (o) => (o.metadata.labels['example.com/pool'] = String(Math.floor(this.rand() * 5))));
        return true;
      }
    }
  }

  /** A weighted random op: weights by name. */
  randomOp(weights: Partial<Record<ChurnOp, number>>): ChurnOp {
    const entries = Object.entries(weights) as [ChurnOp, number][];
    const total = entries.reduce((a, [, w]) => a + w, 0);
    let x = this.rand() * total;
    for (const [op, w] of entries) if ((x -= w) < 0) return op;
    return entries[entries.length - 1][0];
  }

  /** Pods on each node, to pick a node that hosts endpoints. */
  podsByNode(): Map<string, number> {
    const m = new Map<string, number>();
    for (const svc of this.services) for (const p of svc.pods) m.set(p.node, (m.get(p.node) ?? 0) + 1);
    return m;
  }
}

/** The server's final objects, loaded into a fresh store through the converter (invalid ones skipped). */
export function storeFromServer(server: TestApiServer, filter: Partial<Record<ResourceName, string>> = {}): Store {
  const valid = (o: KubeObject) => {
    try {
      convertObject(o);
      return true;
    } catch (e) {
      if (e instanceof InvalidObject) return false;
      throw e;
    }
  };
  return syncedStore((Object.keys(RESOURCES) as ResourceName[]).flatMap((r) => server.list(r, filter[r] ?? '')).filter(valid));
}

/** A node's full node-local state as to-file prints it (node, ServiceCIDRs, services with endpoints). */
export function nodeState(store: Store, nodeName: string, proxyName = ''): Record<string, unknown> {
  const views = new ServiceViews(store, proxyName);
  const diff = new LocalDiff(store, views, nodeName, { sets: [LocalSet.NodesSet, LocalSet.ServiceCIDRsSet] });
  let state: FullState | undefined;
  const sink = new FullStateSink((s) => void (state = s));
  for (const op of diff.next()) sink.send(op);
  diff.close();
  views.close();
  if (!state) throw new Error('nodeState: the store is not synced');
  return nodeStateDocument(state);
}

export { globalStateDocument };
