// Shared by the to-api tests: a small cluster, servers on both transports
// (a unix socket in a temp dir, TCP on 127.0.0.1 with an ephemeral port),
// a raw Watch client that records the wire, and bounded waiting.
import { after } from 'node:test';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { pino } from 'pino';
import type { LocalOp } from '../../src/diff/ops.js';
import * as grpc from '@grpc/grpc-js';
import { Store, KINDS } from '../../src/store/store.js';
import { ServiceViews } from '../../src/localstate/views.js';
import { convertObject } from '../../src/sources/objects.js';
import { applyObject, deleteObject } from '../../src/sources/apply.js';
import { LocalSet } from '../../src/api/model.js';
import type { OpItem } from '../../src/api/gen/api/localv1/api_pb.js';
import { ApiServer, type ApiServerOptions } from '../../src/sinks/api/server.js';
import { newClient } from '../../src/api/grpc/client.js';
import { parseAddress } from '../../src/api/grpc/address.js';
import { decodeOpItem, type WatchMethod } from '../../src/api/grpc/wire.js';
import type { ClientTLS } from '../../src/api/grpc/tls.js';
import { until } from '../helpers/until.js';

export const quiet = pino({ level: 'silent' });
export const TLS_DIR = fileURLToPath(new URL('../fixtures/tls-api/', import.meta.url));
export const ORIGINAL_PROTO_DIR = fileURLToPath(new URL('../fixtures/kpng-original/', import.meta.url));

export type Transport = 'unix' | 'tcp';
export const TRANSPORTS: readonly Transport[] = ['unix', 'tcp'];

type Obj = Record<string, any>;

// --- Kubernetes objects, as the API server prints them

export function svc(ns: string, name: string, clusterIP: string, spec: Obj = {}): Obj {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { namespace: ns, name },
    spec: { type: 'ClusterIP', clusterIP, clusterIPs: [clusterIP], ports: [{ name: 'http', port: 80, targetPort: 8080 }], ...spec },
  };
}

export interface Ep {
  ip: string;
  node?: string;
  pod?: string;
  ready?: boolean;
  zoneHints?: string[];
}

export function slice(ns: string, name: string, service: string, eps: Ep[]): Obj {
  return {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: { namespace: ns, name, labels: { 'kubernetes.io/service-name': service } },
    addressType: 'IPv4',
    ports: [{ name: 'http', port: 8080, protocol: 'TCP' }],
    endpoints: eps.map((e) => ({
      addresses: [e.ip],
      conditions: { ready: e.ready ?? true },
      ...(e.node ? { nodeName: e.node } : {}),
      ...(e.pod ? { targetRef: { kind: 'Pod', name: e.pod, namespace: ns } } : {}),
      ...(e.zoneHints ? { hints: { forZones: e.zoneHints.map((z) => ({ name: z })) } } : {}),
    })),
  };
}

export function node(name: string, zone?: string): Obj {
  return { apiVersion: 'v1', kind: 'Node', metadata: { name, labels: zone ? { 'topology.kubernetes.io/zone': zone } : {} }, spec: {}, status: {} };
}

function converted(o: Obj) {
  const c = convertObject(o);
  if (c.kind === 'Ignored') throw new Error(`ignored: ${c.reason}`);
  return c;
}

export function apply(store: Store, ...objects: Obj[]): void {
  store.update((tx) => objects.forEach((o) => applyObject(tx, converted(o))));
}

export function remove(store: Store, ...objects: Obj[]): void {
  store.update((tx) => objects.forEach((o) => deleteObject(tx, converted(o))));
}

export function syncedStore(objects: Obj[]): Store {
  const store = new Store();
  store.update((tx) => KINDS.forEach((k) => tx.setSynced(k)));
  if (objects.length) apply(store, ...objects);
  return store;
}

/** two nodes, two services: named endpoints, and one without a pod name */
export function smallCluster(): Obj[] {
  return [
    node('node-a', 'z1'),
    node('node-b', 'z2'),
    svc('ns', 'web', '10.96.0.10'),
    slice('ns', 'web-1', 'web', [
      { ip: '10.1.0.1', node: 'node-a', pod: 'web-a' },
      { ip: '10.1.0.2', node: 'node-b', pod: 'web-b' },
    ]),
    svc('ns', 'db', '10.96.0.20'),
    slice('ns', 'db-1', 'db', [{ ip: '10.1.0.9', node: 'node-b' }]),
  ];
}

// --- servers

export interface TestServer {
  readonly server: ApiServer;
  readonly address: string;
  readonly store: Store;
  readonly views: ServiceViews;
  stop(): Promise<void>;
}

export class TempDirs {
  private dirs: string[] = [];
  make(): string {
    const d = mkdtempSync(join(tmpdir(), 'kpng-api-'));
    this.dirs.push(d);
    return d;
  }
  cleanup(): void {
    for (const d of this.dirs) rmSync(d, { recursive: true, force: true });
    this.dirs = [];
  }
}

/** A test file's temporary directories and cleanups (servers, watches), undone in reverse after its tests, also when they fail. */
export function testResources(): { dirs: TempDirs; cleanups: (() => unknown)[] } {
  const dirs = new TempDirs();
  const cleanups: (() => unknown)[] = [];
  after(async () => {
    for (const c of cleanups.reverse()) await c();
    dirs.cleanup();
  });
  return { dirs, cleanups };
}

export function listenAddress(t: Transport, dirs: TempDirs): string {
  return t === 'unix' ? `unix://${join(dirs.make(), 'run', 'kpng.sock')}` : 'tcp://127.0.0.1:0';
}

export async function startServer(store: Store, listen: string, extra: Partial<ApiServerOptions> = {}, views = new ServiceViews(store)): Promise<TestServer> {
  const server = new ApiServer({ store, views, log: quiet, listen, ...extra });
  const address = await server.start();
  return { server, address, store, views, stop: () => server.stop(200) };
}

export function serverTLS(mtls: boolean) {
  return { cert: join(TLS_DIR, 'server.crt'), key: join(TLS_DIR, 'server.key'), ca: mtls ? join(TLS_DIR, 'ca.crt') : undefined };
}

export function clientTLS(who: 'client' | 'other-client' | 'none'): ClientTLS {
  if (who === 'none') return { ca: join(TLS_DIR, 'ca.crt') };
  return { ca: join(TLS_DIR, 'ca.crt'), cert: join(TLS_DIR, `${who}.crt`), key: join(TLS_DIR, `${who}.key`) };
}

// --- the wire, as text

export function itemText(item: OpItem): string {
  const op = item.Op;
  switch (op.case) {
    case 'Reset': return 'reset';
    case 'Sync': return 'sync';
    case 'Set': return `set ${LocalSet[op.value.Ref!.Set]} ${op.value.Ref!.Path}`;
    case 'Delete': return `delete ${LocalSet[op.value.Set]} ${op.value.Path}`;
    default: return '?';
  }
}

import { opText } from '../helpers/k8s.js';
export { opText };

/** Splits recorded items into diffs (each ends with Sync). */
export function diffsOf(items: OpItem[]): string[][] {
  const out: string[][] = [];
  let cur: string[] = [];
  for (const i of items) {
    cur.push(itemText(i));
    if (i.Op.case === 'Sync') (out.push(cur), (cur = []));
  }
  if (cur.length) out.push(cur);
  return out;
}

/**
 * A Watch client that records every OpItem; it sends the next request only
 * when told (or after each Sync with autoRequest).
 */
export class RawWatch<Req> {
  readonly items: OpItem[] = [];
  syncs = 0;
  error?: grpc.ServiceError;
  ended = false;
  private readonly client: grpc.Client;
  private readonly call: grpc.ClientDuplexStream<Req, OpItem>;

  constructor(
    address: string,
    private readonly method: WatchMethod<Req>,
    private readonly req: Req,
    opts: { tls?: ClientTLS; autoRequest?: boolean; metadata?: Record<string, string> } = {},
  ) {
    this.client = newClient(parseAddress(address), opts.tls);
    const md = new grpc.Metadata();
    for (const [k, v] of Object.entries(opts.metadata ?? {})) md.set(k, v);
    this.call = this.client.makeBidiStreamRequest(method.path, method.serialize, decodeOpItem, md, {});
    this.call.on('data', (item: OpItem) => {
      this.items.push(item);
      if (item.Op.case === 'Sync') {
        this.syncs++;
        if (opts.autoRequest) this.request();
      }
    });
    this.call.on('error', (e: grpc.ServiceError) => (this.error = e));
    this.call.on('end', () => (this.ended = true));
    this.request();
  }

  request(): void {
    this.call.write(this.req);
  }

  /** stop reading: HTTP/2 flow control then holds the server */
  pause(): void {
    this.call.pause();
  }

  resume(): void {
    this.call.resume();
  }

  async waitSyncs(n: number, timeoutMs = 5000): Promise<void> {
    await until(`${n} syncs (got ${this.syncs}${this.error ? `, error ${this.error.message}` : ''})`, () => this.syncs >= n || !!this.error, { timeoutMs });
    if (this.error && this.syncs < n) throw this.error;
  }

  async waitError(timeoutMs = 5000): Promise<grpc.ServiceError> {
    await until('a stream error', () => !!this.error, { timeoutMs });
    return this.error!;
  }

  close(): void {
    this.call.cancel();
    this.client.close();
  }
}

/** A backend that records the ops it gets (as opText) and counts Syncs; set values are read, so they must decode. */
export class RecordingBackend {
  ops: string[] = [];
  syncs = 0;
  send(op: LocalOp) {
    this.ops.push(opText(op));
    if (op.kind === 'sync') this.syncs++;
    if (op.kind === 'set') void op.value;
  }
  /** the ops since the last take */
  take(): string[] {
    const o = this.ops;
    this.ops = [];
    return o;
  }
}

/** One Service with one endpoint (ip) on node-a, as kubectl prints it. */
export const exampleClusterYaml = (ip = '10.244.1.10') => `
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: Node, metadata: {name: node-a}}
- apiVersion: v1
  kind: Service
  metadata: {name: web, namespace: demo}
  spec: {type: ClusterIP, clusterIP: 10.96.0.10, clusterIPs: [10.96.0.10], ports: [{name: http, port: 80, targetPort: 8080}]}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: web-1, namespace: demo, labels: {kubernetes.io/service-name: web}}
  addressType: IPv4
  ports: [{name: http, port: 8080, protocol: TCP}]
  endpoints:
  - {addresses: [${ip}], conditions: {ready: true}, nodeName: node-a, targetRef: {kind: Pod, name: web-1, namespace: demo}}
`;
