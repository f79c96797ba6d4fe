// Running nft: one `nft -f -` per transaction (atomic), and reading back a
// table (`nft -j list table`) only for a full reconcile: at start-up, to
// adopt what a previous kpng left behind, and after a failure.
import { spawn } from 'node:child_process';
import type { ElementValue } from './elements.js';

export class NftError extends Error {
  constructor(
    message: string,
    readonly stderr: string,
  ) {
    super(message);
  }
}

export function runNft(args: string[], input?: string, nftPath = 'nft'): Promise<string> {
  return new Promise((resolve, reject) => {
    const p = spawn(nftPath, args, { stdio: ['pipe', 'pipe', 'pipe'] });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    p.stdout.on('data', (d) => out.push(d));
    p.stderr.on('data', (d) => err.push(d));
    p.on('error', (e) => reject(new NftError(`cannot run ${nftPath}: ${e.message}`, '')));
    p.on('close', (code) => {
      const stderr = Buffer.concat(err).toString();
      if (code === 0) resolve(Buffer.concat(out).toString());
      else reject(new NftError(`${nftPath} ${args.join(' ')} failed (exit ${code}): ${firstLines(stderr, 6)}`, stderr));
    });
    p.stdin.on('error', () => {}); // nft may exit before reading everything; 'close' reports why
    p.stdin.end(input ?? '');
  });
}

function firstLines(s: string, n: number): string {
  const lines = s.trim().split('\n');
  return lines.slice(0, n).join(' | ') + (lines.length > n ? ` | ... (${lines.length - n} more lines)` : '');
}

export interface TableListing {
  readonly chains: Set<string>;
  /** set/map name -> its type, as nft lists it (to detect a changed layout) */
  readonly sets: Map<string, string>;
  readonly elements: Map<string, Map<string, ElementValue>>;
}

/** Lists a table; undefined when it does not exist. */
export async function listTable(family: 'ip' | 'ip6', table: string, nftPath = 'nft'): Promise<TableListing | undefined> {
  let out: string;
  try {
    out = await runNft(['-j', 'list', 'table', family, table], undefined, nftPath);
  } catch (e) {
    if (e instanceof NftError && /No such file or directory/.test(e.stderr)) return undefined;
    throw e;
  }
  return parseListing(JSON.parse(out));
}

type J = any;

export function parseListing(doc: J): TableListing {
  const chains = new Set<string>();
  const sets = new Map<string, string>();
  const elements = new Map<string, Map<string, ElementValue>>();
  for (const o of doc.nftables ?? []) {
    if (o.chain) chains.add(o.chain.name);
    const s = o.set ?? o.map;
    if (!s) continue;
    sets.set(s.name, JSON.stringify([s.type, s.map ?? null]));
    const m = new Map<string, ElementValue>();
    for (const el of s.elem ?? []) {
      if (o.map) {
        const [k, v] = el as [J, J];
        const { val, comment } = unwrap(k);
        m.set(atom(val), { value: verdictOrData(v), comment: comment ?? '' });
      } else {
        const { val, comment } = unwrap(el);
        m.set(atom(val), { value: '', comment: comment ?? '' });
      }
    }
    elements.set(s.name, m);
  }
  return { chains, sets, elements };
}

function unwrap(x: J): { val: J; comment?: string } {
  if (x && typeof x === 'object' && 'elem' in x) return { val: x.elem.val, comment: x.elem.comment };
  return { val: x };
}

/** JSON element (key or data) in the text form kpng renders */
function atom(x: J): string {
  if (typeof x === 'string' || typeof x === 'number') return String(x);
  if (x.concat) return (x.concat as J[]).map(atom).join(' . ');
  if (x.prefix) return `${atom(x.prefix.addr)}/${x.prefix.len}`;
  if (x.range) return `${atom(x.range[0])}-${atom(x.range[1])}`;
  if (x.elem) return atom(x.elem.val);
  return JSON.stringify(x);
}

function verdictOrData(v: J): string {
  if (v && typeof v === 'object') {
    if (v.goto) return `goto ${v.goto.target}`;
    if (v.jump) return `jump ${v.jump.target}`;
    if ('drop' in v) return 'drop';
    if ('accept' in v) return 'accept';
    if ('return' in v) return 'return';
  }
  return atom(v);
}
