// The node agent: runs a backend on this node's diff stream, wherever the
// stream comes from (to-local: this process's store; `kpng local`: a brain
// over gRPC), the same way: the backend with its health and metrics servers
// (closed on exit), the node lock (one kpng per node), the tenant API
// (src/aggregator: other agents' rules, written by the backend in its own
// syncs), and
// kubeproxy_network_programming_duration_seconds for each Service a diff
// carried once the sync that applied it succeeded (the first diff, the state
// at start, is not a change: not timed).
import { hostname } from 'node:os';
import type { Logger } from '../../runtime/log.js';
import { LocalSet } from '../../api/model.js';
import { splitEndpointPath } from '../../diff/fullstate.js';
import type { LocalOp, LocalSink } from '../../diff/ops.js';
import { startBackends, type BackendSpec, type StartedBackend } from '../../backends/run.js';
import { getBackend } from '../../backends/registry.js';
import type { StatusReport, SyncStatus } from '../../api/grpc/status.js';
import type { SyncResult } from '../../backends/shared/runner.js';
import { ipFamily, metrics } from '../../runtime/metrics.js';
import { TRIM_AFTER_BURST_MS, trimMemory } from '../../runtime/memory.js';
import { nodeLockPath, takeNodeLock } from './node-lock.js';
import type { TenantFlags } from '../../aggregator/defaults.js';
import type { Aggregator } from '../../aggregator/aggregator.js';
import type { ServerCall } from '../../api/grpc/h2-server.js';

export interface NodeAgentOptions {
  /** one backend, or several on the same stream (each gets every op) */
  readonly backends: readonly BackendSpec[];
  readonly log: Logger;
  readonly signal: AbortSignal;
  /**
   * When the change the current diff carries for this Service was first seen
   * upstream (to-local: the store); asked once per Service and diff. Without
   * it, or when it does not know: when the node received the change's first op.
   */
  readonly changedAt?: (serviceKey: string) => number | undefined;
  /** BackendContext.packEndpoints */
  readonly packEndpoints?: boolean;
  /** the tenant API's flags (none, or --once: no tenants) */
  readonly tenants?: TenantFlags;
  /** the state socket's address: the node lock (node-lock.ts) lives beside it */
  readonly stateSocket?: string;
  /** feeds the ops to sink until the signal aborts (or the backend is done, with --once); status: the node agent's part of kpng status; stateRoutes: more for its state socket to serve (the tenants' status) */
  feed(sink: LocalSink, signal: AbortSignal, backend: StartedBackend, status: () => NodeAgentStatus, stateRoutes: ReadonlyMap<string, (call: ServerCall) => void>): Promise<void>;
}

/** What kpng status tells of a node agent: its node, its backends and their syncs, its servers. */
export type NodeAgentStatus = Pick<StatusReport, 'node' | 'backends' | 'healthzAddress' | 'metricsAddress'>;

function syncStatus(r: SyncResult): SyncStatus {
  const { ok, full, reason, durationMs, changes, skipped, repaired, error } = r;
  return { ok, full, reason, at: new Date(r.endedAt).toISOString(), durationMs, changes, skipped, repaired, ...(error ? { error } : {}) };
}

/** Follows each backend's syncs (the last one, the last good one) for kpng status. */
function trackStatus(specs: readonly BackendSpec[], b: StartedBackend): { synced(r: SyncResult, backend: number): void; report(): NodeAgentStatus } {
  const last: (SyncResult | undefined)[] = [];
  const lastOk: (SyncResult | undefined)[] = [];
  const modes = specs.map((s) => getBackend(s.name)?.proxyMode);
  // startBackends serves /healthz and /metrics for a dataplane backend, unless it runs once
  const serving = modes.some(Boolean) && !specs.some((s) => s.opts.once);
  return {
    synced(r, backend) {
      last[backend] = r;
      if (r.ok) lastOk[backend] = r;
    },
    report: () => ({
      node: b.nodeName,
      backends: specs.map((s, i) => {
        const l = last[i];
        const ok = lastOk[i];
        return { name: s.name, proxyMode: modes[i], lastSync: l && syncStatus(l), lastSuccess: ok && ok !== l ? syncStatus(ok) : undefined };
      }),
      ...(serving ? { healthzAddress: b.config.healthzBindAddress, metricsAddress: b.config.metricsBindAddress } : {}),
    }),
  };
}

const SLASH = 47;
/** the Service key serviceOfOp found last (a Service key holds one '/', an endpoint path two) */
let lastService = '';

/** The Service an op of the diff stream is about, or undefined (the node, ServiceCIDRs). */
export function serviceOfOp(op: LocalOp): string | undefined {
  if (op.kind !== 'set' && op.kind !== 'delete') return undefined;
  if (op.set === LocalSet.ServicesSet) return (lastService = op.path);
  if (op.set === LocalSet.EndpointsSet) {
    // a Service's endpoints come one after another: its key is sliced once,
    // not once per endpoint (a start brings several endpoint ops per Service)
    const p = op.path;
    const last = lastService;
    if (last && p.charCodeAt(last.length) === SLASH && p.startsWith(last)) return last;
    return (lastService = splitEndpointPath(p)[0]);
  }
  return undefined;
}

/** One diff's change to one Service, on its way to the dataplane. */
interface Change {
  /** when the change started (the latency's start) */
  readonly since: number;
  /** when its diff's Sync reached the backends (Infinity before): a sync that started later applied it */
  delivered: number;
  /** the dataplane backends that have not applied it yet */
  waiting: Set<number>;
}

/** changes kept per Service while syncs fail; beyond, the newest absorbs the next ones */
const MAX_CHANGES_PER_SERVICE = 8;

/**
 * Times each Service's changes, diff by diff, from their start to the end of
 * the first successful sync of every dataplane backend that began after the
 * change was delivered. A Service a sync left out (the dataplane refused it:
 * SyncResult.skipped) is not programmed, so it stays pending.
 */
export class ProgrammingLatency {
  private readonly pending = new Map<string, Change[]>();
  /** Services the current diff already has a change for */
  private readonly inDiff = new Map<string, Change>();
  /** the Service of the op delivered last (in inDiff) */
  private lastKey?: string;
  /**
   * the first diff is the node's state at start, not changes: not timed, as
   * kube-proxy times no change from before it started (it would be one
   * observation of the start time per Service, and cost time of the start)
   */
  private initial = true;

  constructor(
    private readonly reporting: readonly number[],
    private readonly changedAt?: (serviceKey: string) => number | undefined,
    private readonly observe = (seconds: number) => metrics.networkProgramming.observe({ ip_family: ipFamily() }, seconds),
    private readonly now = () => Date.now(),
  ) {}

  /** Services with changes not yet programmed (for tests) */
  get size(): number {
    return this.pending.size;
  }

  /** an op is about to reach the backends */
  delivering(op: LocalOp): void {
    if (this.initial) {
      if (op.kind === 'sync') this.initial = false;
      return;
    }
    if (op.kind === 'sync') {
      // the diff is complete: a sync that starts from now on applies all of it
      const now = this.now();
      for (const c of this.inDiff.values()) c.delivered = now;
      this.lastKey = undefined;
      return this.inDiff.clear();
    }
    const key = serviceOfOp(op);
    // a Service's ops come one after another: one lookup for all of them
    if (key === undefined || key === this.lastKey || !this.reporting.length) return;
    this.lastKey = key;
    if (this.inDiff.has(key)) return;
    let list = this.pending.get(key);
    if (!list) this.pending.set(key, (list = []));
    let c = list[list.length - 1];
    if (list.length < MAX_CHANGES_PER_SERVICE) list.push((c = { since: this.changedAt?.(key) ?? this.now(), delivered: Infinity, waiting: new Set(this.reporting) }));
    else (c.delivered = Infinity), (c.waiting = new Set(this.reporting));
    this.inDiff.set(key, c);
  }

  /** a sync of backend (its index) ended */
  synced(r: SyncResult, backend: number): void {
    if (!r.ok) return;
    const started = r.endedAt - r.durationMs;
    const skipped = r.skipped.length ? new Set(r.skipped) : undefined;
    for (const [key, list] of this.pending) {
      if (skipped?.has(key)) continue; // its last applied version stays: not programmed
      const left = list.filter((c) => {
        if (c.delivered > started) return true; // delivered while this sync ran: the next one applies it
        c.waiting.delete(backend);
        if (c.waiting.size) return true; // another backend has still to apply it
        this.observe((r.endedAt - c.since) / 1000);
        return false;
      });
      if (!left.length) this.pending.delete(key);
      else if (left.length < list.length) this.pending.set(key, left);
    }
  }
}

/** The aggregator and its server, when the node agent serves tenants (not with --once). */
async function startTenants(o: NodeAgentOptions): Promise<Aggregator | undefined> {
  if (!o.tenants?.socket || o.tenants.socket === 'none' || o.backends.some((s) => s.opts.once)) return undefined;
  // loaded when tenants are served
  const [{ Aggregator }, { defaultAggregatorConfig, loadAggregatorConfig }] = await Promise.all([import('../../aggregator/aggregator.js'), import('../../aggregator/config.js')]);
  const config = o.tenants.configFile ? loadAggregatorConfig(o.tenants.configFile) : defaultAggregatorConfig();
  return new Aggregator(config, o.log.child({ component: 'aggregator' }));
}

export async function runNodeAgent(o: NodeAgentOptions): Promise<void> {
  // a one-shot run (--once) applies a state and leaves; a running agent is the node's only one
  const once = o.backends.some((s) => s.opts.once);
  const lock = once ? undefined : takeNodeLock(nodeLockPath(o.stateSocket), { command: process.argv.slice(2).join(' '), node: String(o.backends[0]?.opts.nodeName || hostname()) }, o.log);
  try {
    await runAgent(o, once);
  } finally {
    lock?.release();
  }
}

async function runAgent(o: NodeAgentOptions, once: boolean): Promise<void> {
  const tenants = await startTenants(o);
  const b = await startBackends(o.backends, o.log, o.signal, { packEndpoints: o.packEndpoints, tenants });
  // once the backends are there: a tenant's first request finds its writer
  const server = tenants && (await import('../../aggregator/server.js'));
  const tenantServer = tenants && (await server!.startTenantServer({ address: o.tenants!.socket, aggregator: tenants, log: o.log }));
  const stateRoutes = new Map(tenants ? [server!.tenantListMethod(tenants)] : []);
  const stop = new AbortController();
  const onAbort = () => stop.abort();
  o.signal.addEventListener('abort', onAbort, { once: true });
  void b.done.then(() => stop.abort());
  const latency = new ProgrammingLatency(b.reporting, o.changedAt);
  const status = trackStatus(o.backends, b);
  // a full sync (start-up, a reconnect) is the burst that grows the heap;
  // with --once the process ends right after it
  let cancelTrim = () => {};
  const unsubscribe = b.onResult((r, backend) => {
    latency.synced(r, backend);
    status.synced(r, backend);
    if (r.ok && r.full && !once) {
      cancelTrim();
      cancelTrim = trimMemory(TRIM_AFTER_BURST_MS);
    }
  });
  const sink: LocalSink = {
    send: (op: LocalOp) => {
      latency.delivering(op);
      return b.sink.send(op);
    },
  };
  try {
    await o.feed(sink, stop.signal, b, status.report, stateRoutes);
  } finally {
    o.signal.removeEventListener('abort', onAbort);
    cancelTrim();
    unsubscribe();
    // tenants' sessions end first; their content stays in the kernel, as kpng's own
    tenants?.close();
    await tenantServer?.stop();
    await b.close();
  }
}
