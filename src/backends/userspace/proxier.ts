// to-userspace: kube-proxy's userspace mode. kpng accepts every connection to
// a Service on the node (the userspace engine, shared/userspace/engine.ts)
// and its own nftables table redirects Service addresses and NodePorts to
// the listeners (shared/userspace/redirect.ts). A sync: the Services that
// changed are computed again, the engine's listeners are updated (a Service's
// listeners open and close with it; an endpoint change only swaps the list
// they pick from), then the table is written whole in one transaction.
import { cidrContains, parseCIDR, type Family } from '../../api/ip.js';
import { ProxierBase, type ApplyRequest, type SyncStats } from '../shared/proxier.js';
import type { DataplaneOptions } from '../shared/backend.js';
import { servicePorts, rangesContain, normalizeCIDRs, type ServicePort } from '../shared/service-ports.js';
import { ipSetOf } from '../../api/model.js';
import { detectLocal, nodePortAddresses } from '../shared/node-facts.js';
import { ProcessNft, type Nft } from '../shared/nftables/nft.js';
import { UserspaceEngine, type ListenerSpec } from '../shared/userspace/engine.js';
import { redirectTransaction, type RedirectRules } from '../shared/userspace/redirect.js';
import { nftTenantTables, serviceKeys, type NftTenantTables } from '../shared/nftables/tenants.js';
import { nftDrift, type DriftSource } from '../shared/nftables/watch.js';

export const TABLE = 'kpng-userspace';

type Mutable<K extends keyof RedirectRules> = RedirectRules[K] extends readonly (infer T)[] ? T[] : never;

export interface UserspaceProxierOptions extends DataplaneOptions {
  readonly nftPath?: string;
  /** tests: a FakeNft */
  readonly nft?: Nft;
  readonly udpIdleMs?: number;
  readonly udpMaxSessions?: number;
}

/** One service port in one family, as the table and the engine need it. */
interface PortPlan {
  readonly listeners: ListenerSpec[];
  /** Service IPs -> the key of the listener that serves them */
  readonly ips: { family: Family; ip: string; protocol: 'tcp' | 'udp'; port: number; listener: string }[];
  readonly nodePorts: { family: Family; protocol: 'tcp' | 'udp'; nodePort: number; listener: string }[];
  readonly rejectIPs: RedirectRules['rejectIPs'][number][];
  readonly rejectNodePorts: RedirectRules['rejectNodePorts'][number][];
  readonly firewall: NonNullable<RedirectRules['firewall']>[number][];
}

export interface UserspaceStats extends SyncStats {
  listeners: number;
}

export class UserspaceProxier extends ProxierBase {
  readonly stats: UserspaceStats = { syncs: 0, fullSyncs: 0, failures: 0, lastSyncMs: 0, lastSuccess: 0, repairs: 0, listeners: 0 };
  readonly engine: UserspaceEngine;
  private readonly nft: Nft;
  private readonly families: readonly Family[];
  private readonly plans = new Map<string, PortPlan[]>();
  private podCIDRs: { 4: ReturnType<typeof parseCIDR>[]; 6: ReturnType<typeof parseCIDR>[] } = { 4: [], 6: [] };
  /** the node's tenants' tables, written in the same transactions as kpng's table (when this backend is their writer) */
  private readonly tenantTables?: NftTenantTables;
  /** their drift: nftables' change events (kpng's own table is checked by listing it) */
  private readonly tenantWatch?: DriftSource;

  constructor(private readonly o: UserspaceProxierOptions) {
    super(o, { minSyncPeriodMs: o.config.nftables.minSyncPeriodMs, syncPeriodMs: o.config.nftables.syncPeriodMs });
    this.nft = o.nft ?? new ProcessNft({ path: o.nftPath });
    this.families = o.families ?? [4, 6];
    const tenants = (this.tenantTables = nftTenantTables({ ...o, nft: this.nft, reservedMark: 1 << o.config.nftables.masqueradeBit, changed: (key) => this.otherChanged(key) }));
    if (tenants && o.watch !== false) this.tenantWatch = nftDrift(this.nft, { ours: (e) => tenants.ours(e), netns: o.netns, log: o.log });
    this.engine = new UserspaceEngine({
      log: o.log,
      udpIdleMs: o.udpIdleMs ?? o.config.udpIdleTimeoutMs,
      udpMaxSessions: o.udpMaxSessions,
      isPodClient: (ip) => {
        const f = ip.includes(':') ? 6 : 4;
        return this.podCIDRs[f].some((c) => !!c && cidrContains(c, ip));
      },
    });
  }

  override async close(): Promise<void> {
    await super.close();
    this.tenantTables?.close();
    this.tenantWatch?.close();
    await this.engine.close();
    this.nft.close();
  }

  // --- computing

  private plan(key: string): PortPlan[] {
    const svc = this.serviceOf(key);
    if (!svc) return [];
    const out: PortPlan[] = [];
    for (const family of this.families) {
      let ports: ServicePort[];
      try {
        ports = servicePorts(svc, this.endpointsOf(key), family);
      } catch (e) {
        this.warnOnce(`bad ${key}`, `userspace: skipping Service ${key}: ${(e as Error).message}`);
        return [];
      }
      for (const sp of ports) out.push(this.planPort(sp));
    }
    return out;
  }

  private planPort(sp: ServicePort): PortPlan {
    const p: PortPlan = { listeners: [], ips: [], nodePorts: [], rejectIPs: [], rejectNodePorts: [], firewall: [] };
    const { family, protocol } = sp;
    const port = sp.port.Port;
    const externalAddrs = [...sp.externalIPs, ...sp.loadBalancerIPs];
    // loadBalancerSourceRanges guard the LB IPs only; when they cover the node, its traffic to an LB IP
    // (which may carry the LB IP as its source) gets through too, as in to-nft
    if (sp.sourceRanges.length) {
      const coversNode = ipSetOf(this.node?.IPs, family).some((ip) => rangesContain(sp.sourceRanges, ip));
      const lbs = sp.loadBalancerIPs.filter((l) => !rangesContain(sp.sourceRanges, l));
      const allow = [...sp.sourceRanges, ...(coversNode ? lbs : [])];
      for (const ip of sp.loadBalancerIPs) p.firewall.push({ family, ip, protocol, port, allow });
    }
    if (protocol === 'sctp') {
      // node has no SCTP sockets: such a port is refused rather than half served
      this.warnOnce(`sctp ${sp.portName}`, `userspace: ${sp.portName} is SCTP, which the userspace proxy does not serve; it is rejected`);
      for (const ip of [sp.clusterIP, ...externalAddrs]) p.rejectIPs.push({ family, ip, protocol, port });
      if (sp.nodePort) p.rejectNodePorts.push({ family, protocol, nodePort: sp.nodePort });
      return p;
    }
    const base = `${sp.service}|${port}|${protocol}|${family}`;
    const affinity = { affinitySeconds: sp.affinitySeconds, affinityKey: base };
    // a listener (and port) per address, and one for the NodePort: a client sending from one port to two
    // addresses of a service port makes two flows; redirected to one listener port they would share one
    // NAT reply tuple, and the kernel would drop the second
    const internal = `${base}|${sp.clusterIP}`;
    p.listeners.push({ key: internal, service: sp.service, protocol, family, endpoints: sp.internal, ...affinity });
    if (sp.internal.length) p.ips.push({ family, ip: sp.clusterIP, protocol, port, listener: internal });
    else p.rejectIPs.push({ family, ip: sp.clusterIP, protocol, port });
    // external traffic (externalTrafficPolicy); Local: the node and its pods short-circuit to every endpoint, as kube-proxy does
    const external = { service: sp.service, protocol, family, endpoints: sp.external, localEndpoints: sp.externalLocal ? sp.cluster : undefined, ...affinity };
    const served = sp.external.length > 0 || (sp.externalLocal && sp.cluster.length > 0);
    // listeners exist as long as the Service does (an endpoint change opens and closes nothing); only what
    // the table does with the address (redirect, or reject without endpoints) follows the endpoints
    for (const ip of externalAddrs) {
      const key = `${base}|${ip}`;
      p.listeners.push({ key, ...external });
      if (served) p.ips.push({ family, ip, protocol, port, listener: key });
      else p.rejectIPs.push({ family, ip, protocol, port });
    }
    if (sp.nodePort) {
      const key = `${base}|nodeport`;
      p.listeners.push({ key, ...external });
      if (served) p.nodePorts.push({ family, protocol, nodePort: sp.nodePort, listener: key });
      else p.rejectNodePorts.push({ family, protocol, nodePort: sp.nodePort });
    }
    return p;
  }

  private nodePortAddressesOf(family: Family): 'all' | string[] {
    const c = this.o.config;
    // the userspace mode served NodePorts on every address (as iptables): the default when unset
    const np = nodePortAddresses(c.nodePortAddresses.length ? c.nodePortAddresses : ['all'], this.node, family);
    if (np.all) return 'all';
    if (np.unknownNode) {
      this.warnOnce(`primary-${family}`, 'nodePortAddresses "primary": the Node is not known yet; serving NodePorts on every local address until it is');
      return 'all';
    }
    const host = family === 4 ? '/32' : '/128';
    // an interval set refuses overlaps: a primary IP inside one of the CIDRs goes
    return normalizeCIDRs([...np.primary.map((ip) => ip + host), ...np.cidrs, ...(np.localhost ? [family === 4 ? '127.0.0.0/8' : '::1/128'] : [])]);
  }

  private rules(): RedirectRules {
    const r = { serviceIPs: [] as Mutable<'serviceIPs'>, nodePorts: [] as Mutable<'nodePorts'>, rejectIPs: [] as Mutable<'rejectIPs'>, rejectNodePorts: [] as Mutable<'rejectNodePorts'>, firewall: [] as NonNullable<RedirectRules['firewall']>[number][] };
    for (const plans of this.plans.values()) {
      for (const p of plans) {
        for (const e of p.ips) {
          const to = this.o.dryRun ? 0 : this.engine.portOf(e.listener);
          if (to !== undefined) r.serviceIPs.push({ family: e.family, ip: e.ip, protocol: e.protocol, port: e.port, to });
        }
        for (const e of p.nodePorts) {
          const to = this.o.dryRun ? 0 : this.engine.portOf(e.listener);
          if (to !== undefined) r.nodePorts.push({ family: e.family, protocol: e.protocol, nodePort: e.nodePort, to });
        }
        r.rejectIPs.push(...p.rejectIPs);
        r.firewall.push(...p.firewall);
        r.rejectNodePorts.push(...p.rejectNodePorts);
      }
    }
    return { ...r, nodePortAddresses: { 4: this.nodePortAddressesOf(4), 6: this.nodePortAddressesOf(6) } };
  }

  // --- applying

  protected async apply(req: ApplyRequest): Promise<{ changes: number }> {
    if (this.nodeDirty) {
      for (const f of [4, 6] as const) {
        const d = detectLocal(this.o.config, this.node, f, (id, msg) => this.warnOnce(id, msg));
        this.podCIDRs[f] = d?.kind === 'cidrs' ? d.cidrs.map(parseCIDR) : [];
      }
    }
    if (req.full && !req.check && this.tenantTables) {
      this.tenantWatch?.start();
      await this.tenantTables.adopt();
    }
    const services = this.tenantTables ? serviceKeys(req.keys) : req.keys;
    this.trackServices(services);
    // a source range covering the node changes with the node's IPs
    const keys = new Set(services);
    if (this.nodeDirty) for (const [k, svc] of this.services) if (svc.IPFilters.length) keys.add(k);
    // the plans follow what was asked, applied or not: a failed sync is retried with the same keys,
    // and isolation's checks give only the Services they toggled
    for (const key of keys) {
      const p = this.plan(key);
      if (p.length) this.plans.set(key, p);
      else this.plans.delete(key);
    }
    if (!this.o.dryRun && !req.check) {
      await this.engine.update([...this.plans.values()].flatMap((ps) => ps.flatMap((p) => p.listeners)));
      this.stats.listeners = this.engine.stats.listeners;
    }
    const tx = redirectTransaction(TABLE, this.rules(), this.families);
    // the tenants' tables in the same transaction
    const tenants = await this.tenantTables?.sync(req, (k) => this.isHeldBack(k));
    if (tenants) tx.append(tenants.tx);
    if (this.o.dryRun) {
      if (!req.check) (this.o.out ?? process.stdout).write(tx.render());
    } else await this.nft.run(tx, { check: req.check });
    if (!req.check) tenants?.commit();
    return { changes: req.keys.length };
  }

  /** a tenant's content the kernel refuses: the tenant goes back to its last good content */
  protected override onRefused(key: string, why: string): boolean {
    return !!this.tenantTables?.refused(key, why);
  }

  protected override async checkDrift(): Promise<string | undefined> {
    const tenants = this.tenantWatch?.check();
    if (tenants) return tenants;
    const listing = await this.nft.list('inet', TABLE);
    if (!listing) return `the table inet ${TABLE} is gone`;
    let want = 0;
    for (const plans of this.plans.values()) for (const p of plans) want += p.ips.length + p.nodePorts.length;
    let have = 0;
    for (const [name, els] of listing.elements) if (name.startsWith('service-ips-') || name.startsWith('nodeports-')) have += els.size;
    return have < want ? `the table inet ${TABLE} lost redirect elements (${have} of ${want})` : undefined;
  }
}
