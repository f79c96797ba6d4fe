// Builders for Kubernetes objects as the API server prints them, and a
// one-call way to load them into a Store and read a node's view.
import { Store, KINDS } from '../../src/store/store.js';
import { convertObject, InvalidObject } from '../../src/sources/objects.js';
import assert from 'node:assert/strict';
import { applyObject } from '../../src/sources/apply.js';
import { ServiceViews } from '../../src/localstate/views.js';
import { LocalDiff } from '../../src/diff/local-diff.js';
import type { LocalOp } from '../../src/diff/ops.js';
import { LocalSet } from '../../src/api/model.js';

type Obj = Record<string, any>;

export interface PortSpec {
  name?: string;
  port: number;
  protocol?: string;
  targetPort?: number | string;
  nodePort?: number;
}

export function service(ns: string, name: string, spec: Obj = {}, extra: Obj = {}): Obj {
  const { ports = [{ name: 'http', port: 80 }], clusterIP = '10.96.0.1', ...rest } = spec;
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { namespace: ns, name, ...(extra.metadata ?? {}) },
    spec: { type: 'ClusterIP', clusterIP, clusterIPs: clusterIP === '' ? undefined : [clusterIP], ports, ...rest },
    status: extra.status ?? {},
  };
}

export interface EndpointSpec {
  ip: string;
  node?: string;
  zone?: string;
  ready?: boolean;
  serving?: boolean;
  terminating?: boolean;
  pod?: string;
  zoneHints?: string[];
  nodeHints?: string[];
}

export function slice(ns: string, name: string, svc: string, endpoints: EndpointSpec[], ports: PortSpec[] = [{ name: 'http', port: 8080 }], extra: Obj = {}): Obj {
  const v6 = endpoints.some((e) => e.ip.includes(':'));
  return {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: { namespace: ns, name, labels: { 'kubernetes.io/service-name': svc, ...(extra.labels ?? {}) } },
    addressType: extra.addressType ?? (v6 ? 'IPv6' : 'IPv4'),
    ports: ports.map((p) => ({ name: p.name ?? '', port: p.port, protocol: p.protocol ?? 'TCP' })),
    endpoints: endpoints.map((e) => ({
      addresses: [e.ip],
      conditions: { ready: e.ready ?? true, serving: e.serving ?? e.ready ?? true, terminating: e.terminating ?? false },
      ...(e.node ? { nodeName: e.node } : {}),
      ...(e.zone ? { zone: e.zone } : {}),
      ...(e.pod ? { targetRef: { kind: 'Pod', name: e.pod, namespace: ns } } : {}),
      ...(e.zoneHints || e.nodeHints
        ? { hints: { ...(e.zoneHints ? { forZones: e.zoneHints.map((z) => ({ name: z })) } : {}), ...(e.nodeHints ? { forNodes: e.nodeHints.map((n) => ({ name: n })) } : {}) } }
        : {}),
    })),
  };
}

export function node(name: string, zone?: string, ips: string[] = [], extra: Obj = {}): Obj {
  return {
    apiVersion: 'v1',
    kind: 'Node',
    metadata: { name, labels: zone ? { 'topology.kubernetes.io/zone': zone } : {}, ...(extra.metadata ?? {}) },
    spec: extra.spec ?? {},
    status: { addresses: ips.map((a) => ({ type: 'InternalIP', address: a })) },
  };
}

export function serviceCIDR(name: string, cidrs: string[]): Obj {
  return { apiVersion: 'networking.k8s.io/v1', kind: 'ServiceCIDR', metadata: { name }, spec: { cidrs } };
}

export function load(store: Store, objects: Obj[]): void {
  store.update((tx) => {
    for (const o of objects) {
      const c = convertObject(o);
      if (c.kind !== 'Ignored') applyObject(tx, c);
    }
  });
}

export function syncedStore(objects: Obj[] = []): Store {
  const store = new Store();
  store.update((tx) => KINDS.forEach((k) => tx.setSynced(k)));
  load(store, objects);
  return store;
}

/** A node's diff stream over a store, with ops rendered as short strings. */
export function watch(store: Store, nodeName: string, sets: LocalSet[] = []) {
  const views = new ServiceViews(store);
  const diff = new LocalDiff(store, views, nodeName, { sets });
  return {
    diff,
    next: (): readonly LocalOp[] => diff.next(),
    nextText: (): string[] => diff.next().map(opText),
  };
}

export function opText(op: LocalOp): string {
  switch (op.kind) {
    case 'reset': return 'reset';
    case 'sync': return 'sync';
    case 'set': return `set ${LocalSet[op.set]} ${op.path}`;
    case 'delete': return `delete ${LocalSet[op.set]} ${op.path}`;
  }
}

/** The field convertObject names when it refuses o (fails the test when it does not). */
export function invalidField(o: unknown): string {
  try {
    convertObject(o);
  } catch (e) {
    if (e instanceof InvalidObject) return e.field;
    throw e;
  }
  assert.fail('expected InvalidObject');
}
