// What every dataplane proxier shares: the node-local state kept from the
// diff stream (decoder callbacks), one sync at a time, minSyncPeriod measured
// from completion, retries with backoff after a failure (the last good rules
// stay), conntrack cleanup, and healthCheckNodePort servers. A backend says
// only how to sync its dataplane (syncNow).
import type { Logger } from '../../log.js';
import type { Family } from '../../api/ip.js';
import type { Endpoint, LocalNode, Service, ServiceCIDR } from '../../api/model.js';
import type { DecoderHandler } from '../../diff/decoder.js';
import type { SyncReporter } from '../registry.js';
import { ConntrackCleaner, type StaleFlow } from './conntrack.js';
import { HealthCheckServers, type HealthCheckService } from './healthcheck.js';
import { metrics } from './metrics.js';

export interface ProxierBaseOptions {
  readonly log: Logger;
  /** print instead of applying */
  readonly dryRun?: boolean;
  /** apply once: no waiting between syncs, failures are thrown */
  readonly once?: boolean;
  readonly conntrackPath?: string;
  /** serve healthCheckNodePorts (default true) */
  readonly healthChecks?: boolean;
  /** told about every sync (health, metrics) */
  readonly report?: SyncReporter;
}

export interface SyncPeriods {
  /** minimum time between the end of a sync and the start of the next */
  readonly minSyncPeriodMs: number;
  /** the longest retry delay after failures */
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
}

export abstract class ProxierBase implements DecoderHandler {
  abstract readonly stats: SyncStats;
  protected readonly services = new Map<string, Service>();
  protected readonly endpoints = new Map<string, Map<string, Endpoint>>();
  protected node?: LocalNode;
  protected readonly cidrs = new Map<string, ServiceCIDR>();
  /** services changed since the last sync */
  protected dirty = new Set<string>();
  protected nodeDirty = true;
  protected cidrsDirty = true;
  /** the next sync reads the kernel back first (start-up, after a failure) */
  protected needReconcile = true;
  protected failuresInRow = 0;
  protected closed = false;
  protected readonly conntrack: ConntrackCleaner;
  protected readonly health?: HealthCheckServers;
  /** UDP flows to clean once a sync succeeds (a failed sync must not lose them) */
  protected pendingFlows: StaleFlow[] = [];
  private lock: Promise<void> = Promise.resolve();
  private synced = false;
  private retryTimer?: NodeJS.Timeout;
  private readonly warned = new Set<string>();
  // kept as services change, never recomputed over the whole cluster
  private readonly healthChecked = new Map<string, HealthCheckService>();
  private healthCheckedChanged = false;
  private readonly noLocalInternal = new Set<string>();
  private readonly noLocalExternal = new Set<string>();

  constructor(
    protected readonly base: ProxierBaseOptions,
    private readonly periods: () => SyncPeriods,
  ) {
    this.conntrack = new ConntrackCleaner(base.log, base.conntrackPath);
    if (base.healthChecks !== false && !base.dryRun) this.health = new HealthCheckServers(base.log, () => this.failuresInRow === 0);
  }

  /** Applies what changed since the last sync to the dataplane. */
  protected abstract syncNow(): Promise<void>;

  // --- the diff stream

  reset(): void {
    for (const k of this.services.keys()) this.dirty.add(k);
    this.services.clear();
    this.endpoints.clear();
  }

  setService(svc: Service): void {
    const key = `${svc.Namespace}/${svc.Name}`;
    this.services.set(key, svc);
    this.dirty.add(key);
  }

  deleteService(namespace: string, name: string): void {
    const key = `${namespace}/${name}`;
    this.services.delete(key);
    this.endpoints.delete(key);
    this.dirty.add(key);
  }

  setEndpoint(namespace: string, service: string, key: string, ep: Endpoint): void {
    const svcKey = `${namespace}/${service}`;
    let m = this.endpoints.get(svcKey);
    if (!m) this.endpoints.set(svcKey, (m = new Map()));
    m.set(key, ep);
    this.dirty.add(svcKey);
  }

  deleteEndpoint(namespace: string, service: string, key: string): void {
    const svcKey = `${namespace}/${service}`;
    this.endpoints.get(svcKey)?.delete(key);
    this.dirty.add(svcKey);
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

  async sync(): Promise<void> {
    await this.exclusive(() => this.syncNow());
    if (this.base.once || this.closed) return;
    // minSyncPeriod, from completion: changes meanwhile coalesce into the next sync
    const wait = this.periods().minSyncPeriodMs;
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
  }

  async close(): Promise<void> {
    this.closed = true;
    clearTimeout(this.retryTimer);
    await this.lock;
    await this.health?.close();
  }

  /** true while the last sync succeeded (for health checks) */
  get healthy(): boolean {
    return this.failuresInRow === 0;
  }

  get conntrackDeleted(): number {
    return this.conntrack.deleted;
  }

  get healthCheckPorts(): number[] {
    return this.health?.ports() ?? [];
  }

  // --- for backends

  /** runs fn after any sync in progress, never two at once */
  protected exclusive(fn: () => Promise<void>): Promise<void> {
    const run = this.lock.then(fn);
    this.lock = run.catch(() => {});
    return run;
  }

  protected warnOnce(id: string, msg: string): void {
    if (this.warned.has(id)) return;
    this.warned.add(id);
    this.base.log.warn(msg);
  }

  /** Keeps health-check servers and the no-local-endpoints metric up to date for these services. */
  protected trackServices(keys: Iterable<string>): void {
    for (const key of keys) {
      const svc = this.services.get(key);
      const eps = [...(this.endpoints.get(key)?.values() ?? [])];
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

  /** A sync succeeded: health, metrics, then conntrack cleanup and health-check servers. */
  protected async succeeded(r: { full: boolean; durationMs: number }): Promise<void> {
    this.stats.syncs++;
    if (r.full) this.stats.fullSyncs++;
    this.stats.lastSyncMs = r.durationMs;
    this.stats.lastSuccess = Date.now();
    this.needReconcile = false;
    this.failuresInRow = 0;
    this.base.report?.synced(r);
    metrics.noLocalEndpoints.set({ traffic_policy: 'internal', ip_family: '' }, this.noLocalInternal.size);
    metrics.noLocalEndpoints.set({ traffic_policy: 'external', ip_family: '' }, this.noLocalExternal.size);
    if (this.base.dryRun) return;
    // the first sync: no flow went away, and "service IPs getting endpoints"
    // would be every UDP service (one conntrack run each) for nothing
    const flows = this.synced ? this.pendingFlows : this.pendingFlows.filter((f) => f.endpoint !== '');
    this.synced = true;
    this.pendingFlows = [];
    await this.conntrack.clean(flows);
    if (this.healthCheckedChanged) {
      this.healthCheckedChanged = false;
      this.health?.update([...this.healthChecked.values()]);
    }
  }

  /** A sync failed: the last good rules stay; retry later with a full reconcile (or throw with --once). */
  protected failed(e: unknown, what: string): void {
    this.stats.failures++;
    this.failuresInRow++;
    this.needReconcile = true;
    const msg = e instanceof Error ? e.message : String(e);
    this.base.report?.failed(msg);
    this.base.log.error({ err: msg, failuresInRow: this.failuresInRow }, `${what}: sync failed; the last good rules stay in place, retrying with a full reconcile`);
    if (this.base.once) throw e;
    if (this.closed) return;
    const delay = Math.min(1000 * 2 ** (this.failuresInRow - 1), this.periods().syncPeriodMs || 30_000);
    clearTimeout(this.retryTimer);
    this.retryTimer = setTimeout(() => void this.exclusive(() => this.syncNow()).catch(() => {}), delay);
    this.retryTimer.unref?.();
  }

  /** no retry pending: a sync is starting */
  protected cancelRetry(): void {
    clearTimeout(this.retryTimer);
  }
}

/** "vip|port|endpoint" ('' vip: a NodePort; '' endpoint: the service IP gained endpoints) */
export function parseFlow(family: Family, k: string): StaleFlow {
  const [vip, port, endpoint] = k.split('|');
  return { family, vip, port: Number(port), endpoint };
}

export function sameRules(a: readonly string[], b: readonly string[]): boolean {
  return a.length === b.length && a.every((r, i) => r === b[i]);
}
