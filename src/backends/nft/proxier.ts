// The nftables proxier: recomputes only the Services that changed and
// applies each sync as one atomic transaction of the differences against the
// committed state it keeps in memory (a cold start into an empty node loads
// in chunks, hooked by the last one). The table is read back only for a full
// reconcile: at start-up (adopting what a previous kpng left: nothing is
// flushed, so established connections and affinity survive a restart), after
// a failure, and when the periodic check finds that someone else changed it.
// A cold start into an empty node loads in chunks (freshLoad), their
// elements over netlink where it can (shared/nftables/netlink.ts).
import type { Family } from '../../api/ip.js';
import { ipSetOf } from '../../api/model.js';
import { ipFamily, metrics } from '../../runtime/metrics.js';
import { ProxierBase, type ApplyRequest, type SyncStats } from '../shared/proxier.js';
import { sameRules } from '../shared/chain-rules.js';
import type { DataplaneOptions } from '../shared/backend.js';
import { servicePorts, normalizeCIDRs } from '../shared/service-ports.js';
import { detectLocal, nodePortAddresses, serviceCIDRsOf } from '../shared/node-facts.js';
import { podSourceMatches, singleAddress } from '../shared/nftables/match.js';
import { ElementTable } from '../shared/nftables/elements.js';
import { pooled } from '../../api/compact.js';
import { flat } from '../../runtime/memory.js';
import { portElements, type Element, type LbRequirement, type Slots } from './service-elements.js';
import { BASE_CHAINS } from '../shared/nftables/base-chains.js';
import { TABLE, FAMILIES, setDeclarationList, staticChains, lbChain, affinitySetBody, AFFINITY_PREFIX, AFFINITY_SET, type FamilyNames, type StaticInputs } from './ruleset.js';
import { ProcessNft, SessionNft, type Nft } from '../shared/nftables/nft.js';
import { Transaction, type TableRef } from '../shared/nftables/transaction.js';
import { nftDrift, type DriftSource } from '../shared/nftables/watch.js';
import { nftTenantTables, serviceKeys, type NftTenantTables } from '../shared/nftables/tenants.js';
import { availableParallelism } from 'node:os';
import { LocalhostNodePorts, localhostNodePortFamilies, removeLocalhostTable, LOCALHOST_TABLE } from '../shared/userspace/localhost.js';

export interface NftProxierOptions extends DataplaneOptions {
  /** the nft binary (when nft is not given) */
  readonly nftPath?: string;
  /** how to reach nft (default: the system's; tests give a FakeNft) */
  readonly nft?: Nft;
  /** services per transaction of a cold start's chunked load (default 1500) */
  readonly freshLoadChunk?: number;
  /** transactions at once in a cold start's chunked load (default: 2, or 1 on one core) */
  readonly freshLoadParallel?: number;
  /** small transactions go to a long-lived nft (default: unless once) */
  readonly session?: boolean;
  /**
   * a cold start's chunks of elements go to the kernel over netlink (default:
   * when the nft used is this namespace's, or a netns is given)
   */
  readonly netlink?: boolean;
}

/** What one Service has in one family's table, besides its elements (kept in the element table). */
interface ServiceState {
  /** its slot keys (endpoints map | key), to free them when it changes */
  slots: string[];
  /** the shared lb chains it needs ("kind|proto|n") */
  lb: readonly string[];
  /** ClientIP affinity: its own chains (name -> rules) and per-endpoint sets */
  affinity?: { chains: Map<string, string[]>; sets: string[] };
}

interface FamilyState {
  readonly names: FamilyNames;
  readonly table: TableRef;
  readonly elements: ElementTable;
  slots: Slots;
  readonly services: Map<string, ServiceState>;
  /** the Services with ClientIP affinity, of `services`: a sync's chains and sets come from these, not from every Service */
  readonly affinity: Map<string, NonNullable<ServiceState['affinity']>>;
  /** lb chain -> number of Services needing it */
  readonly lbRefs: Map<string, number>;
  /** chain -> rules, as committed (undefined: content unknown) */
  committedChains: Map<string, readonly string[] | undefined>;
  /** the fixed chains, and the node they were made for (they change with it) */
  fixed?: { node: unknown; chains: ReadonlyMap<string, readonly string[]> };
  committedSets: Set<string>;
  /** the layout changed, or a table whose state is unknown: delete it and build it again */
  rebuild: boolean;
}

export interface ProxierStats extends SyncStats {
  lastElementChanges: number;
  lastTransactionBytes: number;
  /** how the last sync went: one transaction, or a fresh load in chunks */
  lastVia: 'transaction' | 'chunks' | '';
  /** periodic drift checks run (whatever they found) */
  driftChecks: number;
}

/** services per transaction when a cold start loads an empty node in chunks */
const FRESH_LOAD_CHUNK = 1500;
/** a transaction with more element changes than this pauses the drift watch (the kernel's change events cost as much as the load) */
const WATCH_PAUSE_ELEMENTS = 5000;
/** nftables' address families, as change events give them */
const NFPROTO_IPV4: number = 2;
const NFPROTO_IPV6: number = 10;

export class NftProxier extends ProxierBase {
  private readonly fam: Map<Family, FamilyState>;
  private readonly nft: Nft;
  private readonly ownNft: boolean;
  private readonly watch?: DriftSource;
  /** 127.0.0.1 / ::1 NodePorts through the userspace proxy (KEP-6032), when the configuration asks */
  private readonly localhost?: LocalhostNodePorts;
  /** the node's tenants' tables, written in the same transactions (when this backend is their writer) */
  private readonly tenantTables?: NftTenantTables;
  /** the table as committed includes the header (table, sets, fixed chains) */
  private structureKnown = false;
  readonly stats: ProxierStats = { syncs: 0, fullSyncs: 0, failures: 0, lastSyncMs: 0, lastSuccess: 0, repairs: 0, lastElementChanges: 0, lastTransactionBytes: 0, lastVia: '', driftChecks: 0 };

  constructor(private readonly o: NftProxierOptions) {
    super(o, { minSyncPeriodMs: o.config.nftables.minSyncPeriodMs, syncPeriodMs: o.config.nftables.syncPeriodMs });
    this.ownNft = !o.nft;
    const nftOptions = {
      path: o.nftPath,
      parallel: this.parallel,
      // netlink reaches the namespace kpng runs in (or netns): only where the nft used is that one's too
      netlink: !o.dryRun && (o.netlink ?? (o.netns !== undefined || (o.nftPath ?? 'nft') === 'nft')) ? { netns: o.netns } : undefined,
      onNetlinkFallback: (msg: string) => this.warnOnce('nft netlink', msg),
    };
    if (o.nft) this.nft = o.nft;
    else if (!o.dryRun && (o.session ?? !o.once)) {
      const session = new SessionNft({ ...nftOptions, onFallback: (msg) => this.warnOnce('nft session', msg) });
      // now, while this process is small
      session.warm();
      this.nft = session;
    } else this.nft = new ProcessNft(nftOptions);
    this.fam = new Map(
      (o.families ?? [4, 6]).map((f) => {
        const names = FAMILIES[f];
        const st: FamilyState = {
          names,
          table: { family: names.table, name: TABLE },
          elements: new ElementTable(),
          slots: new Map(),
          services: new Map(),
          affinity: new Map(),
          lbRefs: new Map(),
          committedChains: new Map(),
          committedSets: new Set(),
          rebuild: false,
        };
        return [f, st];
      }),
    );
    const lhFamilies = localhostNodePortFamilies(o.config).filter((f) => this.fam.has(f));
    if (lhFamilies.length && !o.dryRun) this.localhost = new LocalhostNodePorts({ log: o.log, nft: new ProcessNft({ path: o.nftPath }), families: lhFamilies, udpIdleMs: o.config.udpIdleTimeoutMs });
    this.tenantTables = nftTenantTables({ ...o, nft: this.nft, reservedMark: 1 << o.config.nftables.masqueradeBit, changed: (key) => this.otherChanged(key) });
    if (!o.dryRun && (o.watch ?? !o.once)) {
      const families = new Set([...this.fam.values()].map((st) => (st.names.table === 'ip' ? NFPROTO_IPV4 : NFPROTO_IPV6)));
      const tenants = this.tenantTables;
      this.watch = nftDrift(this.nft, { ours: (e) => (e.table === TABLE && families.has(e.family)) || !!tenants?.ours(e), netns: o.netns, log: o.log });
    }
  }

  private get chunk(): number {
    return this.o.freshLoadChunk ?? FRESH_LOAD_CHUNK;
  }

  private get parallel(): number {
    return Math.max(1, this.o.freshLoadParallel ?? Math.min(2, availableParallelism()));
  }

  // --- computing

  private staticInputs(f: FamilyNames): StaticInputs {
    const c = this.o.config;
    const mark = `0x${(1 << c.nftables.masqueradeBit).toString(16)}`;
    const { podSource, notPodSource } = podSourceMatches(detectLocal(c, this.node, f.family, (id, msg) => this.warnOnce(id, msg)), f.ip);
    return { mark, masqueradeAll: c.nftables.masqueradeAll || c.iptables.masqueradeAll, podSource, notPodSource, nodePortsOnAllAddresses: this.nodePortAddresses(f.family) === 'all' };
  }

  /** 'all', or the addresses/CIDRs (interval set elements) NodePorts are served on */
  private nodePortAddresses(family: Family): 'all' | string[] {
    const c = this.o.config;
    const np = nodePortAddresses(c.nodePortAddresses.length ? c.nodePortAddresses : ['primary'], this.node, family);
    if (np.localhost && !this.localhost) this.warnOnce('localhost-np', 'nodePortAddresses "localhost": NodePorts on 127.0.0.1 are not served by the nftables backend (the feature gate KubeProxyNFTablesLocalhostNodePorts is off)');
    if (np.all) return 'all';
    if (np.unknownNode) {
      this.warnOnce(`primary-${family}`, 'nodePortAddresses "primary": the Node is not known yet; serving NodePorts on every local address until it is');
      return 'all';
    }
    return normalizeCIDRs([...np.primary.map((ip) => `${ip}/${family === 4 ? 32 : 128}`), ...np.cidrs]).map(singleAddress);
  }

  /** The node's and the ServiceCIDRs' elements, when they changed; the Services to recompute with them. */
  private nodeKeys(keys: readonly string[]): string[] {
    if (!this.nodeDirty && !this.cidrsDirty) return [...keys];
    for (const [family, st] of this.fam) {
      if (this.nodeDirty) {
        const np = this.nodePortAddresses(family);
        st.elements.setOwner('node', np === 'all' ? [] : np.map((key) => ({ set: 'nodeport-addresses', key, value: '', comment: '', owner: '' })));
      }
      if (this.cidrsDirty) st.elements.setOwner('service-cidrs', serviceCIDRsOf(this.cidrs.values(), family).map((c) => ({ set: 'service-cidrs', key: singleAddress(c), value: '', comment: '', owner: '' })));
    }
    if (!this.nodeDirty) return [...keys];
    // a source range covering the node changes with the node's IPs
    const out = new Set(keys);
    for (const [k, s] of this.services) if (s.IPFilters.length) out.add(k);
    return [...out];
  }

  /** Brings the desired state up to date for these Services (flows: note the UDP flows to clean). */
  private recompute(keys: readonly string[], flows: boolean): void {
    this.trackServices(keys);
    for (const [family, st] of this.fam) {
      const node = { nodeIPs: ipSetOf(this.node?.IPs, family) };
      for (const key of keys) {
        const owner = ownerOf(key);
        const svc = this.serviceOf(key);
        const ports = svc ? servicePorts(svc, this.endpointsOf(key), family) : [];
        const before = st.services.get(owner);
        // nothing in this family, now or before (a single-stack service): nothing to do
        if (!ports.length && !before && !st.elements.hasOwner(owner)) continue;
        let elements: Element[] = [];
        const lb: string[] = [];
        let affinity: ServiceState['affinity'];
        const nextSlots: Slots = new Map();
        for (const sp of ports) {
          const pe = portElements(sp, node, st.slots, nextSlots);
          if (ports.length === 1) elements = pe.elements;
          else elements.push(...pe.elements);
          for (const r of pe.lbChains) {
            const k = lbKey(r);
            if (!lb.includes(k)) lb.push(k);
          }
          if (pe.affinitySets.length) {
            affinity ??= { chains: new Map(), sets: [] };
            for (const [name, rules] of pe.affinityChains) affinity.chains.set(name, rules);
            affinity.sets.push(...pe.affinitySets);
          }
        }
        st.elements.setOwner(owner, elements);
        for (const k of before?.slots ?? []) st.slots.delete(k);
        for (const [k, v] of nextSlots) st.slots.set(k, v);
        // shared lb chains, refcounted
        const lbBefore = before?.lb ?? [];
        if (lbBefore.length !== lb.length || lbBefore.some((n, i) => n !== lb[i])) {
          for (const n of lbBefore) st.lbRefs.set(n, (st.lbRefs.get(n) ?? 1) - 1);
          for (const n of lb) st.lbRefs.set(n, (st.lbRefs.get(n) ?? 0) + 1);
        }
        if (ports.length || elements.length) st.services.set(owner, { slots: [...nextSlots.keys()], lb: sharedList(lb), affinity });
        else st.services.delete(owner);
        if (affinity && (ports.length || elements.length)) st.affinity.set(owner, affinity);
        else st.affinity.delete(owner);
        const stale = this.staleFlows.update(family, owner, ports);
        if (flows) this.pendingFlows.push(...stale);
      }
      for (const c of st.elements.conflicts) this.warnOnce(`conflict ${family} ${c}`, `two services want the same nftables element (${c}); the first one (by name) wins`);
    }
  }

  /**
   * chain -> rules this family needs now. The lists are the same objects
   * from one sync to the next while their rules are (the fixed chains are
   * made again only when the node changes): a sync's comparison with what
   * is committed is then one identity check per chain.
   */
  private desiredChains(st: FamilyState): Map<string, readonly string[]> {
    if (!st.fixed || st.fixed.node !== this.node) st.fixed = { node: this.node, chains: staticChains(st.names, this.staticInputs(st.names)) };
    const out = new Map<string, readonly string[]>(st.fixed.chains);
    for (const [k, refs] of st.lbRefs) {
      if (refs <= 0) continue;
      const [kind, proto, n] = k.split('|');
      const [name, rules] = lbChain(st.names, kind as LbRequirement['kind'], proto as LbRequirement['proto'], Number(n));
      out.set(name, rules);
    }
    for (const a of st.affinity.values()) for (const [name, rules] of a.chains) out.set(name, rules);
    return out;
  }

  /** the per-endpoint affinity sets this family needs now */
  private desiredAffinitySets(st: FamilyState): Set<string> {
    const out = new Set<string>();
    for (const a of st.affinity.values()) for (const name of a.sets) out.add(name);
    return out;
  }

  // --- applying

  protected async apply(req: ApplyRequest): Promise<{ changes: number }> {
    // tenants' keys go to the tenants' tables, the Services' to kpng's own
    const own = this.tenantTables ? { ...req, keys: serviceKeys(req.keys) } : req;
    const r = await this.applyTables(own, req.keys);
    if (!this.localhost && req.full && !req.check && !this.o.dryRun && this.ownNft) await removeLocalhostTable(this.nft, this.o.nftPath);
    if (this.localhost && !req.check) {
      for (const key of own.keys) {
        const svc = this.serviceOf(key);
        this.localhost.set(key, svc ? this.localhost.families.flatMap((f) => servicePorts(svc, this.endpointsOf(key), f)) : []);
      }
      await this.localhost.apply();
    }
    return r;
  }

  /** kpng's tables for req.keys (the Services' keys), the tenants' for allKeys (theirs among them) */
  private async applyTables(req: ApplyRequest, allKeys: readonly string[]): Promise<{ changes: number }> {
    const t0 = Date.now();
    if (req.full && !req.check) await this.adopt();
    const keys = this.nodeKeys(req.keys);
    const tenants = await this.tenantTables?.sync({ keys: allKeys, full: req.full, check: req.check }, (k) => this.isHeldBack(k));
    const fresh = req.full && !req.check && !this.o.dryRun && [...this.fam.values()].every((st) => st.committedChains.size === 0);
    if (fresh && keys.length > this.chunk) {
      const r = await this.freshLoad(keys);
      this.stats.lastVia = 'chunks';
      this.warmUp(keys[0]);
      // a cold start's chunks are kpng's alone; the tenants' tables come right after
      if (tenants) (await this.transact(tenants.tx), tenants.commit());
      return this.done(r, true, t0);
    }
    this.recompute(keys, !req.check);
    const computed = Date.now();
    // a check must stand on its own: with the table's declarations, in case the table is not there
    const header = req.check || req.full || !this.structureKnown;
    const tx = this.render({ header, baseChains: header, elements: true });
    if (tenants) tx.tx.append(tenants.tx);
    const text = tx.tx.render();
    if (!req.check) {
      metrics.stageDuration.observe({ stage: 'compute' }, (computed - t0) / 1000);
      metrics.stageDuration.observe({ stage: 'render' }, (Date.now() - computed) / 1000);
    }
    if (this.o.dryRun) {
      if (!req.check && text) (this.o.out ?? process.stdout).write(text);
    } else if (req.check) {
      await this.nft.run(tx.tx, { check: true });
      return { changes: tx.tx.elementCount };
    } else {
      const applyStart = Date.now();
      await this.transact(tx.tx);
      metrics.stageDuration.observe({ stage: 'apply' }, (Date.now() - applyStart) / 1000);
    }
    if (req.check) return { changes: tx.tx.elementCount };
    tx.commit();
    tenants?.commit();
    if (header) this.structureKnown = true;
    this.stats.lastVia = 'transaction';
    if (req.full && !this.o.dryRun) await this.deleteUnusedChains();
    return this.done({ bytes: text.length, elementChanges: tx.tx.elementCount }, req.full, t0);
  }

  /**
   * One Service computed again the way a change is, with nothing to apply:
   * the code a cold start made fast for loading in bulk is made again for a
   * single change here, not when the first change waits for it (it would
   * take several times as long as the changes after it).
   */
  private warmUp(key: string): void {
    this.recompute([key], false);
    const tx = this.render({ header: false, baseChains: false, elements: true });
    // nothing changed, as it should be: otherwise the next sync applies it
    if (tx.tx.empty) tx.commit();
  }

  private done(r: { bytes: number; elementChanges: number }, full: boolean, t0: number): { changes: number } {
    this.o.log.debug({ full, ms: Date.now() - t0, elementChanges: r.elementChanges, bytes: r.bytes }, 'nft: synced');
    for (const st of this.fam.values()) st.rebuild = false;
    this.stats.lastElementChanges = r.elementChanges;
    this.stats.lastTransactionBytes = r.bytes;
    metrics.elementChanges.inc(r.elementChanges);
    return { changes: r.elementChanges };
  }

  /** one transaction; a big one with the drift watch paused (the kernel's change events would cost as much as the load) */
  private async transact(tx: Transaction): Promise<void> {
    if (tx.empty) return;
    if (tx.elementCount <= WATCH_PAUSE_ELEMENTS || !this.watch) return void (await this.nft.run(tx));
    this.watch.pause();
    let ok = 0;
    try {
      await this.nft.run(tx);
      ok = 1;
    } finally {
      this.watch.resume(ok);
    }
  }

  override async close(): Promise<void> {
    await super.close();
    this.tenantTables?.close();
    await this.localhost?.close();
    this.watch?.close();
    if (this.ownNft) this.nft.close();
  }

  /**
   * A cold start on a node without kpng's tables: the maps, sets and regular
   * chains are created and filled in chunks, `freshLoadParallel`
   * transactions at once (nft's parsing is most of a big load, and it runs
   * on every core) while the next chunk is computed; none of it touches a
   * packet until the last transaction hooks the base chains, so packets see
   * no kpng, then all of it. The table is empty, so a chunk is only adds:
   * no diff, and the committed state is the desired one at the end.
   */
  private async freshLoad(keys: readonly string[]): Promise<{ bytes: number; elementChanges: number }> {
    let bytes = 0;
    let elementChanges = 0;
    let transactions = 0;
    const apply = async (...txs: Transaction[]) => {
      for (const tx of txs) {
        if (tx.empty) continue;
        bytes += (await this.nft.run(tx, { bulk: true })) ?? tx.render().length;
        transactions++;
      }
    };
    /** the elements that count of these owners, as adds; those of interval sets in a second transaction (only the first can go over netlink) */
    const adds = (owners: (st: FamilyState) => Iterable<string>): [Transaction, Transaction] => {
      const plain = new Transaction();
      const ranges = new Transaction();
      for (const st of this.fam.values()) {
        const list: Element[] = [];
        const rangeList: Element[] = [];
        for (const owner of owners(st)) for (const e of st.elements.winnersOf(owner)) (INTERVAL_SETS.has(e.set) ? rangeList : list).push(e);
        plain.elements('add', st.table, list);
        ranges.elements('add', st.table, rangeList);
      }
      elementChanges += plain.elementCount + ranges.elementCount;
      return [plain, ranges];
    };
    // in name order, the owner that counts for a key (the first by name) is the first to load it
    const sorted = [...keys].sort();
    this.watch?.pause();
    try {
      const header = this.render({ header: true, baseChains: false, elements: false });
      // with the elements of owners not loaded below (the node's, the ServiceCIDRs')
      const reloaded = new Set(sorted.map(ownerOf));
      const [plain, ranges] = adds((st) => [...st.elements.owners()].filter((o) => !reloaded.has(o)));
      await apply(header.tx.append(plain).append(ranges));
      header.commit();
      let failure: unknown;
      const running = new Set<Promise<void>>();
      for (let i = 0; i < sorted.length && !failure; i += this.chunk) {
        const chunk = sorted.slice(i, i + this.chunk);
        this.recompute(chunk, true);
        // chains the elements point to go in first, on their own (a few lines)
        const structure = this.render({ header: false, baseChains: false, elements: false });
        await apply(structure.tx);
        structure.commit();
        if (failure) break;
        const owners = chunk.map(ownerOf);
        // nft starts now, while the next chunk is computed
        const p: Promise<void> = apply(...adds(() => owners))
          .catch((e) => void (failure ??= e))
          .finally(() => running.delete(p));
        running.add(p);
        while (running.size >= this.parallel) await Promise.race(running);
      }
      await Promise.all(running);
      if (failure) throw failure;
      for (const st of this.fam.values()) st.elements.commit();
      const hooks = this.render({ header: false, baseChains: true, elements: true });
      await apply(hooks.tx);
      hooks.commit();
      this.structureKnown = true;
      return { bytes, elementChanges: elementChanges + hooks.tx.elementCount };
    } finally {
      this.watch?.resume(transactions);
    }
  }

  /** Reads the kernel's tables back: what a previous kpng (or a failed sync) left. */
  private async adopt(): Promise<void> {
    this.watch?.start();
    this.structureKnown = false;
    await this.tenantTables?.adopt();
    for (const st of this.fam.values()) {
      const listing = this.o.dryRun || st.rebuild ? undefined : await this.nft.list(st.table.family, TABLE);
      if (!listing) {
        st.elements.adopt(new Map());
        st.committedChains = new Map();
        st.committedSets = new Set();
        continue;
      }
      // the clients in affinity sets are the kernel's to keep, not elements to reconcile
      for (const name of listing.elements.keys()) if (name.startsWith(AFFINITY_PREFIX)) listing.elements.delete(name);
      st.elements.adopt(listing.elements);
      st.committedChains = new Map([...listing.chains].map((c) => [c, undefined]));
      st.committedSets = new Set(listing.sets.keys());
    }
  }

  /**
   * A transaction for every family: with `header`, the table and every set
   * and map (re-)declared; chains whose rules changed (base chains only with
   * `baseChains`), then element differences; commit() records it as applied.
   */
  private render(what: { header: boolean; baseChains: boolean; elements: boolean }): { tx: Transaction; commit(): void } {
    const structure = new Transaction();
    const elements = new Transaction();
    const commits: (() => void)[] = [];
    for (const st of this.fam.values()) {
      const table = st.table;
      const desired = this.desiredChains(st);
      const committed = st.committedChains;
      if (what.header) {
        if (st.rebuild) structure.add({ kind: 'table', ...table }).delete({ kind: 'table', ...table });
        structure.add({ kind: 'table', ...table, comment: 'rules for kpng' });
      }
      if (what.baseChains) for (const [name, hook] of Object.entries(BASE_CHAINS)) if (!committed.has(name) || what.header) structure.add({ kind: 'chain', table, name, hook });
      // sets and maps first: chains refer to them
      const newSets: string[] = [];
      for (const [name, d] of setDeclarationList(st.names)) {
        if (what.header || !st.committedSets.has(name)) (structure.add({ kind: d.kind, table, name, body: d.body }), newSets.push(name));
      }
      const affinitySets = this.desiredAffinitySets(st);
      for (const name of affinitySets) if (what.header || !st.committedSets.has(name)) (structure.add({ kind: 'set', table, name, body: affinitySetBody(st.names) }), newSets.push(name));
      // chains: declare all new ones before any rule (rules jump between them)
      const changed: string[] = [];
      for (const [name, rules] of desired) {
        const base = name in BASE_CHAINS;
        if (base && !what.baseChains) continue;
        const have = committed.get(name);
        if (have && sameRules(have, rules)) continue;
        if (!base && (!committed.has(name) || what.header)) structure.add({ kind: 'chain', table, name });
        changed.push(name);
      }
      for (const name of changed) {
        if (committed.has(name)) structure.flush({ kind: 'chain', table, name });
        for (const rule of desired.get(name)!) structure.add({ kind: 'rule', table, chain: name, rule });
      }
      // elements: deletes, then adds (a changed value is both)
      const diff = what.elements ? st.elements.diff() : { deletes: [], adds: [] };
      elements.elements('delete', table, diff.deletes).elements('add', table, diff.adds);
      // affinity chains and sets no Service needs any more: once nothing points to them
      const goneChains = what.elements ? [...committed.keys()].filter((c) => c.startsWith(AFFINITY_PREFIX) && !desired.has(c)) : [];
      const goneSets = what.elements ? [...st.committedSets].filter((n) => AFFINITY_SET.test(n) && !affinitySets.has(n)) : [];
      for (const name of goneChains) elements.flush({ kind: 'chain', table, name });
      for (const name of goneChains) elements.delete({ kind: 'chain', table, name });
      for (const name of goneSets) elements.delete({ kind: 'set', table, name, body: '' });
      commits.push(() => {
        if (what.elements) st.elements.commit();
        for (const name of changed) committed.set(name, desired.get(name)!);
        for (const name of newSets) st.committedSets.add(name);
        for (const c of goneChains) committed.delete(c);
        for (const n of goneSets) st.committedSets.delete(n);
      });
    }
    return { tx: structure.append(elements), commit: () => commits.forEach((c) => c()) };
  }

  /** chains no element or rule points to any more (after a reconcile) */
  private async deleteUnusedChains(): Promise<void> {
    for (const st of this.fam.values()) {
      const table = st.table;
      const desired = this.desiredChains(st);
      const unused = [...st.committedChains.keys()].filter((c) => !desired.has(c) && !(c in BASE_CHAINS));
      // and affinity sets no chain uses (e.g. an earlier kpng's per-slot sets)
      const affinitySets = this.desiredAffinitySets(st);
      const unusedSets = [...st.committedSets].filter((n) => n.startsWith(AFFINITY_PREFIX) && !affinitySets.has(n));
      if (!unused.length && !unusedSets.length) continue;
      const tx = new Transaction();
      for (const name of unused) tx.flush({ kind: 'chain', table, name });
      for (const name of unused) tx.delete({ kind: 'chain', table, name });
      for (const name of unusedSets) tx.delete({ kind: 'set', table, name, body: '' });
      try {
        await this.nft.run(tx);
        for (const c of unused) st.committedChains.delete(c);
        for (const n of unusedSets) st.committedSets.delete(n);
      } catch (e) {
        metrics.nftablesCleanupFailures.inc({ ip_family: st.names.family === 4 ? 'IPv4' : 'IPv6' });
        this.o.log.debug({ err: (e as Error).message }, 'nft: unused chains stay for now');
      }
    }
  }

  /** a tenant's content the kernel refuses: the tenant goes back to its last good content */
  protected override onRefused(key: string, why: string): boolean {
    return !!this.tenantTables?.refused(key, why);
  }

  /** a full sync failed and no Service was to blame: the next one builds the tables again */
  protected override onSyncFailed(full: boolean): void {
    metrics.nftablesSyncFailures.inc({ ip_family: ipFamily() });
    if (full) for (const st of this.fam.values()) st.rebuild = true;
  }

  /** the drift check: nftables' change events say whether anyone else touched kpng's tables */
  protected override async checkDrift(): Promise<string | undefined> {
    this.stats.driftChecks++;
    const why = this.watch?.check();
    if (why || !this.localhost) return why;
    // the localhost NodePorts' table is not watched (another table): it is checked for being there
    return (await this.localhost.present()) ? undefined : `the table inet ${LOCALHOST_TABLE} is gone`;
  }

  /** what is programmed, for introspection and tests */
  desiredElements(family: Family, set: string) {
    return this.fam.get(family)!.elements.desiredElements(set);
  }
}

/** sets of intervals (their elements go to nft as text) */
const INTERVAL_SETS = new Set(
  setDeclarationList(FAMILIES[4])
    .filter(([, d]) => d.body.includes('interval'))
    .map(([name]) => name),
);

/** the element owner of a service */
function ownerOf(key: string): string {
  return `svc:${key}`;
}

// Lists of lb chains, one copy each: most Services need the same one or two
// (a list built by push keeps room for 16 more: 184 bytes per Service).
const lists = new Map<string, readonly string[]>();
function sharedList(xs: string[]): readonly string[] {
  const id = xs.join('\n');
  let l = lists.get(id);
  if (!l) lists.set(id, (l = Object.freeze(xs.slice())));
  return l;
}

function lbKey(r: LbRequirement): string {
  return pooled(flat(r.kind, '|', r.proto, '|', r.n));
}

/** interval set elements: nft lists a /32 (/128) as the bare address */

