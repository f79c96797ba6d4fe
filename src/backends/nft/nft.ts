// Running nft: one `nft -f -` per transaction (atomic), and reading back a
// table (`nft -j list table`) only for a full reconcile: at start-up, to
// adopt what a previous kpng left behind, and after a failure.
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { ToolError, firstLines, runTool } from '../shared/tool.js';
import type { ElementValue } from './elements.js';

export class NftError extends ToolError {}

export function runNft(args: string[], input?: string, nftPath = 'nft'): Promise<string> {
  return runTool(nftPath, args, input, NftError, nftErrors);
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
      w.reject(new NftError(`${this.nftPath} -i failed: ${nftErrors(own)}`, own));
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
