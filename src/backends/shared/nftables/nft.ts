// Driving nft: the Nft interface kpng's nftables code talks to, and its
// implementations on the system's nft: SessionNft (long-lived `nft -i`
// sessions: a transaction as one line, a big one as a file it includes) and
// ProcessNft (a process per transaction); check-only transactions and table
// listings (`nft -j list table`, only for a full reconcile) run a process of
// their own; everything with a time limit. FakeNft (fake.ts) is the third,
// in memory, for tests.
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ToolError, firstLines, runTool } from '../tool.js';
import type { ElementValue } from './transaction.js';
import type { TableFamily, Transaction } from './transaction.js';
import type { DriftSource, OwnCommits } from '../drift.js';
import { KernelError } from '../../../kernel/libc.js';
import { NetlinkElements, NetlinkRefused } from './netlink.js';

export class NftError extends ToolError {}

/** What kpng's nftables code needs of nft (nft.ts: the system's; fake.ts: an in-memory one). */
export interface Nft {
  /**
   * Applies a transaction atomically; with check, only asks whether nft and
   * the kernel would take it; bulk: a part of a big load (nothing watches
   * for drift meanwhile), which may go to the kernel over netlink. Resolves
   * with the bytes it sent, when it counts them.
   */
  run(tx: Transaction | string, opts?: RunOptions): Promise<number | void>;
  /** A table as the kernel has it; undefined when it does not exist. */
  list(family: TableFamily, table: string): Promise<TableListing | undefined>;
  /** A table as `nft -j list table` gives it (tenants' tables: their rules' comments, chains' hooks); undefined when it does not exist. */
  listJson?(family: TableFamily, table: string): Promise<unknown>;
  /** every table in the kernel (`nft -j list tables`) */
  listTables?(): Promise<{ family: string; name: string }[]>;
  /** runs every commit from now on inside ledger.own() (the drift watch: its transactions are kpng's own) */
  commitsTo?(ledger: OwnCommits): void;
  /** its own drift detector, when the kernel's change events do not apply (the fake) */
  drift?(): DriftSource;
  close(): void;
}

export interface RunOptions {
  readonly check?: boolean;
  readonly bulk?: boolean;
}

export function runNft(args: string[], input?: string, nftPath = 'nft', o: { timeoutMs?: number } = {}): Promise<string> {
  return runTool(nftPath, args, { input, errorClass: NftError, summary: nftErrors, ...o });
}

/** transactions up to this size go to a session as one line; bigger ones as a file it includes */
const SESSION_MAX_BYTES = 128 * 1024;

export interface ProcessNftOptions {
  readonly path?: string;
  /** transactions at once (a cold start's chunks); default 1 */
  readonly parallel?: number;
  /** per transaction (default 60 s) */
  readonly timeoutMs?: number;
  /**
   * Transactions of element adds and deletes only (a sync's, a bulk load's
   * big ones) go to the kernel over netlink (netlink.ts), in this network
   * namespace (a name under /run/netns, or a path), or this process's when
   * undefined. Only when the nft used is the one of that namespace.
   */
  readonly netlink?: { readonly netns?: string };
  /** told once when netlink cannot be used and elements go to nft as text */
  readonly onNetlinkFallback?: (msg: string) => void;
}

/** element-only transactions of at least this many elements go over netlink (smaller ones cost nft little) */
const NETLINK_MIN_ELEMENTS = 1000;

/** The system's nft, a process per transaction (`nft -f -`), with a time limit. */
export class ProcessNft implements Nft {
  readonly path: string;
  private active = 0;
  private readonly waiting: (() => void)[] = [];
  private ledger?: OwnCommits;

  private netlink?: NetlinkElements;

  constructor(protected readonly o: ProcessNftOptions = {}) {
    this.path = o.path ?? 'nft';
    if (o.netlink) this.netlink = new NetlinkElements(o.netlink.netns);
  }

  async run(tx: Transaction | string, opts: RunOptions = {}): Promise<number> {
    if (opts.check) {
      const text = typeof tx === 'string' ? tx : tx.render();
      if (text) await runNft(['-c', '-f', '-'], text, this.path, this.procOpts());
      return text.length;
    }
    await this.acquire();
    try {
      // a change's few elements too: nft would parse them and read back what it needs of the table, which grows with the Services
      if (typeof tx !== 'string' && this.netlink && (!opts.bulk || tx.elementCount >= NETLINK_MIN_ELEMENTS) && this.netlink.takes(tx)) {
        try {
          const netlink = this.netlink;
          return await this.commit(() => netlink.run(tx));
        } catch (e) {
          if (!(e instanceof KernelError)) throw e;
          // refused: nft says why (and the batch changed nothing); anything else: netlink does not work here
          if (!(e instanceof NetlinkRefused)) {
            this.netlink.close();
            this.netlink = undefined;
            this.o.onNetlinkFallback?.(`elements go to nft as text: ${e.message}`);
          }
        }
      }
      const text = typeof tx === 'string' ? tx : tx.render();
      if (!text) return 0;
      await this.commit(() => this.apply(text));
      if (typeof tx !== 'string') this.netlink?.learn(tx);
      return text.length;
    } finally {
      this.release();
    }
  }

  async list(family: TableFamily, table: string): Promise<TableListing | undefined> {
    const doc = await this.listJson(family, table);
    return doc === undefined ? undefined : parseListing(doc);
  }

  async listJson(family: TableFamily, table: string): Promise<unknown> {
    // a node without the table (every cold start) asks no nft
    if ((await this.netlink?.hasTable(family, table).catch(() => undefined)) === false) return undefined;
    let out: string;
    try {
      out = await runNft(['-j', 'list', 'table', family, table], undefined, this.path, this.procOpts());
    } catch (e) {
      if (e instanceof NftError && e.isNotFound) return undefined;
      throw e;
    }
    return JSON.parse(out);
  }

  async listTables(): Promise<{ family: string; name: string }[]> {
    const doc = JSON.parse(await runNft(['-j', 'list', 'tables'], undefined, this.path, this.procOpts()));
    return ((doc.nftables ?? []) as J[]).flatMap((o) => (o.table ? [{ family: String(o.table.family), name: String(o.table.name) }] : []));
  }

  commitsTo(ledger: OwnCommits): void {
    this.ledger = ledger;
  }

  close(): void {
    this.netlink?.close();
  }

  /** applies one transaction's text (one of `parallel` at most at a time) */
  protected async apply(text: string): Promise<void> {
    await runNft(['-f', '-'], text, this.path, this.procOpts());
  }

  protected procOpts() {
    return { timeoutMs: this.o.timeoutMs };
  }

  /** one transaction that changes the ruleset, noted as kpng's own */
  private commit<T>(fn: () => Promise<T>): Promise<T> {
    return this.ledger ? this.ledger.own(fn) : fn();
  }

  private async acquire(): Promise<void> {
    while (this.active >= Math.max(1, this.o.parallel ?? 1)) await new Promise<void>((r) => this.waiting.push(r));
    this.active++;
  }

  private release(): void {
    this.active--;
    this.waiting.shift()?.();
  }
}

export interface SessionNftOptions extends ProcessNftOptions {
  /** told once when sessions do not answer and each transaction runs its own nft */
  readonly onFallback?: (msg: string) => void;
}

/**
 * The system's nft through long-lived `nft -i` sessions (NftSession): a
 * transaction as one line, a big one as a file the session includes; one
 * session per transaction running at once. An nft whose sessions never
 * answer is used a process per transaction from then on (told once).
 * Check-only transactions and listings run a process of their own.
 */
export class SessionNft extends ProcessNft {
  private readonly idle: NftSession[] = [];
  private sessionsWork = true;

  constructor(private readonly so: SessionNftOptions = {}) {
    super(so);
  }

  override close(): void {
    super.close();
    for (const s of this.idle.splice(0)) s.close();
  }

  /** Starts the session's nft now: a fork of this process costs more as it grows. */
  warm(): void {
    if (!this.sessionsWork || this.idle.length) return;
    const s = this.session();
    s.warm();
    this.idle.push(s);
  }

  private session(): NftSession {
    return new NftSession(this.path, { timeoutMs: this.so.timeoutMs });
  }

  protected override async apply(text: string): Promise<void> {
    if (!this.sessionsWork) return super.apply(text);
    const session = this.idle.pop() ?? this.session();
    try {
      if (text.length <= SESSION_MAX_BYTES) await session.run(text);
      else await this.include(session, text);
    } finally {
      if (!session.usable && this.sessionsWork) {
        this.sessionsWork = false;
        this.so.onFallback?.(`${this.path} -i did not answer as expected: each transaction runs its own nft from now on`);
      }
      // one session stays warm; extra ones (a cold start's) end
      if (this.idle.length === 0 && session.usable) this.idle.push(session);
      else session.close();
    }
  }

  /**
   * A big transaction as a file the session includes: nft reads it by itself
   * (through a pipe it would wait for this process, maybe busy computing the
   * next chunk of a cold start).
   */
  private async include(session: NftSession, text: string): Promise<void> {
    // a directory of its own, gone right after: nothing stays behind a killed kpng but this one
    const dir = mkdtempSync(join(tmpdir(), 'kpng-nft-'));
    const file = join(dir, 'tx.nft');
    writeFileSync(file, text);
    try {
      await session.run(`include "${file}"`);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }
}

/** how much of a failing line an error shows on each side of the part nft points at */
const EXCERPT = 60;

/**
 * nft's errors, short: each "where: Error: what" with the part of the
 * failing line nft points at (a transaction's line can be many KB, and a
 * failing sync is retried), at most `max` of them.
 */
export function nftErrors(stderr: string, max = 3): string {
  const lines = stderr.split('\n');
  const out: string[] = [];
  let errors = 0;
  for (let i = 0; i < lines.length; i++) {
    const m = /^(?:[^:]*:(\d+):\d+-\d+: )?(Error: .*)$/.exec(lines[i]);
    if (!m) continue;
    if (++errors > max) continue;
    let text = m[2];
    // the failing line, then carets under the part nft means (`nft -f` also names the line)
    const failing = lines[i + 1];
    const carets = /^(\s*)(\^+)\s*$/.exec(lines[i + 2] ?? '');
    if (failing !== undefined && carets) {
      const a = Math.max(0, carets[1].length - EXCERPT);
      const b = Math.min(failing.length, carets[1].length + carets[2].length + EXCERPT);
      text += ` (${m[1] ? `line ${m[1]}: ` : ''}${a > 0 ? '...' : ''}${failing.slice(a, b)}${b < failing.length ? '...' : ''})`;
      i += 2;
    }
    out.push(text);
  }
  if (!out.length) return firstLines(stderr, 6);
  return out.join(' | ') + (errors > max ? ` | ... (${errors - max} more errors)` : '');
}

export interface TableListing {
  readonly chains: Set<string>;
  /** set/map name -> its type, as nft lists it (to detect a changed layout) */
  readonly sets: Map<string, string>;
  readonly elements: Map<string, Map<string, ElementValue>>;
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

/** a listed element (key) without its options: its value, comment, and timeout (seconds) */
export function unwrap(x: J): { val: J; comment?: string; timeout?: number } {
  if (x && typeof x === 'object' && 'elem' in x) return { val: x.elem.val, comment: x.elem.comment, timeout: x.elem.timeout };
  return { val: x };
}

/** JSON element (key or data) in the text form kpng renders */
export function atom(x: J): string {
  if (typeof x === 'string' || typeof x === 'number') return String(x);
  if (x.concat) return (x.concat as J[]).map(atom).join(' . ');
  if (x.prefix) return `${atom(x.prefix.addr)}/${x.prefix.len}`;
  if (x.range) return `${atom(x.range[0])}-${atom(x.range[1])}`;
  if (x.elem) return atom(x.elem.val);
  return JSON.stringify(x);
}

export function verdictOrData(v: J): string {
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
 * then): milliseconds, where a line sent to a running nft costs a fraction
 * of one (docs/nft.md).
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

  /** Starts the nft process before the first transaction needs it. */
  warm(): void {
    if (!this.proc) this.start();
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
    // the next transaction starts one again
    if (proc.pid === undefined) return new Promise((_, reject) => proc.once('error', (e) => reject(new NftError(`cannot run ${this.nftPath}: ${e.message}`, ''))));
    const marker = `kpng-sync-${++this.seq}`;
    return new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.fail(new NftError(`${this.nftPath} -i: no answer in ${this.timeoutMs} ms`, this.stderr, -1, 'nft', true));
        proc.kill('SIGKILL');
      }, this.timeoutMs);
      this.pending = { marker, resolve, reject, timer };
      setRef(proc, true);
      proc.stdin.write(`${line}\n${marker}\n`);
    });
  }

  private get timeoutMs(): number {
    return this.opts.timeoutMs ?? 60_000;
  }

  private start(): ChildProcessWithoutNullStreams {
    const p = spawn(this.nftPath, ['-i'], { stdio: ['pipe', 'pipe', 'pipe'], env: { ...process.env, HOME: '/dev/null' } });
    if (p.pid === undefined) {
      // no process (EMFILE: no file left for its pipes), and no streams: the transaction that wanted it fails (runNow)
      p.on('error', () => {});
      return p;
    }
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
      w.reject(new NftError(`${this.nftPath} -i failed: ${nftErrors(own)}`, own, 1, 'nft'));
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
