// Running nft: one `nft -f -` per transaction (atomic), and reading back a
// table (`nft -j list table`) only for a full reconcile: at start-up, to
// adopt what a previous kpng left behind, and after a failure.
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { ToolError, firstLines, runTool } from '../shared/tool.js';
import type { ElementValue } from './elements.js';

export class NftError extends ToolError {}

export function runNft(args: string[], input?: string, nftPath = 'nft'): Promise<string> {
  return runTool(nftPath, args, input, NftError);
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

/**
 * A long-lived `nft -i` for small transactions. A fresh `nft` per
 * transaction costs a process start and, after any delete, an RCU grace
 * period when its netlink socket closes (the kernel flushes deleted objects
 * then): 6-24 ms here, against 0.3-0.5 ms for a line sent to a running nft.
 *
 * Each transaction is one line (its commands joined by ';', so nft applies
 * it atomically), followed by a marker line nft rejects: the marker's error
 * on stderr says the transaction is done, and anything before it is the
 * transaction's own error. The process is replaced after `maxRuns`
 * transactions (nft keeps every line in its history) and after any failure;
 * HOME=/dev/null keeps it from writing a history file.
 */
export class NftSession {
  private proc?: ChildProcessWithoutNullStreams;
  private stderr = '';
  private pending?: { marker: string; resolve: () => void; reject: (e: Error) => void; timer: NodeJS.Timeout };
  private queue: Promise<void> = Promise.resolve();
  private seq = 0;
  private runs = 0;
  private answered = false;
  private broken = false;

  constructor(
    private readonly nftPath = 'nft',
    private readonly opts: { maxRuns?: number; timeoutMs?: number } = {},
  ) {}

  /** Applies a transaction (newline-separated commands) atomically; one at a time. */
  run(text: string): Promise<void> {
    const next = this.queue.then(() => this.runNow(text));
    this.queue = next.catch(() => {});
    return next;
  }

  /**
   * False once a transaction got no answer (a timeout, nft gone) from a
   * session that never answered: this nft does not speak the marker
   * protocol, and its user falls back to a process per transaction.
   */
  get usable(): boolean {
    return !this.broken;
  }

  /** Ends the nft process (it exits when its input closes). */
  close(): void {
    const p = this.proc;
    this.proc = undefined;
    p?.stdin.end();
  }

  private runNow(text: string): Promise<void> {
    const line = text
      .split('\n')
      .filter((l) => l.trim() !== '')
      .join('; ');
    if (!line) return Promise.resolve();
    const proc = this.proc ?? this.start();
    const marker = `kpng-sync-${++this.seq}`;
    return new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.fail(new NftError(`${this.nftPath} -i: no answer in ${this.timeoutMs} ms`, this.stderr));
        proc.kill('SIGKILL');
      }, this.timeoutMs);
      this.pending = { marker, resolve, reject, timer };
      setRef(proc, true);
      proc.stdin.write(`${line}\n${marker}\n`);
    });
  }

  private get timeoutMs(): number {
    return this.opts.timeoutMs ?? 30_000;
  }

  private start(): ChildProcessWithoutNullStreams {
    const p = spawn(this.nftPath, ['-i'], { stdio: ['pipe', 'pipe', 'pipe'], env: { ...process.env, HOME: '/dev/null' } });
    this.proc = p;
    this.stderr = '';
    this.runs = 0;
    p.stdout.on('data', () => {}); // nothing is expected there; keep the pipe flowing
    p.stderr.on('data', (d: Buffer) => {
      if (this.proc !== p) return;
      this.stderr += d.toString();
      this.check();
    });
    p.stdin.on('error', () => {}); // reported by 'exit'
    p.on('error', (e) => this.proc === p && this.fail(new NftError(`cannot run ${this.nftPath}: ${e.message}`, '')));
    p.on('exit', (code, signal) => this.proc === p && this.fail(new NftError(`${this.nftPath} -i exited (${signal ?? code})`, this.stderr)));
    setRef(p, false);
    return p;
  }

  /** the marker's error (its line, then a line of carets) ends the pending transaction */
  private check() {
    const w = this.pending;
    if (!w) return;
    const at = this.stderr.indexOf(`\n${w.marker}\n`);
    if (at < 0) return;
    const caretsEnd = this.stderr.indexOf('\n', at + w.marker.length + 2);
    if (caretsEnd < 0) return;
    // what precedes the marker's "Error: syntax error ..." line is the transaction's
    const headerStart = this.stderr.lastIndexOf('\n', at - 1) + 1;
    const own = this.stderr.slice(0, headerStart);
    this.stderr = this.stderr.slice(caretsEnd + 1);
    this.pending = undefined;
    clearTimeout(w.timer);
    if (this.proc) setRef(this.proc, false);
    if (/Error/.test(own)) {
      // a failed transaction changed nothing; a fresh process for the next one
      this.close();
      w.reject(new NftError(`${this.nftPath} -i failed: ${firstLines(own, 6)}`, own));
      return;
    }
    this.answered = true;
    if (++this.runs >= (this.opts.maxRuns ?? 1000)) this.close();
    w.resolve();
  }

  private fail(e: Error) {
    const p = this.proc;
    this.proc = undefined;
    p?.stdin.end();
    const w = this.pending;
    this.pending = undefined;
    if (!w) return;
    clearTimeout(w.timer);
    if (!this.answered) this.broken = true;
    w.reject(e);
  }
}

/** an idle session must not keep the process alive; a pending transaction must */
function setRef(p: ChildProcessWithoutNullStreams, on: boolean) {
  for (const h of [p, p.stdin, p.stdout, p.stderr] as { ref(): void; unref(): void }[]) (on ? h.ref() : h.unref());
}
