// An in-memory nft for tests (in the spirit of knftables' fake): it applies
// Transactions to a model of the tables with nft's rules for what fails
// (a missing object, an element that exists with other data, a chain still in
// use), atomically, and can dump() the model as text. No root, no kernel.
// Someone else changing the tables is `tamper()`, which the drift check sees.
import { NftError, type Nft, type TableListing } from './nft.js';
import type { ElementValue } from './transaction.js';
import type { Operation, TableFamily, TableRef, Transaction } from './transaction.js';
import type { DriftSource } from '../drift.js';

interface FakeChain {
  hook?: string;
  rules: string[];
}

interface FakeSet {
  kind: 'set' | 'map';
  body: string;
  elements: Map<string, ElementValue>;
}

export interface FakeTable {
  comment?: string;
  chains: Map<string, FakeChain>;
  sets: Map<string, FakeSet>;
}

const notFound = (what: string) => new NftError(`nft (fake): ${what}: No such file or directory`, `Error: Could not process rule: No such file or directory\n${what}\n`, 1, 'nft');
const exists = (what: string) => new NftError(`nft (fake): ${what}: File exists`, `Error: Could not process rule: File exists\n${what}\n`, 1, 'nft');
const busy = (what: string) => new NftError(`nft (fake): ${what}: Device or resource busy`, `Error: Could not process rule: Device or resource busy\n${what}\n`, 1, 'nft');

export class FakeNft implements Nft {
  /** "ip kpng" -> the table */
  tables = new Map<string, FakeTable>();
  /** transactions applied (checks and failures not counted) */
  transactions = 0;
  /** the last transactions' text, newest last (at most 20) */
  readonly history: string[] = [];
  /** makes the next transactions fail: return an error message to fail this one */
  failWhen?: (tx: Transaction) => string | undefined;
  private readonly watchers = new Set<(what: string) => void>();

  async run(tx: Transaction | string, opts: { check?: boolean } = {}): Promise<void> {
    if (typeof tx === 'string') throw new Error('FakeNft takes Transaction objects, not text');
    const injected = this.failWhen?.(tx);
    if (injected) throw new NftError(`nft (fake): ${injected}`, `Error: ${injected}\n`, 1, 'nft');
    const next = cloneTables(this.tables);
    for (const op of tx.ops) apply(next, op);
    if (opts.check) return;
    this.tables = next;
    this.transactions++;
    this.history.push(tx.render());
    if (this.history.length > 20) this.history.shift();
  }

  async list(family: TableFamily, table: string): Promise<TableListing | undefined> {
    const t = this.tables.get(`${family} ${table}`);
    if (!t) return undefined;
    return {
      chains: new Set(t.chains.keys()),
      sets: new Map([...t.sets].map(([n, s]) => [n, s.body])),
      elements: new Map([...t.sets].map(([n, s]) => [n, new Map(s.elements)])),
    };
  }

  close(): void {}

  /** Someone else changes the tables (the drift check notices). */
  tamper(what: string, fn: (tables: Map<string, FakeTable>) => void): void {
    fn(this.tables);
    for (const w of this.watchers) w(what);
  }

  /** A drift detector that sees tamper(). */
  drift(): DriftSource {
    let seen: string | undefined;
    const w = (what: string) => void (seen ??= what);
    this.watchers.add(w);
    return {
      start: () => void (seen = undefined),
      pause: () => {},
      resume: () => {},
      check: () => {
        const why = seen;
        seen = undefined;
        return why;
      },
      close: () => void this.watchers.delete(w),
    };
  }

  /** The tables as text, sorted: comparable in tests. */
  dump(): string {
    const out: string[] = [];
    for (const [name, t] of [...this.tables].sort(byKey)) {
      out.push(`table ${name} {${t.comment ? ` # ${t.comment}` : ''}`);
      for (const [sn, s] of [...t.sets].sort(byKey)) {
        out.push(`\t${s.kind} ${sn} { ${s.body} }`);
        for (const [k, v] of [...s.elements].sort(byKey)) out.push(`\t\t${k}${v.comment ? ` comment "${v.comment}"` : ''}${v.value ? ` : ${v.value}` : ''}`);
      }
      for (const [cn, c] of [...t.chains].sort(byKey)) {
        out.push(`\tchain ${cn} {${c.hook ? ` ${c.hook}` : ''}`);
        for (const r of c.rules) out.push(`\t\t${r}`);
        out.push('\t}');
      }
      out.push('}');
    }
    return out.join('\n') + '\n';
  }
}

const byKey = <T>(a: [string, T], b: [string, T]) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0);
const key = (t: TableRef) => `${t.family} ${t.name}`;

function cloneTables(tables: Map<string, FakeTable>): Map<string, FakeTable> {
  const out = new Map<string, FakeTable>();
  for (const [n, t] of tables) {
    out.set(n, {
      comment: t.comment,
      chains: new Map([...t.chains].map(([cn, c]) => [cn, { hook: c.hook, rules: [...c.rules] }])),
      sets: new Map([...t.sets].map(([sn, s]) => [sn, { kind: s.kind, body: s.body, elements: new Map(s.elements) }])),
    });
  }
  return out;
}

function table(tables: Map<string, FakeTable>, t: TableRef): FakeTable {
  const found = tables.get(key(t));
  if (!found) throw notFound(`table ${key(t)}`);
  return found;
}

/** chains a rule or an element value jumps to */
function targets(text: string): string[] {
  return [...text.matchAll(/\b(?:goto|jump) ([A-Za-z0-9_.-]+)/g)].map((m) => m[1]);
}

function inUse(t: FakeTable, chain: string): boolean {
  for (const c of t.chains.values()) if (c.rules.some((r) => targets(r).includes(chain))) return true;
  for (const s of t.sets.values()) for (const v of s.elements.values()) if (targets(v.value).includes(chain)) return true;
  return false;
}

function apply(tables: Map<string, FakeTable>, op: Operation): void {
  if ('elements' in op) {
    const t = table(tables, op.table);
    const s = t.sets.get(op.set);
    if (!s) throw notFound(`set ${key(op.table)} ${op.set}`);
    for (const e of op.elements) {
      const have = s.elements.get(e.key);
      if (op.verb === 'delete') {
        if (!have) throw notFound(`element ${op.set} { ${e.key} }`);
        s.elements.delete(e.key);
        continue;
      }
      if (have) {
        if (have.value !== e.value) throw exists(`element ${op.set} { ${e.key} }`);
        continue;
      }
      for (const c of targets(e.value)) if (!t.chains.has(c)) throw notFound(`chain ${c}`);
      s.elements.set(e.key, { value: e.value, comment: e.comment });
    }
    return;
  }
  const o = op.object;
  if (o.kind === 'table') {
    const k = key(o);
    if (op.verb === 'add') {
      const t = tables.get(k);
      if (t) t.comment = o.comment ?? t.comment;
      else tables.set(k, { comment: o.comment, chains: new Map(), sets: new Map() });
    } else if (op.verb === 'delete') {
      if (!tables.delete(k)) throw notFound(`table ${k}`);
    } else {
      const t = table(tables, o);
      for (const c of t.chains.values()) c.rules = [];
      for (const s of t.sets.values()) s.elements.clear();
    }
    return;
  }
  if (o.kind === 'rule') {
    const t = table(tables, o.table);
    const c = t.chains.get(o.chain);
    if (!c) throw notFound(`chain ${o.chain}`);
    for (const m of o.rule.matchAll(/@([A-Za-z0-9_.-]+)/g)) if (!t.sets.has(m[1])) throw notFound(`set ${m[1]}`);
    for (const target of targets(o.rule)) if (!t.chains.has(target)) throw notFound(`chain ${target}`);
    c.rules.push(o.rule);
    return;
  }
  const t = table(tables, o.table);
  if (o.kind === 'chain') {
    const c = t.chains.get(o.name);
    if (op.verb === 'add') {
      if (!c) t.chains.set(o.name, { hook: o.hook, rules: [] });
    } else if (!c) throw notFound(`chain ${o.name}`);
    else if (op.verb === 'flush') c.rules = [];
    else {
      if (c.rules.length || inUse(t, o.name)) throw busy(`chain ${o.name}`);
      t.chains.delete(o.name);
    }
    return;
  }
  const s = t.sets.get(o.name);
  if (op.verb === 'add') {
    if (s && s.body !== o.body) throw exists(`${o.kind} ${o.name}`);
    if (!s) t.sets.set(o.name, { kind: o.kind, body: o.body, elements: new Map() });
  } else if (!s) throw notFound(`${o.kind} ${o.name}`);
  else if (op.verb === 'flush') s.elements.clear();
  else {
    for (const c of t.chains.values()) if (c.rules.some((r) => r.includes(`@${o.name}`))) throw busy(`${o.kind} ${o.name}`);
    t.sets.delete(o.name);
  }
}
