// The eBPF proxier: a Service is a few map entries. Each address a socket on
// the node may connect to (ClusterIP, externalIPs, LB IPs, NodePort on the
// node's addresses and localhost) is a key in kpng_services pointing at an
// endpoint list (an id) in kpng_endpoints. Only the Services given are
// computed again, and only the entries that differ from what was committed
// are written (in one ordered write per sync). A full sync reads both maps
// back: at start that adopts what a previous kpng left, keeping its ids, so a
// restart writes nothing when nothing changed. An endpoint keeps its index in
// its list while it stays (stableOrder): one endpoint added or removed is one
// or two writes, whatever the list's length.
import { canonicalIP, ipFamily, type Family } from '../../api/ip.js';
import { ipSetOf } from '../../api/model.js';
import type { DataplaneOptions } from '../shared/backend.js';
import { nodePortAddresses } from '../shared/node-facts.js';
import { ProxierBase, type ApplyRequest, type SyncStats } from '../shared/proxier.js';
import { rangesContain, servicePorts, type ServicePort, type Target } from '../shared/service-ports.js';
import { SVC_HOST_ONLY, SVC_REFUSE, svcKeyString, type EpValue, type SvcKey, type SvcValue } from './layout.js';
import { MapFullError, type LbMaps, type MapContents, type MapWrite } from './maps.js';
import { ebpfMetrics } from './metrics.js';

export interface EbpfProxierOptions extends DataplaneOptions {
  /** the maps (tests: MemoryMaps); opened lazily by the backend otherwise, and again after drift */
  readonly maps: () => LbMaps;
  /** the drift check: what is missing of the programs and maps (then they are loaded again), or undefined */
  readonly drift?: () => string | undefined;
}

/** One endpoint list: a Service port's endpoints for one family and kind of traffic. */
interface Group {
  readonly eps: readonly EpValue[];
}

/** What one Service wants in the maps. */
interface Wanted {
  /** service map key string -> its key, group and value bits */
  readonly addrs: Map<string, { key: SvcKey; group: string; flags: number; affinitySecs: number }>;
  readonly groups: Map<string, Group>;
}

export interface EbpfStats extends SyncStats {
  lastWrites: number;
}

const FAMILIES: readonly Family[] = [4, 6];
/** a Service value counts its endpoints in 16 bits (kpng_svc_value.count) */
const MAX_LIST = 0xffff;

const epKey = (ep: EpValue) => `${ep.ip}|${ep.port}`;

/**
 * The endpoint list to write, as close to what the map holds as can be: an
 * endpoint still wanted keeps its index; the others (new ones, and those past
 * the new length) fill the indexes freed, then the end.
 */
function stableOrder(have: readonly (EpValue | undefined)[], want: readonly EpValue[]): EpValue[] {
  const left = new Map<string, number>();
  const take = (k: string) => {
    const c = left.get(k);
    if (!c) return false;
    if (c === 1) left.delete(k);
    else left.set(k, c - 1);
    return true;
  };
  for (const ep of want) left.set(epKey(ep), (left.get(epKey(ep)) ?? 0) + 1);
  const out: (EpValue | undefined)[] = new Array(want.length);
  for (let i = 0; i < Math.min(want.length, have.length); i++) {
    const h = have[i];
    if (h && take(epKey(h))) out[i] = h;
  }
  const rest = want.filter((ep) => take(epKey(ep)));
  let j = 0;
  for (let i = 0; i < out.length; i++) out[i] ??= rest[j++];
  return out as EpValue[];
}

export class EbpfProxier extends ProxierBase {
  readonly stats: EbpfStats = { syncs: 0, fullSyncs: 0, failures: 0, lastSyncMs: 0, lastSuccess: 0, repairs: 0, lastWrites: 0 };
  private maps?: LbMaps;
  /** as committed: service map entries, endpoint lists by id */
  private committed: MapContents = { services: new Map(), endpoints: new Map() };
  /** each Service's entries, as committed */
  private readonly wanted = new Map<string, Wanted>();
  /** service map key -> the Service that has it (two Services asking for one address: the first keeps it) */
  private readonly owner = new Map<string, string>();
  /** endpoint list (group) -> id, and back */
  private readonly ids = new Map<string, number>();
  private readonly idGroups = new Map<number, string>();
  private epCount = 0;
  private readonly freeIds: number[] = [];
  private nextId = 1;
  /**
   * Services computed by checks (isolation's, a few at a time) or by a write
   * that failed: every apply computes them again until a write commits them,
   * so that checks add up as the Services they release do
   */
  private readonly unapplied = new Set<string>();
  /** the maps were read back (adopt) and nothing committed since: every apply computes every Service and removes what none wants */
  private readBack = false;

  constructor(private readonly o: EbpfProxierOptions) {
    super(o, { minSyncPeriodMs: o.config.nftables.minSyncPeriodMs, syncPeriodMs: o.config.nftables.syncPeriodMs });
  }

  /** cheap: pins and links; the repair is a full sync on maps opened again */
  protected override async checkDrift(): Promise<string | undefined> {
    if (!this.maps || !this.o.drift) return undefined;
    const why = this.o.drift();
    if (why) this.maps = undefined;
    return why;
  }

  /** what the programs counted (translated connections, refusals, ...) */
  counters() {
    return this.maps?.counters();
  }

  // --- computing

  /** the node addresses NodePorts are reached at from this node */
  private nodePortIPs(family: Family): string[] {
    const c = this.o.config;
    const np = nodePortAddresses(c.nodePortAddresses.length ? c.nodePortAddresses : ['primary'], this.node, family);
    const nodeIPs = ipSetOf(this.node?.IPs, family);
    const ips = np.all ? nodeIPs : [...np.primary, ...nodeIPs.filter((ip) => rangesContain(np.cidrs, ip))];
    // a NodePort on localhost works from every process on the node (as iptables' localhostNodePorts), IPv4 only as there
    if (family === 4 && (np.localhost || c.iptables.localhostNodePorts)) ips.push('127.0.0.1');
    return [...new Set(ips)];
  }

  private compute(key: string): Wanted | undefined {
    const svc = this.serviceOf(key);
    if (!svc) return undefined;
    const w: Wanted = { addrs: new Map(), groups: new Map() };
    const eps = [...this.endpointsOf(key)];
    for (const family of FAMILIES) {
      for (const sp of servicePorts(svc, eps, family)) {
        if (sp.protocol === 'sctp') continue; // no sock_addr hook for SCTP here: left to the other backend
        this.addPort(w, sp, family);
      }
    }
    return w;
  }

  private addPort(w: Wanted, sp: ServicePort, family: Family): void {
    const proto = sp.protocol as 'tcp' | 'udp';
    // an endpoint list exists only when an address points at it
    // bad input never reaches the maps (an encoder would throw at write, failing every sync): left out, said once
    const usable = (ip: string, port: number) => {
      const ok = canonicalIP(ip) === ip && ipFamily(ip) === family && Number.isInteger(port) && port > 0 && port < 65536;
      if (!ok) this.warnOnce(`bad ${sp.portName} ${ip} ${port}`, `eBPF: ${sp.portName}: ${JSON.stringify(ip)} port ${port} is not a usable address and port; left out`);
      return ok;
    };
    const group = (kind: string, all: readonly Target[]) => {
      const id = `${sp.portName}/${proto}/${family}/${kind}`;
      let targets = all.filter((t) => usable(t.ip, t.port));
      if (targets.length > MAX_LIST) {
        this.warnOnce(`long ${id}`, `eBPF: ${sp.portName} has ${targets.length} endpoints (IPv${family}); the first ${MAX_LIST} are used`);
        targets = targets.slice(0, MAX_LIST);
      }
      return {
        id,
        empty: targets.length === 0,
        // the node-local state already chose the usable endpoints (terminating ones only as a fallback)
        use: () => w.groups.has(id) || w.groups.set(id, { eps: targets.map((t) => ({ ip: t.ip, port: t.port })) }),
      };
    };
    const put = (ip: string, port: number, g: { id: string; empty: boolean; use: () => unknown }) => {
      if (!usable(ip, port)) return;
      const key: SvcKey = { ip, port, proto };
      g.use();
      // no endpoint anywhere: refuse here; endpoints elsewhere only: left untranslated (the other backend drops it)
      const flags = (g.empty && !sp.hasEndpoints ? SVC_REFUSE : 0) | (ip === '127.0.0.1' ? SVC_HOST_ONLY : 0);
      w.addrs.set(svcKeyString(key), { key, group: g.id, flags, affinitySecs: sp.affinitySeconds });
    };
    const port = sp.port.Port;
    put(sp.clusterIP, port, group('internal', sp.internal));
    // from the node, external addresses use the cluster-wide endpoints (eTP=Local short-circuit)
    const external = group('cluster', sp.cluster);
    for (const ip of sp.externalIPs) put(ip, port, external);
    // LB IPs with source ranges are left to the other backend: a socket's source is not known at connect
    if (!sp.sourceRanges.length) for (const ip of sp.loadBalancerIPs) put(ip, port, external);
    if (sp.nodePort) for (const ip of this.nodePortIPs(family)) put(ip, sp.nodePort, external);
  }

  // --- applying

  protected async apply(req: ApplyRequest): Promise<{ changes: number }> {
    if (this.o.dryRun) return { changes: 0 };
    const maps = (this.maps ??= this.o.maps());
    if (req.full && !req.check) this.adopt(maps.read());
    const full = req.full || this.readBack;
    for (const k of req.keys) this.unapplied.add(k);
    const keys = full || this.nodeDirty ? new Set([...this.services.keys(), ...this.wanted.keys()]) : new Set(this.unapplied);
    const next = new Map<string, Wanted | undefined>();
    for (const k of keys) next.set(k, this.compute(k));
    let plan: ReturnType<EbpfProxier['plan']>;
    try {
      plan = this.plan(next, full);
    } catch (e) {
      // a check is isolation looking for the Services that do not fit: not a sync refused
      if (e instanceof MapFullError && !req.check) ebpfMetrics.mapFull.inc({ map: e.map });
      throw e;
    }
    if (req.check) return { changes: 0 };
    const changes = plan.write.setEndpoints.length + plan.write.setServices.length + plan.write.deleteServices.length + plan.write.deleteEndpoints.length;
    try {
      if (changes) maps.write(plan.write);
    } catch (e) {
      if (e instanceof MapFullError) ebpfMetrics.mapFull.inc({ map: e.map });
      // what was written is unknown now: the next sync reads the maps back
      this.forceFull();
      throw e;
    }
    plan.commit();
    this.unapplied.clear();
    this.readBack = false;
    this.stats.lastWrites = changes;
    this.o.log.debug({ full: req.full, writes: changes, services: this.committed.services.size, endpoints: this.epCount }, 'ebpf: synced');
    ebpfMetrics.entries.set({ map: 'services' }, this.committed.services.size);
    ebpfMetrics.entries.set({ map: 'endpoints' }, this.epCount);
    this.trackServices(keys);
    return { changes };
  }

  /** a full sync: the maps as they are become the committed state; ids in use are kept */
  private adopt(read: MapContents): void {
    this.committed = read;
    this.ids.clear();
    this.idGroups.clear();
    this.freeIds.length = 0;
    this.owner.clear();
    this.wanted.clear();
    this.nextId = 1;
    this.epCount = 0;
    this.readBack = true;
    for (const l of read.endpoints.values()) this.epCount += l.filter(Boolean).length;
  }

  private allocId(taken: Map<number, string>): number {
    const free = (id: number) => !this.idGroups.has(id) && !taken.has(id) && !this.committed.endpoints.has(id);
    while (this.freeIds.length) {
      const id = this.freeIds.pop()!;
      if (free(id)) return id;
    }
    while (!free(this.nextId)) this.nextId++;
    return this.nextId++;
  }

  /**
   * The write that takes the maps from the committed state to `next` (the
   * Services given; the others stay), and what to remember once it is done.
   * full: everything in the maps that no Service wants goes. Costs what the
   * given Services have, not what the node has (but with full).
   */
  private plan(next: Map<string, Wanted | undefined>, full: boolean): { write: MapWrite; commit: () => void } {
    // changes over the committed maps, applied by commit()
    const owner = new Map<string, string | undefined>();
    const ownerOf = (a: string) => (owner.has(a) ? owner.get(a) : this.owner.get(a));
    const ids = new Map<string, number | undefined>();
    const idOf = (g: string) => (ids.has(g) ? ids.get(g) : this.ids.get(g));
    const takenIds = new Map<number, string>();
    const oldAddrs = new Set<string>();
    const oldGroups = new Set<string>();
    for (const k of next.keys()) {
      const before = this.wanted.get(k);
      for (const a of before?.addrs.keys() ?? []) if (ownerOf(a) === k) (owner.set(a, undefined), oldAddrs.add(a));
      for (const g of before?.groups.keys() ?? []) oldGroups.add(g);
    }
    const conflicts: string[] = [];
    for (const [k, w] of next) {
      for (const a of w?.addrs.keys() ?? []) {
        const o = ownerOf(a);
        if (o && o !== k) conflicts.push(`${a} (${k}; kept by ${o})`);
        else owner.set(a, k);
      }
    }
    if (conflicts.length) this.warnOnce(`conflict ${conflicts[0]}`, `eBPF: two Services want the same address: ${conflicts.slice(0, 5).join(', ')}`);
    const setEndpoints: { id: number; index: number; ep: EpValue }[] = [];
    const setServices: { key: SvcKey; value: SvcValue }[] = [];
    const deleteServices: SvcKey[] = [];
    const deleteEndpoints: { id: number; index: number }[] = [];
    const lists = new Map<number, readonly EpValue[] | undefined>();
    const svcs = new Map<string, { key: SvcKey; value: SvcValue } | undefined>();
    // adopting (a full sync): a group takes the id its first address has in the maps
    for (const [k, w] of next) {
      if (!w) continue;
      for (const [a, e] of w.addrs) {
        if (ownerOf(a) !== k || idOf(e.group) !== undefined) continue;
        const c = this.committed.services.get(a);
        if (c && !this.idGroups.has(c.value.id) && !takenIds.has(c.value.id)) (ids.set(e.group, c.value.id), takenIds.set(c.value.id, e.group));
      }
    }
    const newGroups = new Set<string>();
    for (const [k, w] of next) {
      if (!w) continue;
      for (const [g, grp] of w.groups) {
        newGroups.add(g);
        let id = idOf(g);
        if (id === undefined) {
          id = this.allocId(takenIds);
          ids.set(g, id);
          takenIds.set(id, g);
        }
        const have = this.committed.endpoints.get(id) ?? [];
        const eps = stableOrder(have, grp.eps);
        const before = setEndpoints.length;
        eps.forEach((ep, i) => {
          const h = have[i];
          if (!h || h.ip !== ep.ip || h.port !== ep.port) setEndpoints.push({ id, index: i, ep });
        });
        for (let i = eps.length; i < have.length; i++) if (have[i]) deleteEndpoints.push({ id, index: i });
        if (setEndpoints.length > before || have.length !== eps.length) lists.set(id, eps);
      }
      for (const [a, e] of w.addrs) {
        if (ownerOf(a) !== k) continue;
        const value: SvcValue = { id: idOf(e.group)!, count: w.groups.get(e.group)!.eps.length, flags: e.flags, affinitySecs: e.affinitySecs };
        const c = this.committed.services.get(a)?.value;
        if (!c || c.id !== value.id || c.count !== value.count || c.flags !== value.flags || c.affinitySecs !== value.affinitySecs) {
          setServices.push({ key: e.key, value });
          svcs.set(a, { key: e.key, value });
        }
      }
    }
    // addresses no longer wanted; with full, anything no Service wants
    const gone = full ? [...this.committed.services.keys()].filter((a) => !ownerOf(a)) : [...oldAddrs].filter((a) => !ownerOf(a));
    for (const a of gone) {
      const c = this.committed.services.get(a);
      if (c) deleteServices.push(c.key);
      svcs.set(a, undefined);
    }
    // endpoint lists no longer wanted
    const goneIds = new Set<number>();
    for (const g of oldGroups) {
      if (newGroups.has(g)) continue;
      const id = idOf(g);
      if (id === undefined) continue;
      ids.set(g, undefined);
      goneIds.add(id);
    }
    if (full) for (const id of this.committed.endpoints.keys()) if (!takenIds.has(id) && !this.idGroups.has(id)) goneIds.add(id);
    for (const id of goneIds) {
      for (const [i, ep] of (this.committed.endpoints.get(id) ?? []).entries()) if (ep) deleteEndpoints.push({ id, index: i });
      lists.set(id, undefined);
    }
    // capacity: a clear error before anything is written
    let services = this.committed.services.size;
    for (const [a, v] of svcs) services += (v ? 1 : 0) - (this.committed.services.has(a) ? 1 : 0);
    let endpoints = this.epCount;
    for (const [id, l] of lists) endpoints += (l?.length ?? 0) - (this.committed.endpoints.get(id)?.filter(Boolean).length ?? 0);
    const cap = (this.maps ?? this.o.maps()).capacity;
    if (services > cap.services) throw new MapFullError('services', cap.services);
    if (endpoints > cap.endpoints) throw new MapFullError('endpoints', cap.endpoints);
    return {
      write: { setEndpoints, setServices, deleteServices, deleteEndpoints },
      commit: () => {
        for (const [a, v] of svcs) (v ? this.committed.services.set(a, v) : this.committed.services.delete(a));
        for (const [id, l] of lists) (l ? this.committed.endpoints.set(id, [...l]) : this.committed.endpoints.delete(id));
        this.epCount = endpoints;
        for (const [g, id] of ids) {
          const was = this.ids.get(g);
          if (was !== undefined) this.idGroups.delete(was);
          if (id === undefined) this.ids.delete(g);
          else (this.ids.set(g, id), this.idGroups.set(id, g));
        }
        this.freeIds.push(...goneIds);
        for (const [a, k] of owner) (k ? this.owner.set(a, k) : this.owner.delete(a));
        for (const [k, w] of next) (w ? this.wanted.set(k, w) : this.wanted.delete(k));
      },
    };
  }
}
