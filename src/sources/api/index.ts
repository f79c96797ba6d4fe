// kpng api: a store fed by another kpng's global stream (/globalv1.Sets/Watch),
// to chain brains (e.g. a regional cache in front of the API server's brain).
//
// Ops are buffered until Sync, then the whole diff is applied in one store
// update, and every kind is marked synced after the first Sync. Endpoints
// come twice (by service and by slice, kpng's double index); only the
// by-slice copies ("ns||slice|hash") are used, to rebuild each slice. After a
// reconnect the full resend is diffed against what we had, so the store (and
// every node behind it) sees only what really changed.
import type * as L from '../../api/gen/api/localv1/api_pb.js';
import * as G from '../../api/gen/api/globalv1/api_pb.js';
import { hostname } from 'node:os';
import { fromBinary } from '@bufbuild/protobuf';
import { LocalSet } from '../../api/model.js';
import { endpointInfoProblem, globalPath, nodeProblem, serviceCIDRProblem, serviceProblem } from '../../api/validate.js';
import { runWatch } from '../../api/grpc/client.js';
import type { ClientTLS } from '../../api/grpc/tls.js';
import { GLOBAL_SETS_HEADER, globalWatchMethod } from '../../api/grpc/wire.js';
import { KINDS, type Store } from '../../store/store.js';
import type { Logger } from '../../runtime/log.js';

interface MirrorSlice {
  namespace: string;
  name: string;
  /** endpoint key (hex hash) -> info */
  endpoints: Map<string, G.EndpointInfo>;
}

/** What the upstream sent us, as our store wants it. */
class Mirror {
  nodes = new Map<string, G.Node>();
  services = new Map<string, L.Service>();
  slices = new Map<string, MirrorSlice>();
  cidrs = new Map<string, L.ServiceCIDR>();
}

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
  private mirror = new Mirror();
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

  private apply() {
    const ops = this.pending;
    this.pending = [];
    const nodes = new Set<string>();
    const services = new Set<string>();
    const slices = new Set<string>();
    const cidrs = new Set<string>();
    const m = this.mirror;
    for (const item of ops) {
      const op = item.Op;
      if (op.case === 'Reset') {
        // everything we had is in question: what is not resent goes
        for (const k of m.nodes.keys()) nodes.add(k);
        for (const k of m.services.keys()) services.add(k);
        for (const k of m.slices.keys()) slices.add(k);
        for (const k of m.cidrs.keys()) cidrs.add(k);
        this.mirror = new Mirror();
        continue;
      }
      const cur = this.mirror;
      if (op.case !== 'Set' && op.case !== 'Delete') {
        this.log.warn('api: ignoring an op of an unknown kind');
        continue;
      }
      const set = op.case === 'Set' ? (op.value.Ref?.Set ?? LocalSet.UnknownSet) : op.value.Set;
      const path = op.case === 'Set' ? (op.value.Ref?.Path ?? '') : op.value.Path;
      const parsed = globalPath(set, path);
      if (typeof parsed === 'string') {
        this.log.warn({ set: LocalSet[set] ?? set, path, problem: parsed }, `api: ignoring a ${op.case} of ${LocalSet[set] ?? set} ${JSON.stringify(path)} (${parsed})`);
        continue;
      }
      const { namespace: ns, name, source, key } = parsed;
      const bytes = op.case === 'Set' ? op.value.Bytes : undefined;
      /** a value that does not decode or is not valid: one line; the last good one (from before a Reset too) stays */
      const refuse = (what: string, problem: string, keepLast: () => void) => {
        this.log.warn({ set: LocalSet[set], path, problem }, `api: ignoring an invalid ${what} (${problem}); its last good version stays`);
        keepLast();
      };
      const decode = <T>(f: () => T): T | Error => {
        try {
          return f();
        } catch (e) {
          return e as Error;
        }
      };
      /** why a decoded value is refused: it does not decode, is invalid, or names another object than its path */
      const problemOf = <T>(v: T | Error | undefined, check: (v: T) => string | undefined): string | undefined =>
        v instanceof Error ? `does not decode: ${v.message}` : v === undefined ? (bytes ? 'no value' : undefined) : check(v);
      const same = (what: string, got: string, want: string) => (got === want ? undefined : `${what} ${JSON.stringify(got)} is not its path's ${JSON.stringify(want)}`);
      switch (set) {
        case LocalSet.GlobalNodeInfos: {
          nodes.add(name);
          const node = bytes && decode(() => fromBinary(G.NodeInfoSchema, bytes).Node);
          const problem = problemOf(node, (n) => nodeProblem(n) ?? same('Name', n.Name, name));
          if (problem) refuse(`Node ${name}`, problem, () => (m.nodes.has(name) ? cur.nodes.set(name, m.nodes.get(name)!) : undefined));
          else if (node && !(node instanceof Error)) cur.nodes.set(name, node);
          else cur.nodes.delete(name);
          break;
        }
        case LocalSet.GlobalServiceInfos: {
          const k = `${ns}/${name}`;
          services.add(k);
          const svc = bytes && decode(() => fromBinary(G.ServiceInfoSchema, bytes).Service);
          const problem = problemOf(svc, (s) => serviceProblem(s) ?? same('Namespace/Name', `${s.Namespace}/${s.Name}`, k));
          if (problem) refuse(`Service ${k}`, problem, () => (m.services.has(k) ? cur.services.set(k, m.services.get(k)!) : undefined));
          else if (svc && !(svc instanceof Error)) cur.services.set(k, svc);
          else cur.services.delete(k);
          break;
        }
        case LocalSet.GlobalEndpointInfos: {
          if (name !== '') break; // the by-service copy of a by-slice endpoint
          const sk = `${ns}/${source}`;
          slices.add(sk);
          let s = cur.slices.get(sk);
          if (bytes) {
            const info = decode(() => fromBinary(G.EndpointInfoSchema, bytes));
            const problem = problemOf(info, (i) => endpointInfoProblem(i) ?? same('Namespace', i.Namespace, ns) ?? (i.SourceName === '' ? undefined : same('SourceName', i.SourceName, source)));
            if (problem || info instanceof Error) {
              refuse(`endpoint ${key} of EndpointSlice ${sk}`, problem ?? 'does not decode', () => {
                const last = m.slices.get(sk)?.endpoints.get(key);
                if (!last) return;
                if (!s) cur.slices.set(sk, (s = { namespace: ns, name: source, endpoints: new Map() }));
                s.endpoints.set(key, last);
              });
              break;
            }
            info.Hash = 0n; // ours is computed when we serve it
            if (!s) cur.slices.set(sk, (s = { namespace: ns, name: source, endpoints: new Map() }));
            s.endpoints.set(key, info);
          } else if (s) {
            s.endpoints.delete(key);
            if (s.endpoints.size === 0) cur.slices.delete(sk);
          }
          break;
        }
        case LocalSet.GlobalServiceCIDRInfos: {
          cidrs.add(name);
          const c = bytes && decode(() => fromBinary(G.ServiceCIDRInfoSchema, bytes).ServiceCIDR);
          const problem = problemOf(c, (x) => serviceCIDRProblem(x) ?? same('Name', x.Name, name));
          if (problem) refuse(`ServiceCIDR ${name}`, problem, () => (m.cidrs.has(name) ? cur.cidrs.set(name, m.cidrs.get(name)!) : undefined));
          else if (c && !(c instanceof Error)) cur.cidrs.set(name, c);
          else cur.cidrs.delete(name);
          break;
        }
      }
    }

    const cur = this.mirror;
    const first = !this.synced;
    this.synced = true;
    this.store.update((tx) => {
      for (const n of nodes) {
        const node = cur.nodes.get(n);
        if (node) tx.setNode(node);
        else tx.deleteNode(n);
      }
      for (const k of services) {
        const svc = cur.services.get(k);
        const i = k.indexOf('/');
        if (svc) tx.setService(svc);
        else tx.deleteService(k.slice(0, i), k.slice(i + 1));
      }
      for (const k of slices) {
        const s = cur.slices.get(k);
        if (!s) {
          const i = k.indexOf('/');
          tx.deleteSlice(k.slice(0, i), k.slice(i + 1));
          continue;
        }
        // the upstream's endpoint order is not on the wire: keep a stable one
        const eps = [...s.endpoints.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)).map(([, e]) => e);
        tx.setSlice(s.namespace, s.name, eps[0].ServiceName, eps);
      }
      for (const n of cidrs) {
        const c = cur.cidrs.get(n);
        if (c) tx.setServiceCIDR(c);
        else tx.deleteServiceCIDR(n);
      }
      if (first) for (const k of KINDS) tx.setSynced(k);
    });
    this.applied++;
    if (first) this.log.info({ api: this.opts.address, services: cur.services.size, slices: cur.slices.size, nodes: cur.nodes.size }, 'api: initial state received');
  }
}
