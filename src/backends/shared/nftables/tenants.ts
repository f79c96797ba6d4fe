// Tenants' nftables tables, written by an nftables backend beside its own
// in the same transaction per sync (src/aggregator holds what tenants want;
// this holds what the kernel has of it, and renders the difference).
//
// What the kernel has is known from what was committed, and read back only
// in a full sync (start-up, after a failure, drift): `nft -j list table` of
// each tenant table, whose rules and sets carry kpng's tag comments (a
// chain's listed tags, in order, and its hook make its digest, compared
// with the declared one). So an unchanged tenant costs nothing, a restarted
// kpng whose tenants declare what the kernel holds writes nothing, and a
// table someone else changed is written back.
//
// Per tenant, a sync writes: tables (a table whose set types or base-chain
// hooks changed is deleted and made again, in the same transaction), sets,
// chains, the rules of chains that changed (flushed and written whole),
// element differences (only the keys changed since the last commit; every
// key after a read-back), then chains, sets and tables no longer declared.
// An element of a set with timeouts is deleted as "add, then delete" in
// one transaction: it may have expired already, and deleting a missing
// element would fail the whole transaction.
import type { Logger } from '../../../runtime/log.js';
import type { NftEvent } from '../../../kernel/nftables.js';
import type { DeclaredContent, TenantDataplane, TenantLedger } from '../../../aggregator/dataplane.js';
import { tenantKey, tenantOfKey, tenantOfTable } from '../../../aggregator/names.js';
import { chainDigest, hookText, setId, tagOfComment, type NftFamily, type TenantElement, type TenantNftSet, type TenantNftTable } from '../../../aggregator/nft-content.js';
import type { Tenant } from '../../../aggregator/tenant.js';
import { atom, unwrap, verdictOrData, type Nft } from './nft.js';
import { Transaction, type ElementData, type TableRef } from './transaction.js';

/** A tenant table as committed (or as listed, after a read-back). */
interface CommittedTable {
  /** chain -> its digest and hook text */
  readonly chains: Map<string, { digest: string; hook: string }>;
  /** set -> its tag */
  readonly sets: Map<string, string>;
  /** set -> key -> value ('' in a set) */
  readonly elements: Map<string, Map<string, string>>;
  /** set -> key -> when it expires (elements with a timeout); listed with a timeout: Infinity, unknown */
  readonly expires: Map<string, Map<string, number>>;
}

type J = any;

const NFPROTO: Record<string, number> = { inet: 1, ip: 2, ip6: 10 };

export interface NftTenantTablesOptions {
  readonly nft: Nft;
  readonly ledger: TenantLedger;
  readonly log: Logger;
  /** the packet mark bits kpng's rules use */
  readonly reservedMark: number;
  /** a tenant's change: sync (ProxierBase.otherChanged) */
  readonly changed: (key: string) => void;
}

/**
 * The tenants' tables of an nftables backend, when the node agent has
 * tenants and no other backend of its stream writes them (not for a dry
 * run or --once, which take no tenants).
 */
export function nftTenantTables(o: Omit<NftTenantTablesOptions, 'ledger'> & { readonly tenants?: TenantLedger; readonly dryRun?: boolean; readonly once?: boolean }): NftTenantTables | undefined {
  if (!o.tenants || o.dryRun || o.once) return undefined;
  const tables = new NftTenantTables({ ...o, ledger: o.tenants });
  if (o.tenants.attach(tables)) return tables;
  o.log.info("tenants' content is written by another backend of this node");
  return undefined;
}

/** The keys of a sync that are the Services' (the others are tenants'). */
export const serviceKeys = (keys: readonly string[]): string[] => keys.filter((k) => tenantOfKey(k) === undefined);

/** The tenants' part of an nftables backend's syncs. */
export class NftTenantTables implements TenantDataplane {
  readonly family = 'nftables' as const;
  readonly reservedMark: number;
  /** tenant -> "family kernelName" -> table */
  private readonly committed = new Map<string, Map<string, CommittedTable>>();
  /** tables of tenants whose content was not known at the last read-back: read when the tenant declares */
  private readonly unlisted = new Map<string, { family: NftFamily; name: string }[]>();

  constructor(private readonly o: NftTenantTablesOptions) {
    this.reservedMark = o.reservedMark;
  }

  changed(key: string): void {
    this.o.changed(key);
  }

  /** a change event about a tenant table (any tenant's: they are all kpng's to write) */
  ours(e: NftEvent): boolean {
    return tenantOfTable(e.table) !== undefined && Object.values(NFPROTO).includes(e.family);
  }

  /** Only checks that the kernel takes a Declare's tables, as if made anew (nothing changes). */
  async check(_tenant: string, content: DeclaredContent): Promise<void> {
    const d = content.nftables;
    if (!d) return;
    const tx = new Transaction();
    const elements = new Transaction();
    for (const t of d.tables.values()) {
      const ref = refOf(t);
      // add-then-delete: the check stands whether or not the table is there
      tx.add({ kind: 'table', ...ref }).delete({ kind: 'table', ...ref });
      writeTable(tx, elements, t, (id) => d.elements.get(id));
    }
    await this.o.nft.run(tx.append(elements), { check: true });
  }

  /**
   * Reads the tenants' tables back (a full sync): those of tenants whose
   * content is known, in full; the others are reported to the ledger, which
   * keeps them as they are until their tenant declares or its grace ends.
   */
  async adopt(): Promise<void> {
    this.committed.clear();
    this.unlisted.clear();
    const tables = (await this.o.nft.listTables?.()) ?? [];
    for (const { family, name } of tables) {
      const owner = tenantOfTable(name);
      if (!owner || NFPROTO[family] === undefined) continue;
      const t = this.o.ledger.tenant(owner.tenant);
      if (!t) this.o.ledger.found(owner.tenant);
      if (!t?.known) {
        const list = this.unlisted.get(owner.tenant) ?? [];
        this.unlisted.set(owner.tenant, [...list, { family: family as NftFamily, name }]);
        continue;
      }
      await this.readBack(t.name, family as NftFamily, name);
    }
  }

  /**
   * Before a sync renders: the tables of tenants it carries whose content
   * was unknown at the last read-back (a kpng restarted while they were
   * away) are read now, so that declaring what the kernel holds writes nothing.
   */
  private async prepare(keys: readonly string[]): Promise<void> {
    if (!this.unlisted.size) return;
    for (const k of keys) {
      const name = tenantOfKey(k);
      const tables = name === undefined ? undefined : this.unlisted.get(name);
      if (!tables) continue;
      this.unlisted.delete(name!);
      for (const t of tables) await this.readBack(name!, t.family, t.name);
    }
  }

  private async readBack(tenant: string, family: NftFamily, name: string): Promise<void> {
    let doc: unknown;
    try {
      doc = await this.o.nft.listJson?.(family, name);
    } catch (e) {
      // not known: the next write makes it whole
      this.o.log.warn({ tenant, table: `${family} ${name}`, err: (e as Error).message }, `tenant ${tenant}: its table ${family} ${name} could not be read back; it is written whole`);
      return;
    }
    if (doc === undefined) return;
    let m = this.committed.get(tenant);
    if (!m) this.committed.set(tenant, (m = new Map()));
    m.set(`${family} ${name}`, fromListing(doc));
  }

  /**
   * The tenants' part of a sync (after the backend read the kernel back in
   * a full one, adopt): the tables of tenants it carries that were not read
   * yet are read, then render.
   */
  async sync(req: { keys: readonly string[]; full: boolean; check: boolean }, heldBack: (key: string) => boolean): Promise<{ tx: Transaction; commit(): void }> {
    await this.prepare(req.keys);
    return this.render(req, heldBack);
  }

  /** ProxierBase.onRefused: a tenant's key the kernel refuses puts the tenant back to its last good content */
  refused(key: string, why: string): boolean {
    const name = tenantOfKey(key);
    return name !== undefined && this.o.ledger.refused(name, why);
  }

  /** the backend stops: the tenants' tables stay, nobody writes them until another backend attaches */
  close(): void {
    this.o.ledger.detach(this);
  }

  /**
   * The tenants' part of a sync: those whose keys it carries (all of them
   * in a full sync), except those held back (a check-only search for what
   * the kernel refuses); commit() records it as applied and answers the
   * tenants' requests.
   */
  private render(req: { keys: readonly string[]; full: boolean; check: boolean }, heldBack: (key: string) => boolean): { tx: Transaction; commit(): void } {
    const structure = new Transaction();
    const elements = new Transaction();
    const removals = new Transaction();
    const commits: (() => void)[] = [];
    const carried = new Set<string>();
    for (const k of req.keys) {
      const name = tenantOfKey(k);
      if (name !== undefined) carried.add(name);
    }
    // and those with changes not committed yet (taken by an earlier check of this sync)
    const names = new Set(carried);
    for (const t of this.o.ledger.tenants()) if (req.full || t.desired.touched.size || t.desired.structureChanged) names.add(t.name);
    if (req.full) for (const name of this.committed.keys()) names.add(name);
    const now = Date.now();
    for (const name of names) {
      if (heldBack(tenantKey(name))) continue;
      if (carried.has(name)) this.o.ledger.take(name);
      const t = this.o.ledger.tenant(name);
      if (!t?.known) continue;
      // its own part first: a tenant that cannot be rendered leaves nothing behind
      const mine = { structure: new Transaction(), elements: new Transaction(), removals: new Transaction() };
      let commit: () => void;
      try {
        commit = this.renderTenant(t, req.full, now, mine);
      } catch (e) {
        // one tenant's content never stops the others' sync
        this.o.log.error({ tenant: name, err: (e as Error).message }, `tenant ${name}: its content could not be rendered; left out`);
        if (!req.check) this.o.ledger.refused(name, `kpng could not render it: ${(e as Error).message}`);
        continue;
      }
      const changes = mine.elements.elementCount + mine.structure.ops.length + mine.removals.ops.length;
      structure.append(mine.structure);
      elements.append(mine.elements);
      removals.append(mine.removals);
      commits.push(() => {
        commit();
        this.o.ledger.applied(name, changes);
        // nothing of the tenant's own changed, yet the kernel's copy did: someone else changed it
        if (req.full && changes > 0 && !carried.has(name)) this.o.ledger.repaired(name);
      });
    }
    return { tx: structure.append(elements).append(removals), commit: () => commits.forEach((c) => c()) };
  }

  /**
   * Renders one tenant's differences; returns what records them as
   * committed. While its structure is as committed, only the sets whose
   * elements changed are looked at: an element change costs its elements.
   */
  private renderTenant(t: Tenant, full: boolean, now: number, tx: { structure: Transaction; elements: Transaction; removals: Transaction }): () => void {
    const before = this.committed.get(t.name) ?? new Map<string, CommittedTable>();
    const after = new Map<string, CommittedTable>();
    const commits: (() => void)[] = [];
    const structural = full || t.desired.structureChanged;
    for (const table of t.desired.tables.values()) {
      const id = `${table.family} ${table.kernelName}`;
      const ref = refOf(table);
      let c = before.get(id);
      if (c && structural && needsRebuild(table, c)) c = undefined;
      if (!c) {
        // made whole: whatever the kernel has of it goes first (one being rebuilt, one a failed read-back did not see)
        tx.structure.add({ kind: 'table', ...ref }).delete({ kind: 'table', ...ref });
        writeTable(tx.structure, tx.elements, table, (sid) => t.desired.elements.get(sid));
        after.set(id, committedOf(table, t, now));
        continue;
      }
      after.set(id, c);
      if (structural) commits.push(renderStructure(table, c, tx));
      const sets = structural ? [...table.sets.values()] : touchedSets(table, t.desired.touched);
      for (const s of sets) commits.push(this.renderElements(t, table, s, c, full, now, tx.elements));
    }
    for (const id of before.keys()) {
      if (after.has(id)) continue;
      const [family, name] = id.split(' ') as [NftFamily, string];
      tx.removals.delete({ kind: 'table', family, name });
    }
    return () => {
      for (const c of commits) c();
      t.desired.touched.clear();
      t.desired.structureChanged = false;
      if (after.size) this.committed.set(t.name, after);
      else this.committed.delete(t.name);
    };
  }

  /** One set's element differences: the keys changed since the last commit, or every key (all). */
  private renderElements(t: Tenant, table: TenantNftTable, s: TenantNftSet, c: CommittedTable, all: boolean, now: number, tx: Transaction): () => void {
    const id = setId(table.family, table.kernelName, s.name);
    const desired = t.desired.elements.get(id);
    const have = c.elements.get(s.name) ?? new Map<string, string>();
    const expires = c.expires.get(s.name) ?? new Map<string, number>();
    const keys: Iterable<string> = all ? new Set([...(desired?.keys() ?? []), ...have.keys()]) : (t.desired.touched.get(id) ?? []);
    const preAdds: ElementData[] = [];
    const deletes: ElementData[] = [];
    const adds: ElementData[] = [];
    const done: (() => void)[] = [];
    const remove = (key: string, value: string) => {
      if (s.timeout) preAdds.push({ set: s.name, key, value, comment: '' });
      deletes.push({ set: s.name, key, value: '', comment: '' });
    };
    for (const key of keys) {
      const d = desired?.get(key);
      const at = expires.get(key);
      const cv = at !== undefined && at <= now ? undefined : have.get(key);
      const ttl = d ? d.timeoutMs || s.timeoutMs : 0;
      if (d) {
        if (cv === d.value && (!ttl || all)) continue;
        if (cv !== undefined && cv !== d.value) remove(key, cv);
        adds.push(elementData(s.name, d));
        done.push(() => (have.set(key, d.value), ttl ? expires.set(key, now + ttl) : expires.delete(key)));
      } else if (cv !== undefined) {
        // after a read-back: what the packet path added, and what expires by itself, stay
        if (all && (s.dynamic || at !== undefined)) continue;
        remove(key, cv);
        done.push(() => (have.delete(key), expires.delete(key)));
      } else if (have.has(key)) done.push(() => (have.delete(key), expires.delete(key)));
    }
    const ref = refOf(table);
    tx.addElements(ref, s.name, preAdds).deleteElements(ref, s.name, deletes).addElements(ref, s.name, adds);
    return () => {
      for (const f of done) f();
      c.elements.set(s.name, have);
      c.expires.set(s.name, expires);
    };
  }
}

const refOf = (t: TenantNftTable): TableRef => ({ family: t.family, name: t.kernelName });

const hookDeclaration = (c: { hook?: { type: string; hook: string; priority: number; policy: string } }): string | undefined =>
  c.hook && `type ${c.hook.type} hook ${c.hook.hook} priority ${c.hook.priority} ; policy ${c.hook.policy} ;`;

const elementData = (set: string, e: TenantElement): ElementData => ({ set, key: e.key, value: e.value, comment: '', ...(e.timeoutMs ? { timeoutMs: e.timeoutMs } : {}) });

/** a set's type or a base chain's hook changed: nft cannot change them in place */
function needsRebuild(t: TenantNftTable, c: CommittedTable): boolean {
  for (const s of t.sets.values()) {
    const tag = c.sets.get(s.name);
    if (tag !== undefined && tag !== s.tag) return true;
  }
  for (const ch of t.chains.values()) {
    const have = c.chains.get(ch.name);
    if (have && have.hook !== hookText(ch.hook)) return true;
  }
  return false;
}

/** A committed table's sets, chains and rules against the declared ones; returns what records them as committed. */
function renderStructure(table: TenantNftTable, c: CommittedTable, tx: { structure: Transaction; removals: Transaction }): () => void {
  const ref = refOf(table);
  const changedChains: string[] = [];
  for (const s of table.sets.values()) if (!c.sets.has(s.name)) tx.structure.add({ kind: s.kind, table: ref, name: s.name, body: s.body });
  for (const ch of table.chains.values()) {
    const have = c.chains.get(ch.name);
    if (have?.digest === ch.digest) continue;
    if (!have) tx.structure.add({ kind: 'chain', table: ref, name: ch.name, hook: hookDeclaration(ch) });
    changedChains.push(ch.name);
  }
  for (const name of changedChains) {
    if (c.chains.has(name)) tx.structure.flush({ kind: 'chain', table: ref, name });
    for (const rule of table.chains.get(name)!.rules) tx.structure.add({ kind: 'rule', table: ref, chain: name, rule });
  }
  // no longer declared: chains (flushed first: they may jump to each other), then sets
  const goneChains = [...c.chains.keys()].filter((n) => !table.chains.has(n));
  for (const name of goneChains) tx.removals.flush({ kind: 'chain', table: ref, name });
  for (const name of goneChains) tx.removals.delete({ kind: 'chain', table: ref, name });
  const goneSets = [...c.sets.keys()].filter((n) => !table.sets.has(n));
  for (const name of goneSets) tx.removals.delete({ kind: 'set', table: ref, name, body: '' });
  return () => {
    for (const name of changedChains) {
      const ch = table.chains.get(name)!;
      c.chains.set(name, { digest: ch.digest, hook: hookText(ch.hook) });
    }
    for (const name of goneChains) c.chains.delete(name);
    for (const s of table.sets.values()) c.sets.set(s.name, s.tag);
    for (const name of goneSets) (c.sets.delete(name), c.elements.delete(name), c.expires.delete(name));
  };
}

/** the sets of a table whose elements changed since the last commit */
function touchedSets(table: TenantNftTable, touched: ReadonlyMap<string, unknown>): TenantNftSet[] {
  const prefix = `${table.family} ${table.kernelName} `;
  const out: TenantNftSet[] = [];
  for (const id of touched.keys()) {
    const s = id.startsWith(prefix) ? table.sets.get(id.slice(prefix.length)) : undefined;
    if (s) out.push(s);
  }
  return out;
}

/** A whole table: declared, with its sets, chains, rules and elements. */
function writeTable(tx: Transaction, elements: Transaction, t: TenantNftTable, elementsOf: (id: string) => ReadonlyMap<string, TenantElement> | undefined): void {
  const ref = refOf(t);
  tx.add({ kind: 'table', ...ref, comment: `kpng tenant ${t.kernelName.split('.')[1]}` });
  for (const s of t.sets.values()) tx.add({ kind: s.kind, table: ref, name: s.name, body: s.body });
  // every chain before any rule: rules jump between them
  for (const c of t.chains.values()) tx.add({ kind: 'chain', table: ref, name: c.name, hook: hookDeclaration(c) });
  for (const c of t.chains.values()) for (const rule of c.rules) tx.add({ kind: 'rule', table: ref, chain: c.name, rule });
  for (const s of t.sets.values()) {
    const list = elementsOf(setId(t.family, t.kernelName, s.name));
    if (list?.size) elements.addElements(ref, s.name, [...list.values()].map((e) => elementData(s.name, e)));
  }
}

/** what a table written whole from desired is, once committed */
function committedOf(t: TenantNftTable, tenant: Tenant, now: number): CommittedTable {
  const c: CommittedTable = { chains: new Map(), sets: new Map(), elements: new Map(), expires: new Map() };
  for (const ch of t.chains.values()) c.chains.set(ch.name, { digest: ch.digest, hook: hookText(ch.hook) });
  for (const s of t.sets.values()) {
    c.sets.set(s.name, s.tag);
    const have = new Map<string, string>();
    const expires = new Map<string, number>();
    for (const e of tenant.desired.elements.get(setId(t.family, t.kernelName, s.name))?.values() ?? []) {
      have.set(e.key, e.value);
      const ttl = e.timeoutMs || s.timeoutMs;
      if (ttl) expires.set(e.key, now + ttl);
    }
    c.elements.set(s.name, have);
    c.expires.set(s.name, expires);
  }
  return c;
}

/** A tenant table as `nft -j list table` gives it. */
function fromListing(doc: J): CommittedTable {
  const c: CommittedTable = { chains: new Map(), sets: new Map(), elements: new Map(), expires: new Map() };
  const hooks = new Map<string, string>();
  const tags = new Map<string, string[]>();
  for (const o of doc?.nftables ?? []) {
    if (o.chain) {
      const ch = o.chain;
      hooks.set(ch.name, ch.hook ? `${ch.type} ${ch.hook} ${ch.prio} ${ch.policy ?? 'accept'}` : '');
      tags.set(ch.name, []);
    } else if (o.rule) tags.get(o.rule.chain)?.push(tagOfComment(o.rule.comment));
    else if (o.set || o.map) {
      const s = o.set ?? o.map;
      c.sets.set(s.name, tagOfComment(s.comment));
      const have = new Map<string, string>();
      const expires = new Map<string, number>();
      for (const el of s.elem ?? []) {
        const [k, v] = o.map ? (el as [J, J]) : [el, undefined];
        const { val, timeout } = unwrap(k);
        const key = atom(val);
        have.set(key, o.map ? verdictOrData(v) : '');
        if (timeout !== undefined) expires.set(key, Infinity);
      }
      c.elements.set(s.name, have);
      c.expires.set(s.name, expires);
    }
  }
  for (const [name, hook] of hooks) c.chains.set(name, { digest: chainDigest(hook, tags.get(name) ?? []), hook });
  return c;
}
