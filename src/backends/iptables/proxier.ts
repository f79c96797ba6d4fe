// The iptables proxier: kube-proxy's iptables mode on kpng's node-local
// state. Each sync is one `iptables-restore --noflush` per family (*filter,
// then *nat): the top-level chains in full, and only the per-service chains
// that changed (KEP-3453 partial sync), compared with the committed state
// kept in memory. A full reconcile (iptables-save read back) happens only at
// start-up, adopting what a previous kpng left so that nothing is flushed and
// no connection is disturbed, after a failure, and when the canary chain
// disappears (someone flushed iptables).
import { readFileSync, writeFileSync } from 'node:fs';
import { networkInterfaces } from 'node:os';
import { parseCIDR, cidrContains, type Family } from '../../api/ip.js';
import { externallyAccessible, ipSetOf } from '../../api/model.js';
import { ipFamily as primaryFamily, metrics } from '../../runtime/metrics.js';
import { ProxierBase, type ApplyRequest, type SyncStats } from '../shared/proxier.js';
import { sameRules } from '../shared/chain-rules.js';
import type { DataplaneOptions } from '../shared/backend.js';
import { servicePorts } from '../shared/service-ports.js';
import { detectLocal, nodePortAddresses } from '../shared/node-facts.js';
import { NftWatch } from '../shared/nftables/watch.js';
import { xtablesDigest, type XtablesDigest } from '../../kernel/xtables.js';
import { isServiceChain, markHex } from './names.js';
import {
  FILTER_CHAINS,
  NAT_CHAINS,
  KUBE_FIREWALL,
  KUBE_PROXY_CANARY,
  emptyPortRules,
  filterFixedRules,
  jumpRules,
  natFixedChains,
  nodePortJumps,
  renderPort,
  type JumpRule,
  type PortRules,
  type RenderContext,
  type StaticInputs,
} from './rules.js';
import { IptablesError, detectMode, restore, run, save, toolName, type IptablesMode, type ToolPath } from './iptables.js';

export interface IptablesProxierOptions extends DataplaneOptions {
  /** iptables-nft or iptables-legacy; detected when not given */
  readonly mode?: IptablesMode;
  /** where the tools are (tests run them in a namespace); default: by name */
  readonly tool?: ToolPath;
  /** the node's interface addresses (nodePortAddresses CIDRs); default: this process's namespace */
  readonly interfaceAddresses?: () => string[];
}

/** What one Service renders to, in one family. */
interface ServiceRules extends PortRules {
  /** endpoints it counts toward large-cluster mode */
  readonly endpoints: number;
}

interface FamilyState {
  readonly family: Family;
  readonly rules: Map<string, ServiceRules>;
  /** service keys in order (the order of KUBE-SERVICES), undefined when the set changed */
  order?: string[];
  /** every per-service nat chain wanted now: name -> rules */
  readonly desired: Map<string, string[]>;
  /** per-service nat chains as the kernel has them: name -> rules (-A lines) */
  committed: Map<string, string[]>;
  /** rules in the committed per-service chains (kept as they change, for sync_proxy_rules_iptables_total) */
  committedRules: number;
  /** jump rules from the built-in chains that are missing (filled at a reconcile) */
  missingJumps: JumpRule[];
  /** Services computed again since their chains were last written: the chains they had before */
  readonly uncommitted: Map<string, string[]>;
  endpoints: number;
  /** upstream's large-cluster mode: more than 1000 endpoints, no comments on endpoint rules */
  large: boolean;
}

/** the tables kpng writes, and the built-in chains that jump into its chains */
const TABLES = ['filter', 'nat', 'mangle'];
const BUILT_IN = new Set(['INPUT', 'OUTPUT', 'FORWARD', 'PREROUTING', 'POSTROUTING']);

export interface ProxierStats extends SyncStats {
  /** per-service chains written (flushed and refilled) by the last sync */
  lastChainsWritten: number;
  lastChainsDeleted: number;
  /** restore input size of the last sync, all families */
  lastRestoreBytes: number;
  /** periodic drift checks run (whatever they found) */
  driftChecks: number;
}

/** upstream largeClusterEndpointsThreshold: above it, endpoint rules lose their comments */
const LARGE_CLUSTER_ENDPOINTS = 1000;

export class IptablesProxier extends ProxierBase {
  private started = false;
  private mode?: IptablesMode;
  private tcpBeLiberal = false;
  private readonly fam: Map<Family, FamilyState>;
  private readonly tool: ToolPath;
  /** iptables-nft: nftables' change events; iptables-legacy: each table's size and digest as kpng left it */
  private watch?: NftWatch;
  private legacyDigests?: Map<string, XtablesDigest | undefined>;
  readonly stats: ProxierStats = { syncs: 0, fullSyncs: 0, failures: 0, lastSyncMs: 0, lastSuccess: 0, repairs: 0, lastChainsWritten: 0, lastChainsDeleted: 0, lastRestoreBytes: 0, driftChecks: 0 };

  constructor(private readonly o: IptablesProxierOptions) {
    super(o, { minSyncPeriodMs: o.config.iptables.minSyncPeriodMs, syncPeriodMs: o.config.iptables.syncPeriodMs });
    this.mode = o.mode;
    this.tool = o.tool ?? ((t) => t);
    this.fam = new Map((o.families ?? [4, 6]).map((f) => [f, { family: f, rules: new Map(), desired: new Map(), committed: new Map(), committedRules: 0, missingJumps: [], uncommitted: new Map(), endpoints: 0, large: false } satisfies FamilyState]));
  }

  override async close(): Promise<void> {
    await super.close();
    this.watch?.close();
  }

  /** the iptables in use (after the first sync) */
  get iptablesMode(): IptablesMode | undefined {
    return this.mode;
  }

  // --- what to program

  /** 'all', or the node addresses NodePorts are served on (upstream NodePortAddresses) */
  private nodePortAddresses(family: Family): 'all' | string[] {
    const list = this.o.config.nodePortAddresses;
    const np = nodePortAddresses(list.length ? list : ['all'], this.node, family);
    if (np.all) return 'all';
    const out = new Set<string>(np.primary);
    if (np.localhost && family === 4) out.add('127.0.0.1');
    if (np.cidrs.length) {
      const cidrs = np.cidrs.map((c) => parseCIDR(c)!);
      for (const ip of this.o.interfaceAddresses?.() ?? interfaceAddresses()) if (cidrs.some((c) => cidrContains(c, ip))) out.add(ip);
    }
    const loopback = (ip: string) => ip === '::1' || ip.startsWith('127.');
    return [...out].filter((ip) => !loopback(ip) || (family === 4 && this.localhostNodePorts(4))).sort();
  }

  /** IPv4 NodePorts on 127.0.0.1: only when nodePortAddresses include it (upstream ContainsIPv4Loopback) */
  private localhostNodePorts(family: Family): boolean {
    if (family !== 4 || !this.o.config.iptables.localhostNodePorts) return false;
    const list = this.o.config.nodePortAddresses;
    if (!list.length || list.includes('all') || list.includes('localhost')) return true;
    return list.some((a) => {
      const c = parseCIDR(a);
      return !!c && cidrContains(c, '127.0.0.1');
    });
  }

  private renderContext(st: FamilyState): RenderContext {
    const family = st.family;
    const c = this.o.config;
    const detector = detectLocal(c, this.node, family, (id, msg) => this.warnOnce(id, msg));
    // iptables matches one CIDR per family, as upstream
    const local: RenderContext['local'] = detector?.kind === 'cidrs' ? { kind: 's', value: detector.cidrs[0] } : detector ? { kind: 'i', value: detector.prefix ? `${detector.name}+` : detector.name } : undefined;
    return {
      family,
      mark: markHex(c.iptables.masqueradeBit),
      masqueradeAll: c.iptables.masqueradeAll,
      local,
      nodeIPs: ipSetOf(this.node?.IPs, family),
      comments: !st.large,
    };
  }

  private staticInputs(family: Family): StaticInputs {
    return {
      family,
      mark: markHex(this.o.config.iptables.masqueradeBit),
      localhostNodePorts: this.localhostNodePorts(family),
      tcpBeLiberal: this.tcpBeLiberal,
      nodePortAddresses: this.nodePortAddresses(family),
    };
  }

  private renderService(key: string, ctx: RenderContext): ServiceRules | undefined {
    const svc = this.serviceOf(key);
    if (!svc) return undefined;
    const out = { ...emptyPortRules(), endpoints: 0 };
    const facts = {
      serviceExternallyAccessible: externallyAccessible(svc),
      healthCheckNodePort: svc.Type === 'LoadBalancer' && svc.ExternalTrafficToLocal ? svc.HealthCheckNodePort : 0,
    };
    let endpoints = 0;
    const ports = servicePorts(svc, this.endpointsOf(key), ctx.family);
    for (const sp of ports) {
      renderPort(sp, facts, ctx, out);
      endpoints += Math.max(sp.cluster.length, sp.internal.length, sp.external.length);
    }
    return { ...out, endpoints };
  }

  /** Brings the rendered Services up to date (flows: note the UDP flows to clean). */
  private recompute(keys: readonly string[], flows: boolean): void {
    const all = this.nodeDirty;
    this.trackServices(keys);
    const rerender = (st: FamilyState, list: Iterable<string>) => {
      const ctx = this.renderContext(st);
      for (const key of list) {
        const before = st.rules.get(key);
        const now = this.renderService(key, ctx);
        const svc = this.serviceOf(key);
        const stale = this.staleFlows.update(st.family, key, svc ? servicePorts(svc, this.endpointsOf(key), st.family) : []);
        if (flows) this.pendingFlows.push(...stale);
        st.endpoints += (now?.endpoints ?? 0) - (before?.endpoints ?? 0);
        for (const name of before?.chains.keys() ?? []) st.desired.delete(name);
        for (const [name, rules] of now?.chains ?? []) st.desired.set(name, rules);
        if (now) st.rules.set(key, now);
        else st.rules.delete(key);
        if (!before || !now) st.order = undefined;
        if (!st.uncommitted.has(key)) st.uncommitted.set(key, [...(before?.chains.keys() ?? [])]);
      }
    };
    for (const st of this.fam.values()) {
      // the node's IPs (source ranges covering the node) and pod CIDRs (NodeCIDR) shape every service
      rerender(st, all ? new Set([...keys, ...this.services.keys(), ...st.rules.keys()]) : keys);
    }
    // large-cluster mode, per family as upstream's per-family proxiers: comments change everywhere
    for (const [family, st] of this.fam) {
      const large = st.endpoints > LARGE_CLUSTER_ENDPOINTS;
      if (large === st.large) continue;
      st.large = large;
      this.o.log.info({ family, largeClusterMode: large }, `iptables: ${large ? 'more' : 'no more'} than ${LARGE_CLUSTER_ENDPOINTS} endpoints: endpoint rules ${large ? 'without' : 'with'} comments`);
      rerender(st, [...st.rules.keys()]);
    }
  }

  // --- applying

  private async start(): Promise<void> {
    if (this.started) return;
    this.started = true;
    if (this.o.dryRun) {
      this.mode ??= 'nft';
      return;
    }
    if (!this.mode) {
      const d = await detectMode(this.tool);
      this.mode = d.mode;
      this.o.log.info({ mode: d.mode, reason: d.reason }, `iptables: using iptables-${d.mode}`);
    }
    const c = this.o.config;
    if (c.conntrack.tcpBeLiberal) await this.sysctl('net.netfilter.nf_conntrack_tcp_be_liberal', '1');
    this.tcpBeLiberal = (await this.sysctl('net.netfilter.nf_conntrack_tcp_be_liberal')) === '1';
    if (this.tcpBeLiberal) this.o.log.info('iptables: nf_conntrack_tcp_be_liberal is set, not dropping INVALID packets');
    if (this.fam.has(4) && this.localhostNodePorts(4)) {
      this.o.log.info(
        'iptables: setting route_localnet=1 to allow NodePorts on localhost; to change this, disable iptables.localhostNodePorts or set nodePortAddresses without 127.0.0.1',
      );
      await this.sysctl('net.ipv4.conf.all.route_localnet', '1');
    }
  }

  /** Reads (and, with value, sets) a sysctl of kpng's network namespace. */
  private async sysctl(key: string, value?: string): Promise<string> {
    try {
      return (await run(this.tool('sysctl'), value === undefined ? ['-n', key] : ['-w', `${key}=${value}`])).trim().replace(/^.*= /, '');
    } catch (e) {
      // no sysctl binary (procps): /proc/sys of this process's namespace
      if (e instanceof IptablesError && e.code === -1 && !this.o.tool) {
        const path = `/proc/sys/${key.replace(/\./g, '/')}`;
        try {
          if (value !== undefined) writeFileSync(path, value);
          return readFileSync(path, 'utf8').trim();
        } catch {
          // reported below
        }
      }
      if (value !== undefined) this.o.log.warn({ key, err: (e as Error).message }, 'iptables: cannot set sysctl');
      return '';
    }
  }

  /**
   * The periodic check, cheap while nobody touches iptables: with
   * iptables-nft, nftables' change events to kpng's chains (and the built-in
   * chains that jump to them) by another process; with iptables-legacy, the
   * size and a digest of each table against what kpng left. And upstream's
   * canary: the canary chain gone from mangle means iptables was flushed.
   */
  protected override async checkDrift(): Promise<string | undefined> {
    if (!this.mode || this.o.dryRun) return undefined;
    this.stats.driftChecks++;
    const moved = this.mode === 'nft' ? this.watch?.check() : await this.legacyMoved();
    if (moved) return moved;
    for (const family of this.fam.keys()) {
      try {
        await run(this.tool(toolName(family, this.mode, '')), ['-w', '5', '-t', 'mangle', '-n', '-L', KUBE_PROXY_CANARY]);
      } catch (e) {
        // only "no such chain" (exit 1) counts, not a busy lock (exit 4)
        if (e instanceof IptablesError && e.code === 1) return `the canary chain is gone from ${toolName(family, this.mode, '')} (iptables flushed?)`;
      }
    }
    return undefined;
  }

  /** iptables-legacy: which table changed since kpng last wrote (undefined: none) */
  private async legacyMoved(): Promise<string | undefined> {
    const was = this.legacyDigests;
    if (!was) return undefined;
    const now = await this.legacyTableDigests();
    if (!now) return "the tables' contents cannot be read";
    const size = (d: XtablesDigest | undefined) => (d ? `${d.entries} rules, ${d.size} bytes` : 'none');
    for (const [k, d] of now) {
      const before = was.get(k);
      if (before?.digest === d?.digest) continue;
      return `iptables-legacy table ${k} changed: ${size(before) === size(d) ? `other rules of the same size (${size(d)})` : `${size(before)} -> ${size(d)}`}`;
    }
    return undefined;
  }

  /** "family table" -> the digest of each table kpng writes (undefined: no such table); undefined when they cannot be read */
  private async legacyTableDigests(): Promise<Map<string, XtablesDigest | undefined> | undefined> {
    try {
      const out = new Map<string, XtablesDigest | undefined>();
      for (const family of this.fam.keys()) for (const table of TABLES) out.set(`${family === 4 ? 'ip' : 'ip6'} ${table}`, await xtablesDigest(family, table, this.o.netns));
      return out;
    } catch (e) {
      this.warnOnce('xtables-info', `iptables-legacy: the tables cannot be read (${(e as Error).message}); the periodic check reads them back whole`);
      return undefined;
    }
  }

  /** starts the drift watch for this iptables (before a read-back: what changes after it is seen) */
  private startWatch(): void {
    if (this.o.dryRun || this.o.once || this.o.watch === false) return;
    if (this.mode === 'nft') {
      if (!this.watch) {
        const families = new Set<number>([...this.fam.keys()].map((f) => (f === 4 ? 2 : 10)));
        this.watch = new NftWatch({
          ours: (e) => families.has(e.family) && TABLES.includes(e.table) && (e.chain === '' || e.chain.startsWith('KUBE-') || BUILT_IN.has(e.chain)),
          netns: this.o.netns,
          log: this.o.log,
        });
      }
      this.watch.start();
    }
  }

  protected async apply(req: ApplyRequest): Promise<{ changes: number }> {
    const t0 = Date.now();
    await this.start();
    if (req.full && !req.check) {
      this.startWatch();
      await this.adopt();
    }
    this.recompute(req.keys, !req.check);
    let bytes = 0;
    let written = 0;
    let deleted = 0;
    for (const [family, st] of this.fam) {
      const r = this.render(st, req.full ? undefined : st.uncommitted, req.full);
      if (this.o.dryRun) {
        if (!req.check) (this.o.out ?? process.stdout).write(`# ${toolName(family, this.mode!, 'restore')} --noflush -w 5\n${r.filter}${r.nat}${r.mangle}`);
      } else if (req.check) {
        await restore(family, this.mode!, this.tool, r.filter + r.nat + r.mangle, { test: true });
        continue;
      } else {
        // one restore per table: each is atomic (one transaction, for iptables-nft: kpng's own for the drift watch), so what is committed stays known when another fails
        const restoreOf = (input: string) => (this.watch ? this.watch.own(() => restore(family, this.mode!, this.tool, input)) : restore(family, this.mode!, this.tool, input));
        await restoreOf(r.filter);
        st.missingJumps = st.missingJumps.filter((j) => j.table !== 'filter');
        await restoreOf(r.nat);
        if (r.mangle) await restoreOf(r.mangle);
      }
      if (req.check) continue;
      bytes += r.nat.length + r.filter.length + r.mangle.length;
      for (const name of r.write) {
        const rules = st.desired.get(name)!;
        st.committedRules += rules.length - (st.committed.get(name)?.length ?? 0);
        st.committed.set(name, rules);
      }
      for (const name of r.stale) {
        st.committedRules -= st.committed.get(name)?.length ?? 0;
        st.committed.delete(name);
      }
      st.uncommitted.clear();
      st.missingJumps = [];
      written += r.write.length;
      deleted += r.stale.length;
      const ipFamily = family === 4 ? 'IPv4' : 'IPv6';
      metrics.iptablesLast.set({ table: 'nat', ip_family: ipFamily }, r.natRules);
      metrics.iptablesLast.set({ table: 'filter', ip_family: ipFamily }, r.filterRules);
      // the filter table is written in full; nat: its top-level chains, and every service chain
      metrics.iptablesTotal.set({ table: 'filter', ip_family: ipFamily }, r.filterRules);
      metrics.iptablesTotal.set({ table: 'nat', ip_family: ipFamily }, r.natTopRules + st.committedRules);
    }
    if (req.check) return { changes: 0 };
    if (this.mode === 'legacy' && !this.o.dryRun && !this.o.once && this.o.watch !== false) this.legacyDigests = await this.legacyTableDigests();
    this.stats.lastChainsWritten = written;
    this.stats.lastChainsDeleted = deleted;
    this.stats.lastRestoreBytes = bytes;
    this.o.log.debug({ full: req.full, ms: Date.now() - t0, chainsWritten: written, chainsDeleted: deleted, bytes }, 'iptables: synced');
    return { changes: written + deleted };
  }

  protected override onSyncFailed(full: boolean): void {
    metrics.iptablesRestoreFailures.inc({ ip_family: primaryFamily() });
    if (!full) metrics.iptablesPartialRestoreFailures.inc({ ip_family: primaryFamily() });
  }

  /** Reads the kernel's rules back: what a previous kpng (or a failed sync) left. */
  private async adopt(): Promise<void> {
    for (const st of this.fam.values()) {
      const jumps = jumpRules(this.localhostNodePorts(st.family));
      if (this.o.dryRun) {
        st.committed = new Map();
        st.committedRules = 0;
        st.missingJumps = jumps;
        continue;
      }
      let tables;
      try {
        tables = await save(st.family, this.mode!, this.tool);
      } catch (e) {
        // a kernel without IPv6 (or ip6tables): serve IPv4 only rather than fail every sync
        if (st.family === 6 && this.stats.syncs === 0 && this.fam.size > 1) {
          this.o.log.warn({ err: (e as Error).message }, 'iptables: ip6tables does not work here; IPv6 Services are not programmed');
          this.fam.delete(6);
          continue;
        }
        throw e;
      }
      const nat = tables.get('nat')?.chains ?? new Map<string, string[]>();
      st.committed = new Map([...nat].filter(([name]) => isServiceChain(name)));
      st.committedRules = 0;
      for (const rules of st.committed.values()) st.committedRules += rules.length;
      st.missingJumps = jumps.filter((j) => !(tables.get(j.table)?.chains.get(j.from) ?? []).includes(`-A ${j.from} ${j.rule}`));
    }
  }

  /**
   * The restore input of a family. changed: the services whose chains to
   * compare with the committed ones; undefined (a full reconcile) compares all.
   */
  private render(st: FamilyState, changed: Map<string, string[]> | undefined, full: boolean): { filter: string; nat: string; mangle: string; write: string[]; stale: string[]; natRules: number; natTopRules: number; filterRules: number } {
    const desired = st.desired;
    const s = this.staticInputs(st.family);
    const order = (st.order ??= [...st.rules.keys()].sort());
    // per-service chains to write: new or different from the kernel's
    const write: string[] = [];
    const stale: string[] = [];
    const candidates = changed === undefined ? desired.keys() : chainsOf(changed.keys(), st);
    for (const name of candidates) {
      const want = desired.get(name);
      if (!want) continue;
      const have = st.committed.get(name);
      if (!have || !sameRules(have, want)) write.push(name);
    }
    if (changed === undefined) {
      for (const name of st.committed.keys()) if (!desired.has(name)) stale.push(name);
    } else {
      for (const names of changed.values()) for (const name of names) if (!desired.has(name) && st.committed.has(name)) stale.push(name);
    }
    write.sort();
    stale.sort();

    const lines: string[] = [];
    // *filter: written in full every sync
    const fixedFilter = filterFixedRules(s);
    lines.push('*filter');
    const filterChains: string[] = [...FILTER_CHAINS, ...(s.localhostNodePorts ? [KUBE_FIREWALL] : [])];
    if (full) filterChains.push(KUBE_PROXY_CANARY);
    for (const c of filterChains) lines.push(`:${c} - [0:0]`);
    for (const j of st.missingJumps) if (j.table === 'filter') lines.push(`-I ${j.from} 1 ${j.rule}`);
    const perService = (pick: (r: ServiceRules) => string[]) => {
      for (const key of order) {
        const rs = pick(st.rules.get(key)!);
        for (let i = 0; i < rs.length; i++) lines.push(rs[i]);
      }
    };
    perService((r) => r.filterNodePorts);
    perService((r) => r.filterServices);
    perService((r) => r.filterExternal);
    for (const rs of fixedFilter.values()) lines.push(...rs);
    perService((r) => r.filterFirewall);
    lines.push('COMMIT');

    // *nat: the top-level chains in full, changed service chains, stale ones deleted
    lines.push('*nat');
    const natFixed = natFixedChains(s);
    const natChains: string[] = [...NAT_CHAINS, ...write, ...stale];
    if (full) natChains.push(KUBE_PROXY_CANARY);
    for (const c of natChains) lines.push(`:${c} - [0:0]`);
    for (const j of st.missingJumps) if (j.table === 'nat') lines.push(`-I ${j.from} 1 ${j.rule}`);
    for (const rs of natFixed.values()) lines.push(...rs);
    perService((r) => r.natNodePorts);
    perService((r) => r.natServices);
    lines.push(...nodePortJumps(s));
    const serviceChainsStart = lines.length;
    for (const name of write) lines.push(...desired.get(name)!);
    for (const name of stale) lines.push(`-X ${name}`);
    lines.push('COMMIT');
    const natStart = lines.indexOf('*nat');
    const count = (from: number, to: number) => lines.slice(from, to).filter((l) => l.startsWith('-A ')).length;
    const text = (from: number, to: number) => lines.slice(from, to).join('\n') + '\n';
    return {
      filter: text(0, natStart),
      nat: text(natStart, lines.length),
      mangle: full ? `*mangle\n:${KUBE_PROXY_CANARY} - [0:0]\nCOMMIT\n` : '',
      write,
      stale,
      filterRules: count(0, natStart),
      natRules: count(natStart, lines.length),
      natTopRules: count(natStart, serviceChainsStart),
    };
  }

}

function chainsOf(keys: Iterable<string>, st: FamilyState): string[] {
  const out: string[] = [];
  for (const key of keys) for (const name of st.rules.get(key)?.chains.keys() ?? []) out.push(name);
  return out;
}

function interfaceAddresses(): string[] {
  return Object.values(networkInterfaces()).flatMap((l) => (l ?? []).map((a) => a.address.replace(/%.*$/, '')));
}
