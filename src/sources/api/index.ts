// kpng api: a store fed by another kpng's global stream (/globalv1.Sets/Watch),
// to chain brains (e.g. a regional cache in front of the API server's brain).
//
// Ops are buffered until Sync, then the whole diff is applied in one store
// update, and every kind is marked synced after the first Sync. After a
// reconnect the full resend goes through the reset filter (what the upstream
// sent, as bytes), so the store (and every node behind it) sees only what
// really changed. Endpoints come twice (by service and by slice, kpng's
// double index); only the by-slice copies ("ns||slice|hash") are used, to
// rebuild each slice. A value that does not decode or is not valid costs one
// log line; the store keeps its last good version.
import type * as L from '../../api/gen/api/localv1/api_pb.js';
import * as G from '../../api/gen/api/globalv1/api_pb.js';
import { hostname } from 'node:os';
import { fromBinary } from '@bufbuild/protobuf';
import { LocalSet } from '../../api/model.js';
import { endpointInfoProblem, globalPath, nodeProblem, serviceCIDRProblem, serviceProblem, type GlobalPath } from '../../api/validate.js';
import { ResetFilter } from '../../api/reset-filter.js';
import { runWatch } from '../../api/grpc/client.js';
import type { ClientTLS } from '../../api/grpc/tls.js';
import { GLOBAL_SETS_HEADER, globalWatchMethod } from '../../api/grpc/wire.js';
import { KINDS, type Store, type StoreTx } from '../../store/store.js';
import type { Logger } from '../../runtime/log.js';

/** A slice's endpoints by their key: the upstream sends them one by one, the store takes whole slices. */
interface MirrorSlice {
  namespace: string;
  name: string;
  endpoints: Map<string, G.EndpointInfo>;
}

/** What one diff changes in the store: per object, its new value or undefined (deleted); slices touched, written whole. */
class StoreWrites {
  readonly nodes = new Map<string, G.Node | undefined>();
  readonly services = new Map<string, L.Service | undefined>();
  readonly cidrs = new Map<string, L.ServiceCIDR | undefined>();
  readonly slices = new Set<string>();

  constructor(private readonly mirror: Map<string, MirrorSlice>) {}

  endpoint(p: GlobalPath, info: G.EndpointInfo | undefined): void {
    const key = `${p.namespace}/${p.source}`;
    this.slices.add(key);
    let s = this.mirror.get(key);
    if (info) {
      info.Hash = 0n; // ours is computed when we serve it
      if (!s) this.mirror.set(key, (s = { namespace: p.namespace, name: p.source, endpoints: new Map() }));
      s.endpoints.set(p.key, info);
    } else if (s) {
      s.endpoints.delete(p.key);
      if (s.endpoints.size === 0) this.mirror.delete(key);
    }
  }

  /** all of it, in one store transaction */
  apply(tx: StoreTx): void {
    for (const [name, node] of this.nodes) {
      if (node) tx.setNode(node);
      else tx.deleteNode(name);
    }
    for (const [key, svc] of this.services) {
      const i = key.indexOf('/');
      if (svc) tx.setService(svc);
      else tx.deleteService(key.slice(0, i), key.slice(i + 1));
    }
    for (const key of this.slices) {
      const s = this.mirror.get(key);
      if (!s) {
        const i = key.indexOf('/');
        tx.deleteSlice(key.slice(0, i), key.slice(i + 1));
        continue;
      }
      // the upstream's endpoint order is not on the wire: keep a stable one
      const eps = [...s.endpoints.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)).map(([, e]) => e);
      tx.setSlice(s.namespace, s.name, eps[0].ServiceName, eps);
    }
    for (const [name, cidr] of this.cidrs) {
      if (cidr) tx.setServiceCIDR(cidr);
      else tx.deleteServiceCIDR(name);
    }
  }
}

/** A set of the global stream: how log lines name its objects, how a value decodes, what makes one invalid, and what it writes (undefined: a Delete). */
interface GlobalKind<V> {
  name(p: GlobalPath): string;
  decode(bytes: Uint8Array): V | undefined;
  problem(v: V, p: GlobalPath): string | undefined;
  write(w: StoreWrites, p: GlobalPath, v: V | undefined): void;
}

const kind = <V>(k: GlobalKind<V>) => k as GlobalKind<unknown>;
const same = (what: string, got: string, want: string) => (got === want ? undefined : `${what} ${JSON.stringify(got)} is not its path's ${JSON.stringify(want)}`);

const GLOBAL_KINDS: Partial<Record<LocalSet, GlobalKind<unknown>>> = {
  [LocalSet.GlobalNodeInfos]: kind<G.Node>({
    name: (p) => `Node ${p.name}`,
    decode: (b) => fromBinary(G.NodeInfoSchema, b).Node,
    problem: (n, p) => nodeProblem(n) ?? same('Name', n.Name, p.name),
    write: (w, p, n) => w.nodes.set(p.name, n),
  }),
  [LocalSet.GlobalServiceInfos]: kind<L.Service>({
    name: (p) => `Service ${p.namespace}/${p.name}`,
    decode: (b) => fromBinary(G.ServiceInfoSchema, b).Service,
    problem: (s, p) => serviceProblem(s) ?? same('Namespace/Name', `${s.Namespace}/${s.Name}`, `${p.namespace}/${p.name}`),
    write: (w, p, s) => w.services.set(`${p.namespace}/${p.name}`, s),
  }),
  [LocalSet.GlobalEndpointInfos]: kind<G.EndpointInfo>({
    name: (p) => `endpoint ${p.key} of EndpointSlice ${p.namespace}/${p.source}`,
    decode: (b) => fromBinary(G.EndpointInfoSchema, b),
    problem: (i, p) => endpointInfoProblem(i) ?? same('Namespace', i.Namespace, p.namespace) ?? (i.SourceName === '' ? undefined : same('SourceName', i.SourceName, p.source)),
    write: (w, p, i) => w.endpoint(p, i),
  }),
  [LocalSet.GlobalServiceCIDRInfos]: kind<L.ServiceCIDR>({
    name: (p) => `ServiceCIDR ${p.name}`,
    decode: (b) => fromBinary(G.ServiceCIDRInfoSchema, b).ServiceCIDR,
    problem: (c, p) => serviceCIDRProblem(c) ?? same('Name', c.Name, p.name),
    write: (w, p, c) => w.cidrs.set(p.name, c),
  }),
};

export interface ApiSourceOptions {
  readonly address: string;
  readonly tls?: ClientTLS;
  readonly minBackoffMs?: number;
  readonly maxBackoffMs?: number;
  /** with several brains (address a,b,...): see WatchClientOptions */
  readonly watchdogMs?: number;
  readonly failbackMs?: number;
}

export class ApiSource {
  /** what the upstream sent, as bytes: after a reconnect its resend becomes only what changed */
  private readonly held = new ResetFilter();
  private readonly slices = new Map<string, MirrorSlice>();
  private pending: L.OpItem[] = [];
  private synced = false;
  private readonly ac = new AbortController();
  private running?: Promise<void>;
  /** diffs applied (for tests and stats) */
  applied = 0;

  constructor(
    private readonly store: Store,
    private readonly log: Logger,
    private readonly opts: ApiSourceOptions,
  ) {}

  start(): void {
    this.running = runWatch(
      {
        address: this.opts.address,
        tls: this.opts.tls,
        log: this.log,
        signal: this.ac.signal,
        minBackoffMs: this.opts.minBackoffMs,
        maxBackoffMs: this.opts.maxBackoffMs,
        watchdogMs: this.opts.watchdogMs,
        failbackMs: this.opts.failbackMs,
        // chained brains spread over their upstream brains by host name
        key: hostname(),
        metadata: { [GLOBAL_SETS_HEADER]: LocalSet[LocalSet.GlobalServiceCIDRInfos] },
      },
      globalWatchMethod,
      {
        request: () => ({}) as G.GlobalWatchReq,
        // a diff cut short by a broken stream is dropped: the next stream resends all
        streamStart: () => (this.pending = []),
        op: (item) => {
          if (item.Op.case === 'Sync') this.apply();
          else this.pending.push(item);
        },
      },
    );
  }

  async stop(): Promise<void> {
    this.ac.abort();
    await this.running;
  }

  /** A diff, at its Sync: through the reset filter, then into the store in one update. */
  private apply(): void {
    const ops = this.pending;
    this.pending = [];
    const w = new StoreWrites(this.slices);
    for (const item of ops) this.take(item, w);
    for (const [set, path] of this.held.stale()) {
      const slot = this.held.table.find(set, path);
      const p = globalPath(set, path);
      if (slot === undefined || typeof p === 'string') continue;
      this.held.release(slot);
      GLOBAL_KINDS[set]!.write(w, p, undefined);
    }
    const first = !this.synced;
    this.synced = true;
    this.store.update((tx) => {
      w.apply(tx);
      if (first) for (const k of KINDS) tx.setSynced(k);
    });
    this.applied++;
    if (first) this.log.info({ api: this.opts.address, services: count(this.store.serviceKeys()), slices: this.slices.size, nodes: count(this.store.allNodes()) }, 'api: initial state received');
  }

  /** One op of a diff: what it changes, if it is news and valid. */
  private take(item: L.OpItem, w: StoreWrites): void {
    const op = item.Op;
    if (op.case === 'Reset') return void this.held.reset();
    if (op.case !== 'Set' && op.case !== 'Delete') return this.log.warn('api: ignoring an op of an unknown kind');
    const set = op.case === 'Set' ? (op.value.Ref?.Set ?? LocalSet.UnknownSet) : op.value.Set;
    const path = op.case === 'Set' ? (op.value.Ref?.Path ?? '') : op.value.Path;
    const p = globalPath(set, path);
    if (typeof p === 'string') {
      this.log.warn({ set: LocalSet[set] ?? set, path, problem: p }, `api: ignoring a ${op.case} of ${LocalSet[set] ?? set} ${JSON.stringify(path)} (${p})`);
      return;
    }
    // the by-service copy of a by-slice endpoint
    if (set === LocalSet.GlobalEndpointInfos && p.name !== '') return;
    const kind = GLOBAL_KINDS[set]!;
    if (op.case === 'Delete') {
      const slot = this.held.table.find(set, path);
      if (slot === undefined) return;
      this.held.release(slot);
      return kind.write(w, p, undefined);
    }
    const bytes = op.value.Bytes;
    const slot = this.held.saw(set, path);
    if (!this.held.isNews(slot, bytes)) return;
    // held as received, valid or not: its resend is no news either
    this.held.hold(slot, set, path, bytes);
    let value: unknown;
    let problem: string | undefined;
    try {
      value = kind.decode(bytes);
      problem = value === undefined ? 'no value' : kind.problem(value, p);
    } catch (e) {
      problem = `does not decode: ${(e as Error).message}`;
    }
    if (problem) this.log.warn({ set: LocalSet[set], path, problem }, `api: ignoring an invalid ${kind.name(p)} (${problem}); its last good version stays`);
    else kind.write(w, p, value);
  }
}

function count(it: Iterable<unknown>): number {
  let n = 0;
  for (const _ of it) n++;
  return n;
}
