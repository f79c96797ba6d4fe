// The nftables proxier: keeps the node-local state from the diff stream,
// recomputes only the services that changed, and applies each sync as one
// atomic nft transaction of the differences against the committed state it
// keeps in memory. A full reconcile (reading the table back) happens only at
// start-up, adopting what a previous kpng left (nothing is flushed, so
// established connections and affinity survive a restart), and after a
// failure.
import type { Family } from '../../api/ip.js';
import { parseCIDR } from '../../api/ip.js';
import { ipSetOf } from '../../api/model.js';
import { metrics } from '../shared/metrics.js';
import { ProxierBase, parseFlow, sameRules, type ProxierBaseOptions, type SyncStats } from '../shared/proxier.js';
import type { KubeProxyConfiguration } from '../shared/config.js';
import { servicePorts, normalizeCIDRs } from '../shared/service-ports.js';
import type { StaleFlow } from '../shared/conntrack.js';
import { ElementTable, type ElementDiff } from './elements.js';
import { portElements, type Element, type LbRequirement, type Slots, type UdpFlow } from './service-elements.js';
import {
  TABLE,
  FAMILIES,
  BASE_CHAINS,
  setDeclarations,
  staticChains,
  lbChains,
  affinitySetBody,
  AFFINITY_PREFIX,
  AFFINITY_SET,
  type FamilyNames,
  type StaticInputs,
} from './ruleset.js';
import { runNft, listTable, NftError, NftSession } from './nft.js';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir, availableParallelism } from 'node:os';
import { join } from 'node:path';

export interface NftProxierOptions extends ProxierBaseOptions {
  readonly nodeName: string;
  readonly config: KubeProxyConfiguration;
  readonly nftPath?: string;
  /** where --dry-run prints */
  readonly out?: NodeJS.WritableStream;
  readonly families?: readonly Family[];
  /** services per transaction of a cold start's chunked load (default 1500) */
  readonly freshLoadChunk?: number;
  /** nft processes at once in a cold start's chunked load (default: 2, or 1 on one core) */
  readonly freshLoadParallel?: number;
  /** small transactions go to a long-lived nft (default: unless once) */
  readonly session?: boolean;
}

interface FamilyState {
  readonly names: FamilyNames;
  readonly elements: ElementTable;
  slots: Slots;
  /** slot keys each owner uses, to drop them when it goes away */
  readonly ownerSlots: Map<string, string[]>;
  readonly ownerLb: Map<string, string[]>;
  readonly ownerUdp: Map<string, Set<string>>;
  readonly ownerUdpVips: Map<string, Set<string>>;
  /** lb chain -> number of owners needing it */
  readonly lbRefs: Map<string, number>;
  /** ClientIP affinity chains and sets, by owner (only services with affinity have any) */
  readonly ownerAffinity: Map<string, { chains: Map<string, string[]>; sets: string[] }>;
  /** chain -> rules, as committed (undefined: content unknown) */
  committedChains: Map<string, string[] | undefined>;
  committedSets: Set<string>;
  /** set the layout changed: rebuild this family's table */
  rebuild: boolean;
}

export interface ProxierStats extends SyncStats {
  lastElementChanges: number;
  lastTransactionBytes: number;
  /** how the last sync went to nft: the long-lived session, a process of its own, or a fresh load in chunks */
  lastVia: 'session' | 'process' | 'chunks' | '';
}

const MAX_ELEMENTS_PER_COMMAND = 2000;
/** transactions up to this size go to the long-lived nft; bigger ones to a fresh `nft -f` (their cost is nft's parsing anyway) */
const SESSION_MAX_BYTES = 128 * 1024;
/** services per transaction when a cold start loads an empty node in chunks */
const FRESH_LOAD_CHUNK = 1500;

export class NftProxier extends ProxierBase {
  private readonly fam: Map<Family, FamilyState>;
  private readonly session?: NftSession;
  private sessionsUsable = true;
  readonly stats: ProxierStats = { syncs: 0, fullSyncs: 0, failures: 0, lastSyncMs: 0, lastSuccess: 0, lastElementChanges: 0, lastTransactionBytes: 0, lastVia: '' };

  constructor(private readonly o: NftProxierOptions) {
    super(o, () => ({ minSyncPeriodMs: o.config.nftables.minSyncPeriodMs, syncPeriodMs: o.config.nftables.syncPeriodMs }));
    if (!o.dryRun && (o.session ?? !o.once)) this.session = new NftSession(o.nftPath);
    this.fam = new Map(
      (o.families ?? [4, 6]).map((f) => [
        f,
        {
          names: FAMILIES[f],
          elements: new ElementTable(),
          slots: new Map(),
          ownerSlots: new Map(),
          ownerLb: new Map(),
          ownerUdp: new Map(),
          ownerUdpVips: new Map(),
          lbRefs: new Map(),
          ownerAffinity: new Map(),
          committedChains: new Map(),
          committedSets: new Set(),
          rebuild: false,
        } satisfies FamilyState,
      ]),
    );
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
    const ip = f.ip;
    let podSource: string | undefined;
    let notPodSource: string | undefined;
    const cidrMatch = (cidrs: readonly string[]) => {
      const mine = cidrs.filter((x) => parseCIDR(x)?.family === f.family);
      if (!mine.length) return;
      const set = mine.length === 1 ? mine[0] : `{ ${mine.join(', ')} }`;
      podSource = `${ip} saddr ${set}`;
      notPodSource = `${ip} saddr != ${set}`;
    };
    switch (c.detectLocalMode) {
      case 'ClusterCIDR':
        cidrMatch(c.clusterCIDRs);
        break;
      case 'NodeCIDR':
        cidrMatch(this.node?.PodCIDRs ?? []);
        if (!podSource) this.warnOnce('nodecidr', 'detectLocalMode NodeCIDR: the node has no pod CIDR yet; pod traffic cannot be told apart');
        break;
      case 'BridgeInterface':
        podSource = `iifname "${c.detectLocal.bridgeInterface}"`;
        notPodSource = `iifname != "${c.detectLocal.bridgeInterface}"`;
        break;
      case 'InterfaceNamePrefix':
        podSource = `iifname "${c.detectLocal.interfaceNamePrefix}*"`;
        notPodSource = `iifname != "${c.detectLocal.interfaceNamePrefix}*"`;
        break;
    }
    return { mark, masqueradeAll: c.nftables.masqueradeAll || c.iptables.masqueradeAll, podSource, notPodSource, nodePortsOnAllAddresses: this.nodePortAddresses(f.family) === 'all' };
  }

  /** 'all', or the addresses/CIDRs (interval set elements) NodePorts are served on */
  private nodePortAddresses(family: Family): 'all' | string[] {
    const list = this.o.config.nodePortAddresses.length ? this.o.config.nodePortAddresses : ['primary'];
    if (list.includes('all')) return 'all';
    if (list.includes('localhost')) this.warnOnce('localhost-np', 'nodePortAddresses "localhost": NodePorts on 127.0.0.1 are not served by the nftables backend');
    const out: string[] = [];
    for (const a of list) {
      if (a === 'primary') {
        const ips = ipSetOf(this.node?.IPs, family);
        if (!ips.length && this.node === undefined) {
          this.warnOnce(`primary-${family}`, 'nodePortAddresses "primary": the Node is not known yet; serving NodePorts on every local address until it is');
          return 'all';
        }
        out.push(...ips.map((ip) => `${ip}/${family === 4 ? 32 : 128}`));
      } else if (a !== 'localhost' && parseCIDR(a)?.family === family) out.push(a);
    }
    return normalizeCIDRs(out).map(singleAddress);
  }

  /**
   * The service keys to recompute; brings the node's and the ServiceCIDRs'
   * elements up to date on the way.
   */
  private prepareRecompute(): string[] {
    for (const [family, st] of this.fam) {
      if (this.nodeDirty) {
        const np = this.nodePortAddresses(family);
        st.elements.setOwner('node', np === 'all' ? [] : np.map((key) => ({ set: 'nodeport-addresses', key, value: '', comment: '', owner: '' })));
      }
      if (this.cidrsDirty) {
        const list = normalizeCIDRs([...this.cidrs.values()].flatMap((c) => c.CIDRs).filter((c) => parseCIDR(c)?.family === family));
        st.elements.setOwner('service-cidrs', list.map((c) => ({ set: 'service-cidrs', key: singleAddress(c), value: '', comment: '', owner: '' })));
      }
    }
    // a source range covering the node changes with the node's IPs
    const keys = new Set(this.dirty);
    if (this.nodeDirty) for (const s of this.services.values()) if (s.IPFilters.length) keys.add(`${s.Namespace}/${s.Name}`);
    this.dirty = new Set();
    this.nodeDirty = this.cidrsDirty = false;
    return [...keys];
  }

  /** brings the desired state up to date for these services; returns the UDP flows to clean */
  private recomputeKeys(keys: readonly string[]): StaleFlow[] {
    const flows: StaleFlow[] = [];
    this.trackServices(keys);
    for (const [family, st] of this.fam) {
      const node = { nodeIPs: ipSetOf(this.node?.IPs, family) };
      for (const key of keys) {
        const owner = ownerOf(key);
        const svc = this.services.get(key);
        const ports = svc ? servicePorts(svc, this.endpoints.get(key)?.values() ?? [], family) : [];
        // nothing in this family, now or before (a single-stack service): nothing to do
        if (!ports.length && !st.elements.hasOwner(owner) && !st.ownerSlots.has(owner) && !st.ownerLb.has(owner) && !st.ownerUdp.has(owner) && !st.ownerUdpVips.has(owner) && !st.ownerAffinity.has(owner)) continue;
        let elements: Element[] = [];
        const lbNames: string[] = [];
        let udp: Set<string> | undefined;
        let udpVips: Set<string> | undefined;
        let affinity: { chains: Map<string, string[]>; sets: string[] } | undefined;
        const nextSlots: Slots = new Map();
        for (const sp of ports) {
          const pe = portElements(sp, node, st.slots, nextSlots);
          if (ports.length === 1) elements = pe.elements;
          else elements.push(...pe.elements);
          for (const r of pe.lbChains) {
            const k = lbKey(r);
            if (!lbNames.includes(k)) lbNames.push(k);
          }
          if (pe.affinitySets.length) {
            affinity ??= { chains: new Map(), sets: [] };
            for (const [name, rules] of pe.affinityChains) affinity.chains.set(name, rules);
            affinity.sets.push(...pe.affinitySets);
          }
          for (const u of pe.udpFlows) (udp ??= new Set()).add(flowKey(u));
          for (const u of pe.udpWithEndpoints) (udpVips ??= new Set()).add(flowKey(u));
        }
        st.elements.setOwner(owner, elements);
        // slots
        const slotsBefore = st.ownerSlots.get(owner);
        if (slotsBefore) for (const k of slotsBefore) st.slots.delete(k);
        for (const [k, v] of nextSlots) st.slots.set(k, v);
        if (nextSlots.size) st.ownerSlots.set(owner, [...nextSlots.keys()]);
        else if (slotsBefore) st.ownerSlots.delete(owner);
        // shared lb chains, refcounted
        const lbBefore = st.ownerLb.get(owner);
        if (!lbBefore || lbBefore.length !== lbNames.length || lbBefore.some((n, i) => n !== lbNames[i])) {
          if (lbBefore) for (const n of lbBefore) st.lbRefs.set(n, (st.lbRefs.get(n) ?? 1) - 1);
          for (const n of lbNames) st.lbRefs.set(n, (st.lbRefs.get(n) ?? 0) + 1);
          if (lbNames.length) st.ownerLb.set(owner, lbNames);
          else st.ownerLb.delete(owner);
        }
        if (affinity) st.ownerAffinity.set(owner, affinity);
        else st.ownerAffinity.delete(owner);
        // UDP flows gone (conntrack cleanup), and service IPs getting endpoints
        const before = st.ownerUdp.get(owner);
        if (before) for (const k of before) if (!udp?.has(k)) flows.push(parseFlow(family, k));
        const vipsBefore = st.ownerUdpVips.get(owner);
        if (udpVips) for (const k of udpVips) if (!vipsBefore?.has(k) && !k.startsWith('|')) flows.push(parseFlow(family, k));
        if (udp) st.ownerUdp.set(owner, udp);
        else if (before) st.ownerUdp.delete(owner);
        if (udpVips) st.ownerUdpVips.set(owner, udpVips);
        else if (vipsBefore) st.ownerUdpVips.delete(owner);
      }
      for (const c of st.elements.conflicts) this.warnOnce(`conflict ${family} ${c}`, `two services want the same nftables element (${c}); the first one (by name) wins`);
    }
    return flows;
  }

  /** chain -> rules this family needs now */
  private desiredChains(st: FamilyState): Map<string, string[]> {
    const out = staticChains(st.names, this.staticInputs(st.names));
    for (const [k, refs] of st.lbRefs) {
      if (refs <= 0) continue;
      const [kind, proto, n] = k.split('|');
      for (const [name, rules] of lbChains(st.names, kind as LbRequirement['kind'], proto as LbRequirement['proto'], Number(n))) out.set(name, rules);
    }
    for (const a of st.ownerAffinity.values()) for (const [name, rules] of a.chains) out.set(name, rules);
    return out;
  }

  /** the per-endpoint affinity sets this family needs now */
  private desiredAffinitySets(st: FamilyState): Set<string> {
    const out = new Set<string>();
    for (const a of st.ownerAffinity.values()) for (const name of a.sets) out.add(name);
    return out;
  }

  // --- applying

  protected async syncNow(): Promise<void> {
    this.cancelRetry();
    const t0 = Date.now();
    const full = this.needReconcile;
    let keys = this.prepareRecompute();
    let bytes = 0;
    let elementChanges = 0;
    try {
      if (full) await this.adopt();
      const fresh = full && !this.o.dryRun && [...this.fam.values()].every((st) => st.committedChains.size === 0);
      if (fresh && keys.length > this.chunk) {
        this.stats.lastVia = 'chunks';
        ({ bytes, elementChanges } = await this.freshLoad(keys));
        keys = [];
      } else {
        this.pendingFlows.push(...this.recomputeKeys(keys));
        const computed = Date.now();
        metrics.stageDuration.observe({ stage: 'compute' }, (computed - t0) / 1000);
        const script = this.render({ header: full, baseChains: full, elements: true });
        metrics.stageDuration.observe({ stage: 'render' }, (Date.now() - computed) / 1000);
        const applyStart = Date.now();
        if (script.text) {
          if (this.o.dryRun) (this.o.out ?? process.stdout).write(script.text);
          else if (this.useSession(this.session) && script.text.length <= SESSION_MAX_BYTES) {
            this.stats.lastVia = 'session';
            await this.session.run(script.text);
          } else {
            this.stats.lastVia = 'process';
            await runNft(['-f', '-'], script.text, this.o.nftPath);
          }
        }
        metrics.stageDuration.observe({ stage: 'apply' }, (Date.now() - applyStart) / 1000);
        script.commit();
        bytes = script.text.length;
        elementChanges = script.elementChanges;
      }
      for (const st of this.fam.values()) st.rebuild = false;
      this.stats.lastElementChanges = elementChanges;
      this.stats.lastTransactionBytes = bytes;
      metrics.elementChanges.inc(elementChanges);
      this.o.log.debug({ full, ms: Date.now() - t0, elementChanges, bytes }, 'nft: synced');
      if (full && !this.o.dryRun) await this.deleteUnusedChains();
    } catch (e) {
      // keys not recomputed yet (a failed fresh load) are recomputed next time
      for (const k of keys) this.dirty.add(k);
      if (this.failuresInRow >= 1) for (const st of this.fam.values()) st.rebuild = true;
      metrics.nftablesSyncFailures.inc({ ip_family: '' });
      this.failed(e, 'nft');
      return;
    }
    await this.succeeded({ full, durationMs: Date.now() - t0 });
  }

  /**
   * A cold start on a node without kpng's tables: the maps, sets and regular
   * chains are created and filled in chunks, up to `freshLoadParallel` nft
   * processes at once (nft's parsing is most of a big load, and it runs on
   * every core) while the next chunk is computed; none of it touches a
   * packet until the last transaction hooks the base chains, so packets see
   * no kpng, then all of it. The table is empty, so a chunk is only adds:
   * no diff, and the committed state is the desired one at the end.
   */
  private async freshLoad(keys: readonly string[]): Promise<{ bytes: number; elementChanges: number }> {
    let bytes = 0;
    let elementChanges = 0;
    // each chunk goes to nft as a file it reads by itself (through a pipe it
    // would wait for this process, busy computing the next chunk), included
    // by an idle long-lived `nft -i`: spawning from a big process blocks it
    // for ~13 ms each time, and a fresh nft waits for the kernel at exit
    const dir = mkdtempSync(join(tmpdir(), 'kpng-nft-'));
    // the running kpng's own session is one of them: it is warm afterwards
    const own = Array.from({ length: this.parallel - (this.session ? 1 : 0) }, () => new NftSession(this.o.nftPath));
    const sessions = this.session ? [this.session, ...own] : own;
    const idle = [...sessions];
    let files = 0;
    const apply = async (text: string) => {
      if (!text) return;
      bytes += text.length;
      const file = join(dir, `${files++}.nft`);
      writeFileSync(file, text);
      const session = idle.pop() ?? sessions[0];
      try {
        if (this.useSession(session)) await session.run(`include "${file}"`);
        else await runNft(['-f', file], undefined, this.o.nftPath);
      } finally {
        if (!session.usable) this.sessionsUsable = false;
        if (!idle.includes(session)) idle.push(session);
        rmSync(file, { force: true });
      }
    };
    /** the elements that count of these owners, as adds */
    const adds = (owners: (st: FamilyState) => Iterable<string>) => {
      const lines: string[] = [];
      for (const st of this.fam.values()) {
        const list: Element[] = [];
        for (const owner of owners(st)) for (const e of st.elements.winnersOf(owner)) list.push(e);
        elementChanges += list.length;
        pushElements(lines, 'add', `${st.names.table} ${TABLE}`, list, true);
      }
      return lines.length ? lines.join('\n') + '\n' : '';
    };
    // in name order, the owner that counts for a key (the first by name) is the first to load it
    const sorted = [...keys].sort();
    try {
      const header = this.render({ header: true, baseChains: false, elements: false });
      // with the elements of owners not loaded below (the node's, the ServiceCIDRs')
      const reloaded = new Set(sorted.map(ownerOf));
      await apply(header.text + adds((st) => [...st.elements.owners()].filter((o) => !reloaded.has(o))));
      header.commit();
      let failure: unknown;
      const running = new Set<Promise<void>>();
      for (let i = 0; i < sorted.length && !failure; i += this.chunk) {
        const chunk = sorted.slice(i, i + this.chunk);
        this.pendingFlows.push(...this.recomputeKeys(chunk));
        // chains the elements point to go in first, on their own (a few lines)
        const structure = this.render({ header: false, baseChains: false, elements: false });
        await apply(structure.text);
        structure.commit();
        if (failure) break;
        const owners = chunk.map(ownerOf);
        // nft starts now (spawned synchronously), while the next chunk is computed
        const p: Promise<void> = apply(adds(() => owners))
          .catch((e) => void (failure ??= e))
          .finally(() => running.delete(p));
        running.add(p);
        while (running.size >= this.parallel) await Promise.race(running);
      }
      await Promise.all(running);
      if (failure) throw failure;
      for (const st of this.fam.values()) st.elements.commitDesired();
      const hooks = this.render({ header: false, baseChains: true, elements: true });
      await apply(hooks.text);
      hooks.commit();
      return { bytes, elementChanges: elementChanges + hooks.elementChanges };
    } finally {
      for (const session of own) session.close();
      rmSync(dir, { recursive: true, force: true });
    }
  }

  /** a session is used while sessions answer; once one never did, never again (logged once) */
  private useSession(session: NftSession | undefined): session is NftSession {
    if (!session) return false;
    if (!session.usable) this.sessionsUsable = false;
    if (!this.sessionsUsable) this.warnOnce('nft session', `${this.o.nftPath ?? 'nft'} -i did not answer as expected: each transaction runs its own nft from now on`);
    return this.sessionsUsable;
  }

  /** Reads the kernel's tables back: what a previous kpng (or a failed sync) left. */
  private async adopt(): Promise<void> {
    for (const st of this.fam.values()) {
      const listing = this.o.dryRun || st.rebuild ? undefined : await listTable(st.names.table, TABLE, this.o.nftPath);
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
   * A transaction for both families: with `header`, the table and every set
   * and map (re-)declared; chains whose rules changed (base chains only with
   * `baseChains`), then element differences. `structure` is the part that
   * declares (sets, chains, rules), `elements` the element changes; commit()
   * records it all as applied.
   */
  private render(what: { header: boolean; baseChains: boolean; elements: boolean }): Rendered {
    const structure: string[] = [];
    const elements: string[] = [];
    const commits: (() => void)[] = [];
    let elementChanges = 0;
    let deletes = 0;
    for (const st of this.fam.values()) {
      const f = st.names;
      const t = `${f.table} ${TABLE}`;
      const desired = this.desiredChains(st);
      const committed = st.committedChains;
      if (what.header) {
        if (st.rebuild) structure.push(`add table ${t}`, `delete table ${t}`);
        structure.push(`add table ${t} { comment "rules for kpng" ; }`);
      }
      if (what.baseChains) for (const [name, decl] of Object.entries(BASE_CHAINS)) if (!committed.has(name) || what.header) structure.push(`add chain ${t} ${name} { ${decl} }`);
      // sets and maps first: chains refer to them
      const newSets: string[] = [];
      const decls = setDeclarations(f);
      for (const [name, d] of Object.entries(decls)) if (what.header || !st.committedSets.has(name)) (structure.push(`add ${d.kind} ${t} ${name} { ${d.body} }`), newSets.push(name));
      const affinitySets = this.desiredAffinitySets(st);
      for (const name of affinitySets) if (what.header || !st.committedSets.has(name)) (structure.push(`add set ${t} ${name} { ${affinitySetBody(f)} }`), newSets.push(name));
      // chains: declare all new ones before any rule (rules jump between them)
      const changed: string[] = [];
      for (const [name, rules] of desired) {
        const base = name in BASE_CHAINS;
        if (base && !what.baseChains) continue;
        const have = committed.get(name);
        if (have && sameRules(have, rules)) continue;
        if (!base && (!committed.has(name) || what.header)) structure.push(`add chain ${t} ${name}`);
        changed.push(name);
      }
      for (const name of changed) {
        if (committed.has(name)) structure.push(`flush chain ${t} ${name}`);
        for (const r of desired.get(name)!) structure.push(`add rule ${t} ${name} ${r}`);
      }
      // elements: deletes, then adds (a changed value is both)
      const diff = what.elements ? st.elements.diff() : { deletes: [], adds: [] };
      elementChanges += diff.deletes.length + diff.adds.length;
      deletes += diff.deletes.length;
      pushElements(elements, 'delete', t, diff.deletes, false);
      pushElements(elements, 'add', t, diff.adds, true);
      // affinity chains and sets a service no longer needs: once nothing points to them
      const goneChains = what.elements ? [...committed.keys()].filter((c) => c.startsWith(AFFINITY_PREFIX) && !desired.has(c)) : [];
      const goneSets = what.elements ? [...st.committedSets].filter((n) => AFFINITY_SET.test(n) && !affinitySets.has(n)) : [];
      for (const c of goneChains) elements.push(`flush chain ${t} ${c}`);
      for (const c of goneChains) elements.push(`delete chain ${t} ${c}`);
      for (const n of goneSets) elements.push(`delete set ${t} ${n}`);
      commits.push(() => {
        if (what.elements) st.elements.commit(diff);
        for (const name of changed) committed.set(name, desired.get(name)!);
        for (const name of newSets) st.committedSets.add(name);
        for (const c of goneChains) committed.delete(c);
        for (const n of goneSets) st.committedSets.delete(n);
      });
    }
    const text = (lines: string[]) => (lines.length ? lines.join('\n') + '\n' : '');
    return {
      structure: text(structure),
      elements: text(elements),
      get text() {
        return this.structure + this.elements;
      },
      elementChanges,
      deletes,
      commit: () => commits.forEach((c) => c()),
    };
  }

  /** chains no element or rule points to anymore (after a reconcile) */
  private async deleteUnusedChains(): Promise<void> {
    const lines: string[] = [];
    for (const st of this.fam.values()) {
      const t = `${st.names.table} ${TABLE}`;
      const desired = this.desiredChains(st);
      const unused = [...st.committedChains.keys()].filter((c) => !desired.has(c) && !(c in BASE_CHAINS));
      // and affinity sets no chain uses (e.g. an earlier kpng's per-slot sets)
      const affinitySets = this.desiredAffinitySets(st);
      const unusedSets = [...st.committedSets].filter((n) => n.startsWith(AFFINITY_PREFIX) && !affinitySets.has(n));
      for (const c of unused) lines.push(`flush chain ${t} ${c}`);
      for (const c of unused) lines.push(`delete chain ${t} ${c}`);
      for (const n of unusedSets) lines.push(`delete set ${t} ${n}`);
      if (lines.length) {
        try {
          await runNft(['-f', '-'], lines.join('\n') + '\n', this.o.nftPath);
          for (const c of unused) st.committedChains.delete(c);
          for (const n of unusedSets) st.committedSets.delete(n);
        } catch (e) {
          this.o.log.debug({ err: (e as NftError).message }, 'nft: unused chains stay for now');
        }
        lines.length = 0;
      }
    }
  }

  override async close(): Promise<void> {
    await super.close();
    this.session?.close();
  }

  /** what is programmed, for introspection and tests */
  desiredElements(family: Family, set: string) {
    return this.fam.get(family)!.elements.desiredElements(set);
  }

}

interface Rendered {
  /** sets, maps, chains and rules declared or changed */
  readonly structure: string;
  /** element deletes and adds */
  readonly elements: string;
  /** the whole transaction */
  readonly text: string;
  readonly elementChanges: number;
  readonly deletes: number;
  commit(): void;
}

/** the element owner of a service */
function ownerOf(key: string): string {
  return `svc:${key}`;
}

function lbKey(r: LbRequirement): string {
  return `${r.kind}|${r.proto}|${r.n}`;
}

function flowKey(u: UdpFlow): string {
  return `${u.vip}|${u.port}|${u.endpoint}`;
}

/** interval set elements: nft lists a /32 (/128) as the bare address */
function singleAddress(cidr: string): string {
  return cidr.endsWith('/32') || cidr.endsWith('/128') ? cidr.slice(0, cidr.lastIndexOf('/')) : cidr;
}

function pushElements(lines: string[], verb: 'add' | 'delete', t: string, list: readonly Element[], withData: boolean) {
  const bySet = new Map<string, string[]>();
  for (const e of list) {
    let arr = bySet.get(e.set);
    if (!arr) bySet.set(e.set, (arr = []));
    const comment = withData && e.comment ? ` comment "${e.comment}"` : '';
    arr.push(`${e.key}${comment}${withData && e.value ? ` : ${e.value}` : ''}`);
  }
  for (const [set, items] of bySet) {
    for (let i = 0; i < items.length; i += MAX_ELEMENTS_PER_COMMAND) lines.push(`${verb} element ${t} ${set} { ${items.slice(i, i + MAX_ELEMENTS_PER_COMMAND).join(', ')} }`);
  }
}
