// One tenant's content on its way to the kernel, in three stages:
//
// - staged: what the tenant's requests asked for since the last sync took
//   its changes (checked, within quotas): the latest declared structure, and
//   per set an overlay of element changes (coalesced: a key added then
//   deleted before a sync is nothing);
// - desired: what the dataplane writes; a sync moves the staged changes in
//   (take) synchronously before it renders, so what it commits is exactly
//   desired, whatever arrives while nft runs;
// - good: desired as the kernel last took it, kept as the structure and the
//   values elements had before they changed since: a change the kernel
//   refuses is undone to it (and nothing else is).
import type { TenantInfo } from '../api/gen/kpng/aggregator/v1/aggregator_pb.js';
import { tenantKey } from './names.js';
import type { ElementsBySet, NftDeclaration, TenantElement, TenantNftSet, TenantNftTable } from './nft-content.js';

/** A request waiting for the kernel: answered once a sync commits it, or refuses it. */
export interface PendingRequest {
  readonly id: bigint;
  /** when kpng received it (the change-duration metric's start) */
  readonly at: number;
  /** how its tenant is answered (none for kpng's own: the removal at the grace's end); a gone session ignores it */
  readonly answer?: (outcome: 'applied' | 'refused', detail: { error?: string; changes?: number }) => void;
  /** an Unregister, or the grace running out: the tenant is forgotten once it is applied */
  readonly removal?: boolean;
}

/** What the dataplane writes for the tenant. */
export interface NftDesired {
  tables: ReadonlyMap<string, TenantNftTable>;
  readonly elements: ElementsBySet;
  /** element keys changed since the dataplane last committed, by set id; a set id whose whole content was replaced has them all */
  touched: Map<string, Set<string>>;
  /** the structure (tables, chains, sets) changed since the dataplane last committed */
  structureChanged: boolean;
}

/** per set id: key -> the element now (null: deleted); replace: the set's elements start from nothing */
interface Overlay {
  replace: boolean;
  readonly elements: Map<string, TenantElement | null>;
}

/** how often expired elements are looked for */
const SWEEP_MS = 5000;

export class Tenant {
  readonly key: string;
  /**
   * The tenant's content is known: declared, or removed on purpose. A
   * tenant found in the kernel at start and not declared since is not: its
   * tables are left exactly as they are.
   */
  known = false;
  /** a full sync found its tables in the kernel (a kpng before this one wrote them) */
  foundInKernel = false;
  readonly desired: NftDesired = { tables: new Map(), elements: new Map(), touched: new Map(), structureChanged: false };
  // staged
  private stagedTables?: ReadonlyMap<string, TenantNftTable>;
  private readonly staged = new Map<string, Overlay>();
  private stagedRequests: PendingRequest[] = [];
  /** taken by a sync, waiting for its commit */
  private inFlight: PendingRequest[] = [];
  // good
  private goodTables: ReadonlyMap<string, TenantNftTable> = new Map();
  private goodKnown = false;
  private readonly goodElements = new Map<string, Map<string, TenantElement | undefined>>();
  /** desired elements that expire (their own or their set's timeout): set id -> key -> when */
  private readonly timed = new Map<string, Map<string, number>>();
  private nextSweepMs = 0;
  /** elements as staged (desired, with the overlays): what quotas count */
  projectedElements = 0;
  // what kpng get tenants shows
  readonly stats = { changes: 0, refusals: 0, lastChangeMs: 0, lastError: '', lastErrorMs: 0 };
  /** disconnected: when the grace runs out (ms since the epoch); 0 while connected */
  graceEndsMs = 0;
  /** when the tenant's changes may next trigger a sync (its rate limit) */
  nextReleaseMs = 0;
  releaseTimer?: NodeJS.Timeout;
  graceTimer?: NodeJS.Timeout;

  constructor(readonly name: string) {
    this.key = tenantKey(name);
  }

  /** the tables as the tenant's next request sees them (staged, else desired) */
  get tables(): ReadonlyMap<string, TenantNftTable> {
    return this.stagedTables ?? this.desired.tables;
  }

  get hasStaged(): boolean {
    return this.stagedRequests.length > 0;
  }

  /** nothing of it is in the kernel or on its way: it can be forgotten */
  get empty(): boolean {
    return this.known && this.desired.tables.size === 0 && this.desired.elements.size === 0 && !this.hasStaged && !this.inFlight.length;
  }

  /** A Declare (checked): its structure and every set's elements replace what was staged. */
  stageDeclaration(d: NftDeclaration, req: PendingRequest): void {
    for (const id of this.setIds(this.tables)) this.overlay(id, true);
    for (const [id, elements] of d.elements) {
      const o = this.overlay(id, true);
      for (const [k, e] of elements) o.elements.set(k, e);
    }
    this.stagedTables = d.tables;
    this.projectedElements = d.counts.elements;
    this.stagedRequests.push(req);
  }

  /** Element changes (checked, within the quota the caller counted with has()): deletes, then adds, per change. */
  stageElements(changes: readonly { id: string; deletes: readonly string[]; adds: readonly TenantElement[] }[], req: PendingRequest): void {
    for (const c of changes) {
      const o = this.overlay(c.id, false);
      for (const k of c.deletes) {
        if (this.has(c.id, k)) this.projectedElements--;
        o.elements.set(k, null);
      }
      for (const e of c.adds) {
        if (!this.has(c.id, e.key)) this.projectedElements++;
        o.elements.set(e.key, e);
      }
    }
    this.stagedRequests.push(req);
  }

  /** Unregister or the grace's end: everything goes. */
  stageRemoval(req: PendingRequest): void {
    for (const id of this.setIds(this.tables)) this.overlay(id, true);
    for (const id of this.desired.elements.keys()) this.overlay(id, true);
    this.stagedTables = new Map();
    this.projectedElements = 0;
    this.stagedRequests.push(req);
  }

  /** whether a set (by id) has the key, as staged */
  has(id: string, key: string): boolean {
    const o = this.staged.get(id);
    const e = o?.elements.get(key);
    if (e !== undefined) return e !== null;
    return !o?.replace && !!this.desired.elements.get(id)?.has(key);
  }

  /**
   * A sync takes the staged changes into desired (synchronously, before it
   * renders); the requests wait for its commit.
   */
  take(now: number): void {
    this.sweep(now);
    if (!this.stagedRequests.length) return;
    if (this.stagedTables) {
      this.desired.tables = this.stagedTables;
      this.desired.structureChanged = true;
      this.stagedTables = undefined;
      this.known = true;
    }
    if (this.stagedRequests.some((r) => r.removal)) this.known = true;
    for (const [id, o] of this.staged) {
      let set = this.desired.elements.get(id);
      const touched = this.touchedOf(id);
      if (o.replace && set) {
        for (const [k, e] of set) (this.keepGood(id, k, e), touched.add(k));
        set = undefined;
      }
      const ttl = this.setOf(id)?.timeoutMs ?? 0;
      for (const [k, e] of o.elements) {
        this.keepGood(id, k, set?.get(k));
        touched.add(k);
        if (e) (set ??= new Map()).set(k, e);
        else set?.delete(k);
        this.expires(id, k, e ? e.timeoutMs || ttl : 0, now);
      }
      if (set?.size) this.desired.elements.set(id, set);
      else (this.desired.elements.delete(id), this.timed.delete(id));
    }
    this.staged.clear();
    for (const r of this.stagedRequests) this.inFlight.push(r);
    this.stagedRequests = [];
  }

  private expires(id: string, key: string, ttl: number, now: number): void {
    let m = this.timed.get(id);
    if (ttl) {
      if (!m) this.timed.set(id, (m = new Map()));
      m.set(key, now + ttl);
    } else m?.delete(key);
  }

  /** forgets elements the kernel removed by their timeout (at most every few seconds) */
  private sweep(now: number): void {
    if (now < this.nextSweepMs || !this.timed.size) return;
    this.nextSweepMs = now + SWEEP_MS;
    for (const [id, m] of this.timed) {
      const set = this.desired.elements.get(id);
      for (const [k, at] of m) {
        if (at > now) continue;
        m.delete(k);
        set?.delete(k);
        this.goodElements.get(id)?.delete(k);
      }
      if (!m.size) this.timed.delete(id);
      if (set && !set.size) this.desired.elements.delete(id);
    }
  }

  /** the declared set of an id, as desired */
  setOf(id: string): TenantNftSet | undefined {
    for (const t of this.desired.tables.values()) {
      const prefix = `${t.family} ${t.kernelName} `;
      if (id.startsWith(prefix)) return t.sets.get(id.slice(prefix.length));
    }
    return undefined;
  }

  /** The kernel took desired: it is the good content now. Returns the requests it answered. */
  applied(): PendingRequest[] {
    this.goodTables = this.desired.tables;
    this.goodKnown = this.known;
    this.goodElements.clear();
    const done = this.inFlight;
    this.inFlight = [];
    return done;
  }

  /** The kernel refused desired: back to the good content (what is staged stays staged). Returns the requests it refused. */
  refused(): PendingRequest[] {
    if (this.desired.tables !== this.goodTables) {
      this.desired.tables = this.goodTables;
      this.desired.structureChanged = true;
    }
    this.known = this.goodKnown;
    for (const [id, keys] of this.goodElements) {
      let set = this.desired.elements.get(id);
      const touched = this.touchedOf(id);
      for (const [k, e] of keys) {
        touched.add(k);
        if (e) (set ??= new Map()).set(k, e);
        else set?.delete(k);
      }
      if (set?.size) this.desired.elements.set(id, set);
      else this.desired.elements.delete(id);
    }
    this.goodElements.clear();
    this.projectedElements = this.countProjected();
    const done = this.inFlight;
    this.inFlight = [];
    return done;
  }

  /** every request not answered yet (the tenant is forgotten, or kpng stops) */
  drain(): PendingRequest[] {
    const all = [...this.inFlight, ...this.stagedRequests];
    this.inFlight = [];
    this.stagedRequests = [];
    return all;
  }

  get elementCount(): number {
    let n = 0;
    for (const s of this.desired.elements.values()) n += s.size;
    return n;
  }

  /** what kpng get tenants shows of it (its tables, hooks and counts, from desired) */
  info(connected: boolean): Omit<TenantInfo, '$typeName' | '$unknown'> {
    let chains = 0;
    let rules = 0;
    let sets = 0;
    const hooks: { family: string; table: string; chain: string; type: string; hook: string; priority: number }[] = [];
    for (const t of this.desired.tables.values()) {
      sets += t.sets.size;
      for (const c of t.chains.values()) {
        chains++;
        rules += c.rules.length;
        if (c.hook) hooks.push({ family: t.family, table: t.kernelName, chain: c.name, type: c.hook.type, hook: c.hook.hook, priority: c.hook.priority });
      }
    }
    hooks.sort((a, b) => a.hook.localeCompare(b.hook) || a.priority - b.priority);
    return {
      name: this.name,
      connected,
      tables: [...this.desired.tables.values()].map((t) => `${t.family} ${t.kernelName}`),
      chains,
      rules,
      sets,
      elements: this.elementCount,
      hooks: hooks.map((h) => ({ $typeName: 'kpng.aggregator.v1.TenantHook', ...h })),
      lastChangeMs: BigInt(this.stats.lastChangeMs),
      lastError: this.stats.lastError,
      lastErrorMs: BigInt(this.stats.lastErrorMs),
      changes: BigInt(this.stats.changes),
      refusals: BigInt(this.stats.refusals),
      graceEndsMs: BigInt(this.graceEndsMs),
      adoptedOnly: this.foundInKernel && !this.known,
    };
  }

  private countProjected(): number {
    let n = this.elementCount;
    for (const [id, o] of this.staged) {
      if (o.replace) n -= this.desired.elements.get(id)?.size ?? 0;
      for (const [k, e] of o.elements) {
        const had = !o.replace && !!this.desired.elements.get(id)?.has(k);
        n += (e ? 1 : 0) - (had ? 1 : 0);
      }
    }
    return n;
  }

  private overlay(id: string, replace: boolean): Overlay {
    let o = this.staged.get(id);
    if (!o) this.staged.set(id, (o = { replace, elements: new Map() }));
    else if (replace) {
      o.replace = true;
      o.elements.clear();
    }
    return o;
  }

  private touchedOf(id: string): Set<string> {
    let t = this.desired.touched.get(id);
    if (!t) this.desired.touched.set(id, (t = new Set()));
    return t;
  }

  /** the value a key had in the good content: the first change since it was good records it */
  private keepGood(id: string, key: string, e: TenantElement | undefined): void {
    let m = this.goodElements.get(id);
    if (!m) this.goodElements.set(id, (m = new Map()));
    if (!m.has(key)) m.set(key, e);
  }

  private setIds(tables: ReadonlyMap<string, TenantNftTable>): string[] {
    const out: string[] = [];
    for (const t of tables.values()) for (const s of t.sets.values()) out.push(`${t.family} ${t.kernelName} ${s.name}`);
    return out;
  }
}

/** The declared set a change names (by family, the tenant's table name, set), or undefined. */
export function declaredSet(tables: ReadonlyMap<string, TenantNftTable>, family: string, table: string, set: string): { table: TenantNftTable; set: TenantNftSet } | undefined {
  const t = tables.get(`${family} ${table}`);
  const s = t?.sets.get(set);
  return t && s ? { table: t, set: s } : undefined;
}
