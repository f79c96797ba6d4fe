// Stale UDP conntrack entries: when an endpoint stops serving a service IP
// (or NodePort), its UDP "connections" would keep going to it until they time
// out; delete exactly those. Nothing is flushed wholesale, and nothing at
// start-up (upstream #122740: a restart must not break UDP flows).
//
// As upstream's reconciler (pkg/proxy/conntrack): one dump of a family's UDP
// entries, matched here against the stale flows, and the matches deleted in
// batches. It runs in the background, after the sync that stopped using the
// flows committed, and no sync waits for it: one round at a time, the flows
// of the syncs meanwhile coalesced into the next round.
import type { Logger } from '../../runtime/log.js';
import { writeIPv6, type Family } from '../../api/ip.js';
import { IPPROTO_UDP, type ConntrackEntry, type ConntrackTable } from '../../kernel/conntrack.js';
import { metrics } from '../../runtime/metrics.js';
import type { ServicePort } from './service-ports.js';

export interface StaleFlow {
  readonly family: Family;
  /** the Service whose rules stopped using it (its key in the StaleFlowTracker) */
  readonly owner: string;
  /** service IP, or '' for a NodePort (any destination) */
  readonly vip: string;
  readonly port: number;
  /** the endpoint that went away; '' = entries that were never DNATed (reply from the service IP itself) */
  readonly endpoint: string;
}

export class ConntrackCleaner {
  /** entries deleted */
  deleted = 0;
  /** rounds that failed (each logged once) */
  failures = 0;
  /** flows waiting for the next round, by flow */
  private readonly queued = new Map<string, StaleFlow>();
  private round?: Promise<void>;
  private closed = false;

  /** table: none, no cleanup (dry run) */
  constructor(
    private readonly log: Logger,
    private readonly table: ConntrackTable | undefined,
    private readonly proxier: {
      /** whether a flow's entries are still to delete when its round runs (its endpoint may have come back) */
      stillStale(f: StaleFlow): boolean;
      /** a sync runs: a dump gives way until it has ended */
      syncing?(): boolean;
    },
  ) {}

  /** Flows whose rules are committed: cleaned in the next round, in the background. */
  schedule(flows: readonly StaleFlow[]): void {
    if (!this.table || this.closed) return;
    for (const f of flows) this.queued.set(`${f.family}|${f.owner}|${f.vip}|${f.port}|${f.endpoint}`, f);
    this.next();
  }

  /** resolves once no round runs and none is queued */
  async idle(): Promise<void> {
    while (this.round) await this.round;
  }

  /** Lets the running round end (flows still queued are dropped: their entries time out). */
  async close(): Promise<void> {
    this.closed = true;
    this.queued.clear();
    await this.idle();
    this.table?.close();
  }

  private next(): void {
    if (this.round || !this.queued.size || this.closed) return;
    const flows = [...this.queued.values()];
    this.queued.clear();
    this.round = this.clean(flows).finally(() => {
      this.round = undefined;
      this.next();
    });
  }

  /** one round: each family's flows; never throws, one log line when it fails */
  private async clean(flows: readonly StaleFlow[]): Promise<void> {
    const errors: string[] = [];
    for (const family of [4, 6] as const) {
      const mine = flows.filter((f) => f.family === family);
      if (!mine.length) continue;
      const err = await this.cleanFamily(family, mine);
      if (err) errors.push(`IPv${family}: ${err}`);
    }
    if (!errors.length) return;
    this.failures++;
    this.log.warn({ flows: flows.length, err: errors.join('; ') }, 'conntrack cleanup failed; the stale UDP entries left stay until they time out');
  }

  /** deletes the entries of these flows that are still stale; returns why it failed, or undefined */
  private async cleanFamily(family: Family, flows: readonly StaleFlow[]): Promise<string | undefined> {
    // keyed as a matching entry reads: original destination ('' for a NodePort's any), its port, reply source
    const byEntry = new Map<string, StaleFlow>();
    for (const f of flows) {
      const dst = f.vip ? addressHex(f.vip, family) : '';
      const replySrc = addressHex(f.endpoint || f.vip, family);
      if (dst !== undefined && replySrc !== undefined && this.proxier.stillStale(f)) byEntry.set(`${dst}|${f.port}|${replySrc}`, f);
    }
    if (!byEntry.size) return undefined;
    const label = { ip_family: family === 4 ? 'IPv4' : 'IPv6' };
    const t0 = performance.now();
    try {
      const flowOf = (e: ConntrackEntry) => byEntry.get(`${e.orig.dst}|${e.orig.dport}|${e.reply.src}`) ?? byEntry.get(`|${e.orig.dport}|${e.reply.src}`);
      const matched = await this.table!.list(family, IPPROTO_UDP, (e) => flowOf(e) !== undefined, () => this.giveWay());
      // the dump took a while: an endpoint that came back meanwhile keeps its entries
      const due = matched.filter((e) => this.proxier.stillStale(flowOf(e)!));
      const r = due.length ? await this.table!.delete(due) : { done: 0, failed: 0, errno: undefined };
      this.deleted += r.done;
      if (r.done) metrics.conntrackDeleted.inc(label, r.done);
      this.log.debug({ family: label.ip_family, flows: byEntry.size, entries: due.length, deleted: r.done, ms: Math.round(performance.now() - t0) }, 'conntrack cleanup');
      if (r.failed) throw new Error(`the kernel refused ${r.failed} of ${due.length} deletes (errno ${r.errno})`);
      return undefined;
    } catch (e) {
      metrics.conntrackFailures.inc(label);
      return e instanceof Error ? e.message : String(e);
    } finally {
      metrics.conntrackDuration.observe(label, (performance.now() - t0) / 1000);
    }
  }

  /** between two reads of a dump: a turn of the event loop, and no more reading while a sync runs */
  private async giveWay(): Promise<void> {
    await new Promise((resolve) => setImmediate(resolve));
    while (this.proxier.syncing?.() && !this.closed) await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

/** an address as the kernel's bytes in hex (ConntrackTuple's form); undefined when it is not one of this family */
function addressHex(ip: string, family: Family): string | undefined {
  if (family === 6) {
    const b = Buffer.alloc(16);
    return writeIPv6(b, 0, ip) ? b.toString('hex') : undefined;
  }
  const o = ip.split('.');
  if (o.length !== 4 || o.some((x) => !/^\d{1,3}$/.test(x) || Number(x) > 255)) return undefined;
  return o.map((x) => Number(x).toString(16).padStart(2, '0')).join('');
}

/**
 * The UDP flows each Service programs, kept as they change: what went away
 * (an endpoint no longer used for a service IP or NodePort) and which service
 * IPs got endpoints (replies the kernel answered itself before, cached as
 * "no DNAT") are the conntrack entries to delete after the sync.
 */
export class StaleFlowTracker {
  /** family|owner -> flows ("vip|port|endpoint") and service addresses with endpoints ("vip|port|") */
  private readonly byOwner = new Map<string, { flows: Set<string>; vips: Set<string> }>();

  /** An owner's flows now (after its recompute); returns the entries to delete. */
  update(family: Family, owner: string, ports: readonly ServicePort[]): StaleFlow[] {
    const id = `${family}|${owner}`;
    const before = this.byOwner.get(id);
    let now: { flows: Set<string>; vips: Set<string> } | undefined;
    for (const sp of ports) {
      if (sp.protocol !== 'udp') continue;
      now ??= { flows: new Set(), vips: new Set() };
      udpFlowsOf(sp, now.flows, now.vips);
    }
    const out: StaleFlow[] = [];
    for (const k of before?.flows ?? []) if (!now?.flows.has(k)) out.push(parseFlow(family, owner, k));
    for (const k of now?.vips ?? []) if (!before?.vips.has(k) && !k.startsWith('|')) out.push(parseFlow(family, owner, k));
    if (now) this.byOwner.set(id, now);
    else this.byOwner.delete(id);
    return out;
  }

  /**
   * Whether a flow's entries are still to delete: its Service programs it no
   * longer (its endpoint did not come back), or, for a service IP that gained
   * endpoints, it still has them. (A service IP and port belong to one
   * Service: its own flows say.)
   */
  stillStale(f: StaleFlow): boolean {
    const now = this.byOwner.get(`${f.family}|${f.owner}`);
    if (f.endpoint === '') return !!now?.vips.has(`${f.vip}|${f.port}|`);
    return !now?.flows.has(`${f.vip}|${f.port}|${f.endpoint}`);
  }
}

/** "vip|port|endpoint" for every UDP flow a service port programs ('' vip: its NodePort, any node address) */
function udpFlowsOf(sp: ServicePort, flows: Set<string>, vips: Set<string>): void {
  const P = sp.port.Port;
  const add = (vip: string, port: number, targets: readonly { ip: string }[]) => {
    if (!targets.length) return;
    for (const t of targets) flows.add(`${vip}|${port}|${t.ip}`);
    vips.add(`${vip}|${port}|`);
  };
  add(sp.clusterIP, P, sp.internal);
  const external = sp.externalLocal ? [...sp.cluster, ...sp.external] : sp.cluster;
  for (const vip of new Set([...sp.externalIPs, ...sp.loadBalancerIPs])) add(vip, P, external);
  if (sp.nodePort) add('', sp.nodePort, external);
}

/** "vip|port|endpoint" ('' vip: a NodePort; '' endpoint: the service IP gained endpoints) */
function parseFlow(family: Family, owner: string, k: string): StaleFlow {
  const [vip, port, endpoint] = k.split('|');
  return { family, owner, vip, port: Number(port), endpoint };
}
