// What every dataplane proxier shares, whatever its dataplane: the node-local
// state kept from the diff stream (decoder callbacks), the sync runner (one
// sync at a time, minSyncPeriod, retries, the periodic drift check), the
// isolation of a Service the dataplane refuses, conntrack cleanup, and
// healthCheckNodePort servers. A backend says how to apply (apply) and,
// optionally, how to notice that someone else changed its dataplane
// (checkDrift).
//
// No single Service may stop the others: when applying fails, the same
// change is retried with a fresh read of the dataplane (it may have drifted);
// when that fails too, check-only transactions (nothing changes on the node)
// find the Services the dataplane refuses, by halves. Those are left out, at
// the version last applied, with one log line each, until they change again;
// everything else is applied.
import type { Logger } from '../../runtime/log.js';
import { serviceKey, type Endpoint, type LocalNode, type Service, type ServiceCIDR } from '../../api/model.js';
import type { DecoderHandler } from '../../diff/decoder.js';
import { ConntrackCleaner, StaleFlowTracker, type StaleFlow } from './conntrack.js';
import { ConntrackNetlink, type ConntrackTable } from '../../kernel/conntrack.js';
import { HealthCheckServers, type HealthCheckService } from './healthcheck.js';
import { ipFamily, metrics } from '../../runtime/metrics.js';
import { SyncRunner, type Clock, type SyncReason, type SyncResult } from './runner.js';
import { copyOf, endpointDelete, endpointSet, endpointValues, type EndpointSet } from './endpoint-set.js';

/** Services each proxier of the process leaves out: the gauge is their sum (to-ebpf beside to-nft must not hide each other's) */
const skippedBy = new Map<object, number>();

function reportSkipped(proxier: object, n: number): void {
  skippedBy.set(proxier, n);
  let total = 0;
  for (const v of skippedBy.values()) total += v;
  metrics.skippedServices.set(total);
}

export interface ProxierBaseOptions {
  readonly log: Logger;
  /** print instead of applying */
  readonly dryRun?: boolean;
  /** apply once: no waiting between syncs, failures are thrown */
  readonly once?: boolean;
  /** where stale UDP conntrack entries are deleted: the kernel's table in the dataplane's network namespace (default), another table (tests), none (false) */
  readonly conntrack?: ConntrackTable | false;
  /** the network namespace the dataplane is in, when not this process's (tests) */
  readonly netns?: string;
  /** serve healthCheckNodePorts (default true) */
  readonly healthChecks?: boolean;
  /** told about every sync (health, metrics) */
  readonly report?: (r: SyncResult) => void;
  /** for tests */
  readonly clock?: Clock;
  /**
   * keep each Service's endpoints encoded (PackedEndpoints), decoded when a
   * backend reads them: for kpng local, where nothing else keeps them decoded
   */
  readonly packEndpoints?: boolean;
}

export interface SyncPeriods {
  /** minimum time between the end of a sync and the start of the next */
  readonly minSyncPeriodMs: number;
  /** the periodic drift check, and the longest retry delay */
  readonly syncPeriodMs: number;
}

/** what every backend counts of its syncs (kept by ProxierBase); backends add their own */
export interface SyncStats {
  syncs: number;
  fullSyncs: number;
  failures: number;
  /** duration of the last successful sync */
  lastSyncMs: number;
  /** when it ended (ms since the epoch) */
  lastSuccess: number;
  /** drift found by the periodic check and repaired */
  repairs: number;
}

/** What a backend is asked to do. */
export interface ApplyRequest {
  /** the Services to compute again (serviceOf/endpointsOf give the version to program) */
  readonly keys: readonly string[];
  /** read the dataplane back first and compare everything (start-up, after a failure, drift) */
  readonly full: boolean;
  /** only check that the dataplane would take it: change nothing on the node, commit nothing */
  readonly check: boolean;
}

/** A Service's version the last time it was applied (undefined: not programmed). */
interface Applied {
  readonly svc: Service | undefined;
  readonly eps: EndpointSet | undefined;
}

export abstract class ProxierBase implements DecoderHandler {
  abstract readonly stats: SyncStats;
  /** the node-local state, as the stream says it is now */
  protected readonly services = new Map<string, Service>();
  private readonly endpoints = new Map<string, EndpointSet>();
  protected node?: LocalNode;
  protected readonly cidrs = new Map<string, ServiceCIDR>();
  protected nodeDirty = true;
  protected cidrsDirty = true;
  protected closed = false;
  protected readonly conntrack: ConntrackCleaner;
  protected readonly staleFlows = new StaleFlowTracker();
  protected readonly health?: HealthCheckServers;
  /** UDP flows to clean once a sync succeeds (a failed sync must not lose them) */
  protected pendingFlows: StaleFlow[] = [];
  /** Services changed since they were last applied, with the version last applied */
  private readonly pending = new Map<string, Applied>();
  /** Services shown to the backend at their applied version */
  private readonly held = new Set<string>();
  /** Services the dataplane refused: held until they change again */
  private readonly refused = new Map<string, string>();
  /** the next sync reads the dataplane back first */
  private needFull = true;
  private synced = false;
  /** the diff stream gave its first whole state: a change from elsewhere (otherChanged) may start a sync */
  private streamSynced = false;
  private readonly runner: SyncRunner;
  private readonly warned = new Set<string>();
  // kept as services change, never recomputed over the whole cluster
  private readonly healthChecked = new Map<string, HealthCheckService>();
  private healthCheckedChanged = false;
  private readonly noLocalInternal = new Set<string>();
  private readonly noLocalExternal = new Set<string>();

  constructor(
    protected readonly base: ProxierBaseOptions,
    periods: SyncPeriods,
  ) {
    const table = base.conntrack === false || base.dryRun ? undefined : (base.conntrack ?? new ConntrackNetlink(base.netns));
    this.conntrack = new ConntrackCleaner(base.log, table, { stillStale: (f) => this.staleFlows.stillStale(f), syncing: () => this.runner.busy });
    if (base.healthChecks !== false && !base.dryRun) this.health = new HealthCheckServers(base.log, () => this.runner.failures === 0);
    const once = !!base.once;
    this.runner = new SyncRunner({
      minIntervalMs: once ? 0 : periods.minSyncPeriodMs,
      periodMs: once || base.dryRun ? 0 : periods.syncPeriodMs,
      retries: !once,
      retryMaxMs: periods.syncPeriodMs || 30_000,
      clock: base.clock,
      sync: (reason) => this.runSync(reason),
      reconcile: () => this.reconcile(),
      onResult: (r) => this.base.report?.(r),
    });
  }

  /**
   * Applies the changes to the dataplane: the backend computes these
   * Services again, renders the differences and applies them atomically.
   * Throws when the dataplane refuses; nothing is committed then.
   */
  protected abstract apply(req: ApplyRequest): Promise<{ changes: number }>;

  /**
   * The periodic check: cheap when nothing changed; says why the dataplane
   * must be read back and repaired (someone else changed it), or undefined.
   */
  protected checkDrift?(): Promise<string | undefined>;

  /** told when a sync failed for good (after the read-back and the search for a Service to blame) */
  protected onSyncFailed?(full: boolean): void;

  /**
   * told when the dataplane refuses a key that is not a Service's (a
   * tenant's, see otherChanged): true when the backend shows its last good
   * version from now on, so it is neither held back nor logged as a Service
   */
  protected onRefused?(key: string, why: string): boolean;

  // --- the diff stream

  reset(): void {
    for (const k of this.services.keys()) this.changing(k);
    this.services.clear();
    this.endpoints.clear();
  }

  setService(svc: Service): void {
    const key = serviceKey(svc.Namespace, svc.Name);
    this.changing(key);
    this.services.set(key, svc);
  }

  deleteService(namespace: string, name: string): void {
    const key = serviceKey(namespace, name);
    this.changing(key);
    this.services.delete(key);
    this.endpoints.delete(key);
  }

  setEndpoint(namespace: string, service: string, key: string, ep: Endpoint, encoded?: { readonly bytes?: Uint8Array }): void {
    const svcKey = serviceKey(namespace, service);
    this.changing(svcKey);
    const set = this.endpoints.get(svcKey);
    // the bytes only when packing: to-local's views encode them when read
    const next = endpointSet(set, key, ep, this.base.packEndpoints ? (encoded ?? {}) : undefined);
    if (next !== set) this.endpoints.set(svcKey, next);
  }

  deleteEndpoint(namespace: string, service: string, key: string): void {
    const svcKey = serviceKey(namespace, service);
    this.changing(svcKey);
    const set = this.endpoints.get(svcKey);
    const next = set && endpointDelete(set, key);
    if (next && next !== set) this.endpoints.set(svcKey, next);
  }

  setNode(node: LocalNode): void {
    this.node = node;
    this.nodeDirty = true;
  }

  deleteNode(): void {
    this.node = undefined;
    this.nodeDirty = true;
  }

  setServiceCIDR(cidr: ServiceCIDR): void {
    this.cidrs.set(cidr.Name, cidr);
    this.cidrsDirty = true;
  }

  deleteServiceCIDR(name: string): void {
    this.cidrs.delete(name);
    this.cidrsDirty = true;
  }

  /** Applies everything received so far; resolves with what the sync did (with --once, throws if it failed). */
  async sync(): Promise<SyncResult> {
    this.streamSynced = true;
    const r = await this.runner.request();
    if (this.base.once && !r.ok) throw new Error(r.error);
    return r;
  }

  async close(): Promise<void> {
    this.closed = true;
    reportSkipped(this, 0);
    skippedBy.delete(this);
    await this.runner.close();
    await this.health?.close();
    await this.conntrack.close();
  }

  /** true while the last sync succeeded (for health checks) */
  get healthy(): boolean {
    return this.runner.failures === 0;
  }

  get conntrackDeleted(): number {
    return this.conntrack.deleted;
  }

  get healthCheckPorts(): number[] {
    return this.health?.ports() ?? [];
  }

  /** the Services left out because the dataplane refused them, with why */
  get skipped(): ReadonlyMap<string, string> {
    return this.refused;
  }

  // --- for backends

  /** A Service as it is to be programmed now (its applied version while held back). */
  protected serviceOf(key: string): Service | undefined {
    return this.held.has(key) ? this.pending.get(key)?.svc : this.services.get(key);
  }

  /** Its endpoints, likewise. */
  protected endpointsOf(key: string): Iterable<Endpoint> {
    const set = this.held.has(key) ? this.pending.get(key)?.eps : this.endpoints.get(key);
    return set ? endpointValues(set) : [];
  }

  /** true while a Service is shown at its last applied version (held back: refused, or during the search for what is) */
  protected isHeldBack(key: string): boolean {
    return this.held.has(key);
  }

  /**
   * Something that is not a Service changed (a tenant's content, by its key
   * from src/aggregator): the next sync carries the key, isolated like a
   * Service's; it starts now (within minSyncPeriod), or once the diff
   * stream gave its first state (a sync before that would program a partial
   * node).
   */
  protected otherChanged(key: string): void {
    this.changing(key);
    if (this.streamSynced && !this.closed) this.runner.request().catch(() => {});
  }

  /** the next sync reads the dataplane back (a backend that lost track of it) */
  protected forceFull(): void {
    this.needFull = true;
  }

  protected warnOnce(id: string, msg: string): void {
    if (this.warned.has(id)) return;
    this.warned.add(id);
    this.base.log.warn(msg);
  }

  // --- syncing

  /** first change to a Service since it was applied: remember the applied version */
  private changing(key: string): void {
    if (this.refused.delete(key)) this.held.delete(key); // refused before: try again
    if (this.pending.has(key)) return;
    const eps = this.endpoints.get(key);
    this.pending.set(key, { svc: this.services.get(key), eps });
    // the applied version keeps its own set; the new one is a copy to change
    if (eps) this.endpoints.set(key, copyOf(eps));
  }

  private async runSync(reason: 'change' | 'retry', full = this.needFull): Promise<SyncResult> {
    const t0 = Date.now();
    const keys = [...this.pending.keys()].filter((k) => !this.refused.has(k));
    const flowsBefore = this.pendingFlows.length;
    try {
      const r = await this.apply({ keys, full, check: false });
      return await this.succeeded(reason, full, t0, r.changes);
    } catch (e) {
      this.pendingFlows.length = flowsBefore;
      if (this.closed) return this.failed(reason, full, t0, e);
      if (!full) {
        // the dataplane may have changed under us: read it back and try again
        this.base.log.warn({ err: errorText(e) }, 'sync failed; reading the dataplane back and trying again');
        return this.runSync(reason, true);
      }
      return this.isolate(reason, t0, keys, e);
    }
  }

  /**
   * A full sync failed. Finds the Services the dataplane refuses with
   * check-only transactions, leaves them out and applies the rest.
   */
  private async isolate(reason: SyncReason, t0: number, keys: readonly string[], error: unknown): Promise<SyncResult> {
    // Services whose held state changed since the backend last computed them
    const recompute = new Set<string>();
    const hold = (list: readonly string[]) => list.forEach((k) => (this.held.add(k), recompute.add(k)));
    const release = (list: readonly string[]) => list.forEach((k) => (this.held.delete(k), recompute.add(k)));
    /** a check-only transaction of what changed since the last one: undefined when the dataplane takes it, else its error */
    const check = async (): Promise<unknown> => {
      const toggled = [...recompute];
      recompute.clear();
      return this.apply({ keys: toggled, full: false, check: true }).then(
        () => undefined,
        (e: unknown) => e ?? new Error('refused'),
      );
    };
    // with every change held back, is the dataplane still refused? then it is not a Service's fault
    hold(keys);
    if (!keys.length || (await check()) !== undefined) {
      release(keys);
      return this.failed(reason, true, t0, error);
    }
    /** the keys refused, each with the error of the check that found it (the dataplane's own message) */
    const bad: [string, unknown][] = [];
    const search = async (list: readonly string[]): Promise<void> => {
      release(list);
      const refused = await check();
      if (refused === undefined) return;
      hold(list);
      if (list.length === 1) return void bad.push([list[0], refused]);
      const half = list.length >> 1;
      await search(list.slice(0, half));
      await search(list.slice(half));
    };
    await search(keys);
    // none to blame (refused only together, or it passed this time): everything, once more
    if (!bad.length) release(keys);
    const refusedHere: string[] = [];
    for (const [k, e] of bad) {
      const why = errorText(e);
      // the backend shows its last good version now: nothing to hold
      if (this.onRefused?.(k, why)) {
        release([k]);
        continue;
      }
      this.refused.set(k, why);
      refusedHere.push(k);
      this.base.log.error({ service: k, err: why }, `skipping Service ${k}: the dataplane refuses it; its last applied version stays (none if it was never applied) until it changes`);
    }
    const flowsBefore = this.pendingFlows.length;
    try {
      const r = await this.apply({ keys: [...recompute], full: false, check: false });
      return await this.succeeded(reason, true, t0, r.changes);
    } catch (e) {
      this.pendingFlows.length = flowsBefore;
      for (const k of refusedHere) this.refused.delete(k);
      release(keys);
      return this.failed(reason, true, t0, e);
    }
  }

  /** the periodic check: repairs drift; nothing when the dataplane is as kpng left it */
  private async reconcile(): Promise<SyncResult | undefined> {
    if (this.closed || !this.checkDrift) return undefined;
    let why: string | undefined;
    try {
      why = await this.checkDrift();
    } catch (e) {
      why = `the check failed: ${errorText(e)}`;
    }
    if (!why) return undefined;
    this.base.log.warn({ why }, 'the dataplane was changed by someone else; repairing it');
    const r = await this.runSync('retry', true);
    if (!r.ok) return { ...r, reason: 'reconcile' };
    this.stats.repairs++;
    metrics.repairs.inc();
    return { ...r, reason: 'reconcile', repaired: true };
  }

  /** Keeps health-check servers and the no-local-endpoints metric up to date for these services. */
  protected trackServices(keys: Iterable<string>): void {
    for (const key of keys) {
      const svc = this.serviceOf(key);
      const eps = [...this.endpointsOf(key)];
      const mark = (on: boolean, s: Set<string>) => (on ? s.add(key) : s.delete(key));
      mark(!!svc?.InternalTrafficToLocal && !eps.some((e) => e.Local && e.Scopes?.Internal), this.noLocalInternal);
      mark(!!svc?.ExternalTrafficToLocal && !eps.some((e) => e.Local && e.Scopes?.External), this.noLocalExternal);
      // healthCheckNodePort: LoadBalancer Services with externalTrafficPolicy Local
      const before = this.healthChecked.get(key);
      if (svc && svc.Type === 'LoadBalancer' && svc.ExternalTrafficToLocal && svc.HealthCheckNodePort) {
        const localEndpoints = eps.filter((e) => e.Local && e.Scopes?.External && !e.Terminating).length;
        if (!before || before.port !== svc.HealthCheckNodePort || before.localEndpoints !== localEndpoints) {
          this.healthChecked.set(key, { namespace: svc.Namespace, name: svc.Name, port: svc.HealthCheckNodePort, localEndpoints });
          this.healthCheckedChanged = true;
        }
      } else if (before) {
        this.healthChecked.delete(key);
        this.healthCheckedChanged = true;
      }
    }
  }

  /** A sync succeeded: state, health, metrics, then health-check servers; conntrack cleanup goes on in the background. */
  private async succeeded(reason: SyncReason, full: boolean, t0: number, changes: number): Promise<SyncResult> {
    // (a cold start's keys one by one would delay the moment the node counts as programmed)
    if (this.held.size === 0) this.pending.clear();
    else for (const k of [...this.pending.keys()]) if (!this.held.has(k)) this.pending.delete(k);
    this.needFull = false;
    this.nodeDirty = this.cidrsDirty = false;
    const durationMs = Date.now() - t0;
    this.stats.syncs++;
    if (full) this.stats.fullSyncs++;
    this.stats.lastSyncMs = durationMs;
    this.stats.lastSuccess = Date.now();
    reportSkipped(this, this.refused.size);
    const family = ipFamily();
    metrics.noLocalEndpoints.set({ traffic_policy: 'internal', ip_family: family }, this.noLocalInternal.size);
    metrics.noLocalEndpoints.set({ traffic_policy: 'external', ip_family: family }, this.noLocalExternal.size);
    const skipped = [...this.refused.keys()];
    const result: SyncResult = { ok: true, full, partial: skipped.length > 0, reason, durationMs, changes, skipped, repaired: false, endedAt: Date.now() };
    if (this.base.dryRun) return result;
    // the first sync: no flow went away, and "service IPs getting endpoints"
    // would be every UDP service for nothing
    const flows = this.synced ? this.pendingFlows : this.pendingFlows.filter((f) => f.endpoint !== '');
    this.synced = true;
    this.pendingFlows = [];
    // the rules that let load balancers' health checks in are live: their servers listen before the sync counts as done
    if (this.healthCheckedChanged) {
      this.healthCheckedChanged = false;
      await this.health?.update([...this.healthChecked.values()]);
    }
    // the rules that stopped using these flows are committed; no sync waits for their cleanup
    this.conntrack.schedule(flows);
    return result;
  }

  /** A sync failed: the last good rules stay; the runner retries with a full read-back. */
  private failed(reason: SyncReason, full: boolean, t0: number, e: unknown): SyncResult {
    this.stats.failures++;
    this.needFull = true;
    this.onSyncFailed?.(full);
    const msg = errorText(e);
    this.base.log.error({ err: msg, failuresInRow: this.runner.failures + 1 }, 'sync failed; the last good rules stay in place, retrying with a full reconcile');
    return { ok: false, full, partial: false, reason, durationMs: Date.now() - t0, changes: 0, skipped: [...this.refused.keys()], repaired: false, error: msg, endedAt: Date.now() };
  }
}

function errorText(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}
