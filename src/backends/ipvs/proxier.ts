// The IPVS proxier: kube-proxy's IPVS mode on kpng's node-local state. Every
// service address (cluster, external, LoadBalancer IPs) is bound to the dummy
// interface kube-ipvs0 and is an IPVS virtual server per port, NodePorts a
// virtual server per node address; real servers are the endpoints (NAT).
// Around IPVS, kpng's own nftables table (ruleset.ts) marks for masquerade,
// filters LoadBalancer source ranges and masquerades hairpin traffic.
//
// Incremental as the other backends: a sync computes only the Services that
// changed, and sends IPVS only the differences against the state it
// committed (netlink, ipvs.ts; IPVS has no transactions, so each operation
// is committed when the kernel acknowledges it). A real server that goes
// away is drained first (weight 0) and deleted once it has no connection.
import { networkInterfaces } from 'node:os';
import { isIPv4 } from 'node:net';
import { cidrContains, parseCIDR, type Family } from '../../api/ip.js';
import { ipSetOf } from '../../api/model.js';
import { ProxierBase, type ApplyRequest, type SyncStats } from '../shared/proxier.js';
import type { DataplaneOptions } from '../shared/backend.js';
import { servicePorts, rangesContain, type ServicePort, type Target } from '../shared/service-ports.js';
import { detectLocal, nodePortAddresses, serviceCIDRsOf } from '../shared/node-facts.js';
import { podSourceMatches, singleAddress } from '../shared/nftables/match.js';
import { ElementTable, type Element } from '../shared/nftables/elements.js';
import { ProcessNft, SessionNft, type Nft } from '../shared/nftables/nft.js';
import { Transaction, type TableRef } from '../shared/nftables/transaction.js';
import { nftDrift, type DriftSource } from '../shared/nftables/watch.js';
import { nftTenantTables, serviceKeys, type NftTenantTables } from '../shared/nftables/tenants.js';
import { metrics } from '../../runtime/metrics.js';
import { FLAG_PERSISTENT, FLAG_SCHED1, FLAG_SCHED2, Ipvs, rsKey, vsKey, type IpvsError, type IpvsOp, type RealServer, type VirtualServer } from './ipvs.js';
import { ToolNode, type IpvsNode } from './node.js';
import { BASE_CHAINS } from '../shared/nftables/base-chains.js';
import { DUMMY, FAMILIES, TABLE, chains, sets, type FamilyNames, type StaticInputs } from './ruleset.js';

/** IPVS's schedulers (ip_vs_<name> modules of Debian's kernel) */
export const SCHEDULERS = new Set(['rr', 'wrr', 'lc', 'wlc', 'lblc', 'lblcr', 'dh', 'sh', 'sed', 'nq', 'fo', 'ovf', 'mh', 'twos']);
/** flags of the sh and mh schedulers, as ipvsadm names them */
const SCHED_FLAGS: Record<string, number> = { 'sh-fallback': FLAG_SCHED1, 'sh-port': FLAG_SCHED2, 'mh-fallback': FLAG_SCHED1, 'mh-port': FLAG_SCHED2 };
export const SCHEDULER_ANNOTATION = 'kpng.io/ipvs-scheduler';
export const SCHEDULER_FLAGS_ANNOTATION = 'kpng.io/ipvs-scheduler-flags';

/** What kpng needs of IPVS (ipvs.ts; tests may give another). */
export interface IpvsApi {
  services(): VirtualServer[];
  destinations(vs: VirtualServer): RealServer[];
  apply(ops: readonly IpvsOp[]): (IpvsError | undefined)[];
  setTimeouts(tcp: number, tcpFin: number, udp: number): void;
  close(): void;
}

export interface IpvsProxierOptions extends DataplaneOptions {
  readonly nftPath?: string;
  /** one long-lived nft process for the table's changes (default: unless once) */
  readonly session?: boolean;
  /** kube-ipvs0, sysctls, modules (default: through ip, sysctl, modprobe) */
  readonly node?: IpvsNode;
  /** how to reach IPVS (default: netlink in this process's network namespace, or netns) */
  readonly ipvs?: IpvsApi;
  readonly nft?: Nft;
  /** the node's interface addresses (NodePorts); default: this process's namespace's, but kube-ipvs0's (service addresses) */
  readonly interfaceAddresses?: () => string[];
}

interface DesiredVS {
  readonly vs: VirtualServer;
  readonly owner: string;
  readonly real: Map<string, RealServer>;
}

interface CommittedVS {
  vs: VirtualServer;
  real: Map<string, RealServer>;
}

/** What one Service wants of IPVS, of the dummy interface and of the table. */
interface OwnerState {
  readonly servers: Map<string, DesiredVS>;
  readonly addresses: Set<string>;
}

export interface IpvsProxierStats extends SyncStats {
  /** IPVS operations of the last sync */
  lastOperations: number;
  /** real servers draining (weight 0, connections left) */
  draining: number;
  /** where the last sync's time went, ms */
  lastPhases: { computeMs: number; nftMs: number; ipvsMs: number; addressMs: number };
}

export class IpvsProxier extends ProxierBase {
  readonly stats: IpvsProxierStats = { syncs: 0, fullSyncs: 0, failures: 0, lastSyncMs: 0, lastSuccess: 0, repairs: 0, lastOperations: 0, draining: 0, lastPhases: { computeMs: 0, nftMs: 0, ipvsMs: 0, addressMs: 0 } };
  private ipvs?: IpvsApi;
  private readonly nft: Nft;
  private readonly host: IpvsNode;
  private readonly watch?: DriftSource;
  /** the node's tenants' tables, written in the same transactions as kpng's table (when this backend is their writer) */
  private readonly tenantTables?: NftTenantTables;
  private started = false;
  private readonly families: Family[];
  private readonly owners = new Map<string, OwnerState>();
  /** virtual server -> what is wanted (the first owner by name, when two want one) */
  private readonly desired = new Map<string, DesiredVS>();
  /** every owner that wants a virtual server, for taking over when the winner goes */
  private readonly wanting = new Map<string, DesiredVS[]>();
  private committed = new Map<string, CommittedVS>();
  /** virtual servers to compare at the next sync */
  private touched = new Set<string>();
  /** "vs|rs" -> a real server going away, kept at weight 0 until its connections end */
  private readonly draining = new Map<string, { vs: VirtualServer; rs: RealServer }>();
  /** address -> owners binding it */
  private readonly addressRefs = new Map<string, number>();
  /** addresses whose first owner came or last owner went since the last sync: what a sync compares with kube-ipvs0 */
  private readonly addressesDirty = new Set<string>();
  private boundAddresses = new Set<string>();
  /** addresses bound or unbound by the last sync */
  private addressChanges = 0;
  private readonly elements = new Map<Family, ElementTable>();
  private structureKnown = false;
  /** Services programmed with NodePorts or source ranges (what the node's addresses change) */
  private readonly nodeDependent = new Set<string>();
  /** the NodePort addresses the last sync served on */
  private nodePortAddressesSeen = '';
  /**
   * The node's interface addresses, read at a full sync, when the node
   * changes and at each periodic check: listing them costs as much as
   * kube-ipvs0 holds addresses (one per Service IP), too much for every sync.
   */
  private localAddresses?: string[];
  /** ipvs.excludeCIDRs: virtual servers and kube-ipvs0 addresses there are never taken over or removed unless a Service wants them */
  private readonly excluded: ReturnType<typeof parseCIDR>[];
  /** owners whose IPVS operations the kernel refused in the last sync (what a check then says) */
  private refusedOwners = new Set<string>();

  constructor(private readonly o: IpvsProxierOptions) {
    super(o, { minSyncPeriodMs: o.config.ipvs.minSyncPeriodMs, syncPeriodMs: o.config.ipvs.syncPeriodMs });
    this.families = [...(o.families ?? [4, 6])];
    for (const f of this.families) this.elements.set(f, new ElementTable());
    this.host = o.node ?? new ToolNode();
    this.excluded = o.config.ipvs.excludeCIDRs.map((c) => {
      const p = parseCIDR(c);
      if (!p) o.log.warn(`ipvs: excludeCIDRs: ${JSON.stringify(c)} is not a CIDR; ignored`);
      return p;
    });
    this.nft = o.nft ?? (!o.dryRun && (o.session ?? !o.once) ? new SessionNft({ path: o.nftPath, onFallback: (m) => this.warnOnce('nft session', m) }) : new ProcessNft({ path: o.nftPath }));
    this.tenantTables = nftTenantTables({ ...o, nft: this.nft, reservedMark: 1 << o.config.iptables.masqueradeBit, changed: (key) => this.otherChanged(key) });
    if (!o.dryRun && !o.once && o.watch !== false) {
      const fams = new Set<number>(this.families.map((f) => (f === 4 ? 2 : 10)));
      const tenants = this.tenantTables;
      this.watch = nftDrift(this.nft, { ours: (e) => (e.table === TABLE && fams.has(e.family)) || !!tenants?.ours(e), netns: o.netns, log: o.log });
    }
  }

  override async close(): Promise<void> {
    await super.close();
    this.tenantTables?.close();
    this.watch?.close();
    this.nft.close();
    this.ipvs?.close();
  }

  // --- setting up the node

  private async start(): Promise<void> {
    if (this.started || this.o.dryRun) return;
    const c = this.o.config.ipvs;
    await this.host.prepare({ ipv6: this.families.includes(6), strictARP: c.strictARP, warn: (msg, err) => this.o.log.warn({ err }, msg) });
    this.ipvs = this.o.ipvs ?? new Ipvs(this.o.netns);
    if (c.tcpTimeoutMs || c.tcpFinTimeoutMs || c.udpTimeoutMs) this.ipvs.setTimeouts(Math.round(c.tcpTimeoutMs / 1000), Math.round(c.tcpFinTimeoutMs / 1000), Math.round(c.udpTimeoutMs / 1000));
    this.started = true;
  }

  // --- what to program

  private scheduler(key: string): { scheduler: string; flags: number } {
    const svc = this.serviceOf(key);
    const def = this.o.config.ipvs.scheduler || 'rr';
    const asked = svc?.Labels[SCHEDULER_ANNOTATION];
    let scheduler = def;
    if (asked !== undefined) {
      if (SCHEDULERS.has(asked)) scheduler = asked;
      else this.warnOnce(`sched ${key} ${asked}`, `ipvs: Service ${key}: ${SCHEDULER_ANNOTATION} ${JSON.stringify(asked)} is not an IPVS scheduler (${[...SCHEDULERS].join(', ')}); using ${def}`);
    }
    let flags = 0;
    for (const f of (svc?.Labels[SCHEDULER_FLAGS_ANNOTATION] ?? '').split(',').map((x) => x.trim()).filter(Boolean)) {
      if (SCHED_FLAGS[f] && f.startsWith(`${scheduler}-`)) flags |= SCHED_FLAGS[f];
      else this.warnOnce(`flag ${key} ${f}`, `ipvs: Service ${key}: scheduler flag ${JSON.stringify(f)} does not apply to ${scheduler}; ignored`);
    }
    return { scheduler, flags };
  }

  /** the node addresses NodePorts are served on (nodePortAddresses; default: every address of the node but kube-ipvs0's) */
  private nodePortIPs(family: Family): string[] {
    const list = this.o.config.nodePortAddresses;
    const np = nodePortAddresses(list.length ? list : ['all'], this.node, family);
    this.localAddresses ??= this.o.interfaceAddresses?.() ?? interfaceAddresses();
    const local = this.localAddresses.filter((ip) => (family === 4 ? isIPv4(ip) : !isIPv4(ip)));
    const usable = (ip: string) => !ip.startsWith('127.') && ip !== '::1' && !ip.startsWith('fe80:');
    if (np.all) return local.filter(usable).sort();
    const out = new Set<string>(np.primary);
    if (np.cidrs.length) {
      const cidrs = np.cidrs.map((c) => parseCIDR(c)!);
      for (const ip of local) if (cidrs.some((c) => cidrContains(c, ip))) out.add(ip);
    }
    return [...out].filter(usable).sort();
  }

  private static real(targets: readonly Target[]): Map<string, RealServer> {
    const out = new Map<string, RealServer>();
    for (const t of targets) out.set(rsKey({ address: t.ip, port: t.port }), { address: t.ip, port: t.port, weight: 1 });
    return out;
  }

  /** What one service port wants, into state. */
  private portState(key: string, owner: string, sp: ServicePort, state: OwnerState, elements: Element[], nodeIPs: readonly string[]): void {
    const { scheduler, flags: schedFlags } = this.scheduler(key);
    const persist = sp.affinitySeconds > 0;
    const P = sp.port.Port;
    const el = (set: string, k: string, value = '') => elements.push({ set, key: k, value, comment: '', owner: '' });
    const vipKey = (address: string, port: number) => `${address} . ${sp.protocol} . ${port}`;
    /** a virtual server; without real servers, traffic to it is rejected (no endpoint anywhere) or dropped */
    const add = (address: string, port: number, targets: readonly Target[]) => {
      const vs: VirtualServer = { address, protocol: sp.protocol, port, scheduler, flags: schedFlags | (persist ? FLAG_PERSISTENT : 0), timeout: persist ? sp.affinitySeconds : 0 };
      state.servers.set(vsKey(vs), { vs, owner, real: IpvsProxier.real(targets) });
      if (!targets.length) el(sp.hasEndpoints ? 'no-endpoints-drop' : 'no-endpoints-reject', vipKey(address, port));
    };
    /** an address on kube-ipvs0 and its virtual server */
    const bind = (address: string, targets: readonly Target[]) => {
      add(address, P, targets);
      state.addresses.add(address);
      el('service-addresses', address);
      el('virtual-servers', vipKey(address, P));
    };
    // externalTrafficPolicy Local: pods and the node go to the cluster IP instead (all endpoints)
    const shortcut = (k: string) => {
      el('external-local', k);
      el('external-local-shortcut', k, `${sp.clusterIP} . ${P}`);
    };
    // the cluster IP: internal traffic policy
    bind(sp.clusterIP, sp.internal);
    el('cluster-ips', sp.clusterIP);
    // external and LoadBalancer IPs: external traffic policy (Local: this node's endpoints, the source kept)
    const lbIPs = new Set(sp.loadBalancerIPs);
    for (const vip of new Set([...sp.externalIPs, ...sp.loadBalancerIPs])) {
      bind(vip, sp.externalLocal ? sp.external : sp.cluster);
      const k = vipKey(vip, P);
      if (sp.externalLocal) shortcut(k);
      else el('external-cluster', k);
      if (lbIPs.has(vip) && sp.sourceRanges.length) {
        el('firewall-ips', k);
        for (const r of sp.sourceRanges) el('firewall-allow', `${k} . ${r}`);
        // traffic from the node itself may come from an LB IP
        if (nodeIPs.some((ip) => rangesContain(sp.sourceRanges, ip))) for (const l of sp.loadBalancerIPs) if (!rangesContain(sp.sourceRanges, l)) el('firewall-allow', `${k} . ${l}`);
      }
    }
    // NodePort: a virtual server on each node address
    if (sp.nodePort) {
      for (const ip of this.nodePortIPs(sp.family)) {
        add(ip, sp.nodePort, sp.externalLocal ? sp.external : sp.cluster);
        const k = vipKey(ip, sp.nodePort);
        el('nodeport-servers', k);
        if (sp.externalLocal) shortcut(k);
      }
      if (!sp.externalLocal) el('nodeports-cluster', `${sp.protocol} . ${sp.nodePort}`);
    }
    // hairpin: endpoints that can be on this node
    for (const list of [sp.internal, sp.external, sp.cluster]) for (const t of list) if (t.local || t.nodeName === '') el('hairpin', `${t.ip} . ${t.ip}`);
  }

  /** The Services to recompute besides keys: with the node, its addresses or the ServiceCIDRs changed, those they concern. */
  private nodeKeys(keys: readonly string[]): string[] {
    const out = new Set(keys);
    if (this.cidrsDirty) for (const f of this.families) this.elements.get(f)!.setOwner('service-cidrs', serviceCIDRsOf(this.cidrs.values(), f).map((c) => ({ set: 'service-cidrs', key: singleAddress(c), value: '', comment: '', owner: '' })));
    if (this.nodeDirty) this.localAddresses = undefined;
    const addresses = this.nodePortSignature();
    if (this.nodeDirty || addresses !== this.nodePortAddressesSeen) {
      this.nodePortAddressesSeen = addresses;
      for (const k of this.nodeDependent) out.add(k);
      for (const [k, svc] of this.services) if (svc.Ports.some((p) => p.NodePort) || svc.IPFilters.length) out.add(k);
    }
    return [...out];
  }

  private nodePortSignature(): string {
    return this.families.map((f) => this.nodePortIPs(f).join(',')).join('|');
  }

  private recompute(keys: readonly string[], flows: boolean): void {
    this.trackServices(keys);
    for (const key of keys) {
      const owner = `svc:${key}`;
      const svc = this.serviceOf(key);
      const state: OwnerState = { servers: new Map(), addresses: new Set() };
      this.nodeDependent.delete(key);
      for (const family of this.families) {
        const elements: Element[] = [];
        const ports = svc ? servicePorts(svc, this.endpointsOf(key), family) : [];
        const nodeIPs = ipSetOf(this.node?.IPs, family);
        for (const sp of ports) this.portState(key, owner, sp, state, elements, nodeIPs);
        if (ports.some((sp) => sp.nodePort || sp.sourceRanges.length)) this.nodeDependent.add(key);
        this.elements.get(family)!.setOwner(owner, dedupe(elements));
        const stale = this.staleFlows.update(family, owner, ports);
        if (flows) this.pendingFlows.push(...stale);
      }
      this.setOwner(owner, state);
    }
  }

  /** replaces what an owner wants of IPVS and of kube-ipvs0 */
  private setOwner(owner: string, state: OwnerState): void {
    const before = this.owners.get(owner);
    // the virtual servers this owner wanted or wants: only theirs can change hands (not every touched one: a cold sync would be quadratic)
    const mine = new Set<string>();
    for (const [k] of before?.servers ?? []) {
      const list = (this.wanting.get(k) ?? []).filter((d) => d.owner !== owner);
      if (list.length) this.wanting.set(k, list);
      else this.wanting.delete(k);
      mine.add(k);
    }
    for (const a of before?.addresses ?? []) {
      const n = (this.addressRefs.get(a) ?? 1) - 1;
      if (n > 0) this.addressRefs.set(a, n);
      else (this.addressRefs.delete(a), this.addressesDirty.add(a));
    }
    for (const [k, d] of state.servers) {
      this.wanting.set(k, [...(this.wanting.get(k) ?? []), d]);
      mine.add(k);
    }
    for (const a of state.addresses) {
      const n = this.addressRefs.get(a) ?? 0;
      this.addressRefs.set(a, n + 1);
      if (n === 0) this.addressesDirty.add(a);
    }
    if (state.servers.size || state.addresses.size) this.owners.set(owner, state);
    else this.owners.delete(owner);
    for (const k of mine) {
      this.touched.add(k);
      const list = this.wanting.get(k);
      if (!list?.length) this.desired.delete(k);
      else {
        // the first owner by name wins a virtual server two want (reported once)
        const win = list.reduce((a, b) => (b.owner < a.owner ? b : a));
        if (list.length > 1) this.warnOnce(`conflict ${k}`, `ipvs: ${list.map((d) => d.owner.slice(4)).join(' and ')} want the virtual server ${k}; ${win.owner.slice(4)} (first by name) has it`);
        this.desired.set(k, win);
      }
    }
  }

  // --- applying

  /** the IPVS operations that bring the touched virtual servers to what is wanted */
  private operations(all: boolean): { ops: IpvsOp[]; owners: string[] } {
    const ops: IpvsOp[] = [];
    const owners: string[] = [];
    const push = (op: IpvsOp, owner: string) => (ops.push(op), owners.push(owner));
    const keys = all ? new Set([...this.desired.keys(), ...this.committed.keys()]) : this.touched;
    for (const k of keys) {
      const want = this.desired.get(k);
      const have = this.committed.get(k);
      if (!want) {
        if (have) push({ op: 'del-service', vs: have.vs }, '');
        continue;
      }
      if (!have) {
        push({ op: 'add-service', vs: want.vs }, want.owner);
        for (const rs of want.real.values()) push({ op: 'add-dest', vs: want.vs, rs }, want.owner);
        continue;
      }
      const v = want.vs;
      if (v.scheduler !== have.vs.scheduler || v.flags !== have.vs.flags || v.timeout !== have.vs.timeout) push({ op: 'set-service', vs: v }, want.owner);
      for (const [rk, rs] of want.real) {
        const cur = have.real.get(rk);
        if (!cur) push({ op: 'add-dest', vs: v, rs }, want.owner);
        else if (cur.weight !== rs.weight) push({ op: 'set-dest', vs: v, rs }, want.owner);
      }
      // gone: TCP drained first (weight 0), deleted once it has no connection;
      // UDP and SCTP at once (expire_nodest_conn ends their flows), as kube-proxy
      for (const [rk, cur] of have.real) {
        if (want.real.has(rk)) continue;
        if (v.protocol !== 'tcp') push({ op: 'del-dest', vs: v, rs: cur }, want.owner);
        else if (cur.weight !== 0) push({ op: 'set-dest', vs: v, rs: { ...cur, weight: 0 } }, want.owner);
      }
    }
    return { ops, owners };
  }

  protected async apply(req: ApplyRequest): Promise<{ changes: number }> {
    const t0 = Date.now();
    await this.start();
    const found = req.full && !req.check ? await this.adopt() : undefined;
    if (req.full) this.localAddresses = undefined;
    this.recompute(this.nodeKeys(this.tenantTables ? serviceKeys(req.keys) : req.keys), !req.check);
    if (found) this.adoptServers(found);
    const tx = this.render(req.full || req.check || !this.structureKnown || this.nodeDirty);
    // the tenants' tables in the same transaction
    const tenants = await this.tenantTables?.sync(req, (k) => this.isHeldBack(k));
    if (tenants) tx.tx.append(tenants.tx);
    const { ops, owners } = this.operations(req.full && !req.check);
    if (req.check) {
      // IPVS cannot check without applying: what it refused in the last sync is what it refuses
      if (!this.o.dryRun) await this.nft.run(tx.tx, { check: true });
      const refused = [...this.refusedOwners].map((o) => o.slice('svc:'.length)).filter((k) => !this.isHeldBack(k));
      if (refused.length) throw new Error(`IPVS refused ${refused.join(', ')}`);
      return { changes: 0 };
    }
    if (this.o.dryRun) {
      const out = this.o.out ?? process.stdout;
      const text = tx.tx.render();
      if (text) out.write(text);
      for (const o of ops) out.write(`ipvs ${o.op} ${vsKey(o.vs)}${'rs' in o ? ` -> ${rsKey(o.rs)} weight ${o.rs.weight}` : ` ${o.vs.scheduler}${o.vs.timeout ? ` persistent ${o.vs.timeout}s` : ''}`}\n`);
      tx.commit();
      this.commitOps(ops, ops.map(() => undefined));
      this.touched.clear();
      return { changes: ops.length };
    }
    // the table first (masquerading ready before traffic arrives), then IPVS, then the addresses
    const t1 = Date.now();
    await this.nft.run(tx.tx);
    tx.commit();
    tenants?.commit();
    this.structureKnown = true;
    const t2 = Date.now();
    const results = this.ipvs!.apply(ops);
    this.commitOps(ops, results);
    this.touched.clear();
    const t3 = Date.now();
    await this.bindAddresses(req.full);
    const t4 = Date.now();
    await this.drain();
    const phases = (this.stats.lastPhases = { computeMs: t1 - t0, nftMs: t2 - t1, ipvsMs: t3 - t2, addressMs: t4 - t3 });
    this.stats.lastOperations = ops.length;
    metrics.stageDuration.observe({ stage: 'apply' }, (Date.now() - t0) / 1000);
    const failed = results.map((r, i) => (r ? owners[i] : '')).filter(Boolean);
    this.refusedOwners = new Set(failed);
    if (failed.length) {
      // what failed is not committed: compared again at the next sync
      results.forEach((r, i) => r && this.touched.add(vsKey(ops[i].vs)));
      throw new Error(`IPVS refused ${failed.length} operation(s): ${results.find(Boolean)!.message}`);
    }
    this.o.log.debug({ full: req.full, ms: Date.now() - t0, operations: ops.length, elementChanges: tx.tx.elementCount, addresses: this.addressChanges, ...phases }, 'ipvs: synced');
    return { changes: ops.length + tx.tx.elementCount };
  }

  /** records what the kernel acknowledged */
  private commitOps(ops: readonly IpvsOp[], results: readonly (IpvsError | undefined)[]): void {
    ops.forEach((o, i) => {
      if (results[i]) return;
      const k = vsKey(o.vs);
      switch (o.op) {
        case 'add-service':
          this.committed.set(k, { vs: o.vs, real: new Map() });
          break;
        case 'set-service':
          this.committed.get(k)!.vs = o.vs;
          break;
        case 'del-service':
          this.committed.delete(k);
          for (const d of [...this.draining.keys()]) if (d.startsWith(`${k}|`)) this.draining.delete(d);
          break;
        case 'add-dest':
        case 'set-dest':
          this.committed.get(k)?.real.set(rsKey(o.rs), o.rs);
          if (o.rs.weight === 0 && !this.desired.get(k)?.real.has(rsKey(o.rs))) this.draining.set(`${k}|${rsKey(o.rs)}`, { vs: o.vs, rs: o.rs });
          else this.draining.delete(`${k}|${rsKey(o.rs)}`);
          break;
        case 'del-dest':
          this.committed.get(k)?.real.delete(rsKey(o.rs));
          this.draining.delete(`${k}|${rsKey(o.rs)}`);
          break;
      }
    });
    this.stats.draining = this.draining.size;
  }

  /** deletes the drained real servers that have no connection left */
  private async drain(): Promise<void> {
    if (!this.draining.size || !this.ipvs) return;
    const byVS = new Map<string, VirtualServer>();
    for (const d of this.draining.values()) byVS.set(vsKey(d.vs), d.vs);
    const dels: IpvsOp[] = [];
    for (const [k, vs] of byVS) {
      let list: RealServer[];
      try {
        list = this.ipvs.destinations(vs);
      } catch {
        continue;
      }
      for (const r of list) {
        const d = this.draining.get(`${k}|${rsKey(r)}`);
        if (d && !r.activeConns && !r.inactiveConns) dels.push({ op: 'del-dest', vs, rs: d.rs });
      }
    }
    this.commitOps(dels, this.ipvs.apply(dels));
  }

  /** binds and unbinds the service addresses on kube-ipvs0 */
  private async bindAddresses(full: boolean): Promise<void> {
    // a full sync compares everything (kube-ipvs0 was read again); otherwise only what changed owners
    const candidates = full ? new Set([...this.addressRefs.keys(), ...this.boundAddresses]) : this.addressesDirty;
    const add: string[] = [];
    const del: string[] = [];
    for (const a of candidates) {
      if (this.addressRefs.has(a)) {
        if (!this.boundAddresses.has(a)) add.push(a);
      } else if (this.boundAddresses.has(a) && !this.isExcluded(a)) del.push(a);
    }
    this.addressesDirty.clear();
    this.addressChanges = add.length + del.length;
    if (!add.length && !del.length) return;
    const failed = await this.host.change(add, del);
    if (!failed.length) {
      // as asked: no need to list kube-ipvs0 again (a listing grows with the Service IPs)
      for (const a of del) this.boundAddresses.delete(a);
      for (const a of add) this.boundAddresses.add(a);
      return;
    }
    this.o.log.warn({ failed: failed.join('; ') }, 'ipvs: some service addresses could not be bound or unbound; the next sync tries again');
    this.boundAddresses = await this.readAddresses();
    // what is still not as wanted is compared again at the next sync
    for (const a of add) if (!this.boundAddresses.has(a)) this.addressesDirty.add(a);
    for (const a of del) if (this.boundAddresses.has(a)) this.addressesDirty.add(a);
  }

  private isExcluded(address: string): boolean {
    return this.excluded.some((c) => c && cidrContains(c, address));
  }

  private readAddresses(): Promise<Set<string>> {
    return this.host.addresses();
  }

  /** Reads what kube-ipvs0 and the table have (what a previous kpng left), and IPVS's virtual servers (see adoptServers). */
  private async adopt(): Promise<VirtualServer[]> {
    this.watch?.start();
    this.structureKnown = false;
    await this.tenantTables?.adopt();
    this.boundAddresses = this.o.dryRun ? new Set() : await this.readAddresses();
    for (const f of this.families) {
      const listing = this.o.dryRun ? undefined : await this.nft.list(FAMILIES[f].table, TABLE);
      this.elements.get(f)!.adopt(listing?.elements ?? new Map());
    }
    this.committed = new Map();
    this.draining.clear();
    return this.o.dryRun || !this.ipvs ? [] : this.ipvs.services();
  }

  /**
   * Takes the virtual servers that are kpng's as committed: on an address of
   * kube-ipvs0, a NodePort server its table recorded, or one a Service wants
   * now (a server left behind when its address was lost is taken over, not
   * refused as existing).
   */
  private adoptServers(found: readonly VirtualServer[]): void {
    const recorded = new Set<string>();
    for (const f of this.families) for (const k of this.elements.get(f)!.committedKeys('nodeport-servers')) recorded.add(k);
    for (const vs of found) {
      const k = vsKey(vs);
      const ours = this.boundAddresses.has(vs.address) || recorded.has(`${vs.address} . ${vs.protocol} . ${vs.port}`);
      if (!this.desired.has(k) && (!ours || this.isExcluded(vs.address))) continue;
      const real = new Map(this.ipvs!.destinations(vs).map((r) => [rsKey(r), { address: r.address, port: r.port, weight: r.weight }]));
      this.committed.set(k, { vs, real });
      for (const [rk, r] of real) if (r.weight === 0) this.draining.set(`${k}|${rk}`, { vs, rs: r });
    }
  }

  private render(header: boolean): { tx: Transaction; commit(): void } {
    const tx = new Transaction();
    const commits: (() => void)[] = [];
    for (const f of this.families) {
      const names = FAMILIES[f];
      const table: TableRef = { family: names.table, name: TABLE };
      if (header) {
        tx.add({ kind: 'table', ...table, comment: 'rules around IPVS for kpng' });
        for (const [name, body] of Object.entries(sets(names))) tx.add({ kind: body.includes(' : ') ? 'map' : 'set', table, name, body });
        const ch = chains(names, this.staticInputs(names));
        for (const name of ch.keys()) tx.add({ kind: 'chain', table, name, hook: BASE_CHAINS[name] });
        for (const [name, rules] of ch) {
          tx.flush({ kind: 'chain', table, name });
          for (const rule of rules) tx.add({ kind: 'rule', table, chain: name, rule });
        }
      }
      const diff = this.elements.get(f)!.diff();
      tx.elements('delete', table, diff.deletes).elements('add', table, diff.adds);
      commits.push(() => this.elements.get(f)!.commit());
    }
    return { tx, commit: () => commits.forEach((c) => c()) };
  }

  private staticInputs(f: FamilyNames): StaticInputs {
    const c = this.o.config;
    const local = detectLocal(c, this.node, f.family, (id, msg) => this.warnOnce(id, msg));
    return { mark: `0x${(1 << c.iptables.masqueradeBit).toString(16)}`, masqueradeAll: c.iptables.masqueradeAll, ...podSourceMatches(local, f.ip) };
  }

  /** a tenant's content the kernel refuses: the tenant goes back to its last good content */
  protected override onRefused(key: string, why: string): boolean {
    return !!this.tenantTables?.refused(key, why);
  }

  /** the periodic check: nftables' events for the table, IPVS's virtual servers and kube-ipvs0's addresses against what kpng committed; drains real servers */
  protected override async checkDrift(): Promise<string | undefined> {
    if (!this.ipvs || this.o.dryRun) return undefined;
    await this.drain();
    this.localAddresses = undefined;
    if (this.nodePortSignature() !== this.nodePortAddressesSeen) return "the node's addresses changed (NodePorts)";
    const nftDrift = this.watch?.check();
    if (nftDrift) return nftDrift;
    const seen = new Map(this.ipvs.services().map((v) => [vsKey(v), v]));
    for (const [k, c] of this.committed) {
      const v = seen.get(k);
      if (!v) return `IPVS virtual server ${k} is gone`;
      if (v.scheduler !== c.vs.scheduler || v.flags !== c.vs.flags || v.timeout !== c.vs.timeout) return `IPVS virtual server ${k} was changed`;
    }
    if (this.addressesDirty.size) return `${this.addressesDirty.size} service address(es) to bind or unbind again`;
    const bound = await this.readAddresses();
    for (const a of this.boundAddresses) if (!bound.has(a)) return `${a} is no longer on ${DUMMY}`;
    return undefined;
  }
}

function dedupe(list: Element[]): Element[] {
  const seen = new Set<string>();
  return list.filter((e) => {
    const k = `${e.set}\0${e.key}`;
    if (seen.has(k)) return false;
    seen.add(k);
    return true;
  });
}

function interfaceAddresses(): string[] {
  return Object.entries(networkInterfaces())
    .filter(([name]) => name !== DUMMY)
    .flatMap(([, l]) => (l ?? []).map((a) => a.address.replace(/%.*$/, '')));
}
