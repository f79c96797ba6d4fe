// Running a dataplane tool (nft, iptables-restore, conntrack, ...): its input
// on stdin, its output back, a time limit; a failure is a ToolError that
// names the tool, carries its exit code and stderr, and says what kind of
// failure it was.
import { spawn } from 'node:child_process';

export class ToolError extends Error {
  constructor(
    message: string,
    readonly stderr: string,
    /** the tool's exit code; -1: it could not run, or was killed (see timedOut) */
    readonly code = -1,
    /** the tool, e.g. "nft" */
    readonly tool = '',
    readonly timedOut = false,
  ) {
    super(message);
    this.name = new.target.name;
  }

  /** the tool is not installed (or not executable) */
  get isNotInstalled(): boolean {
    return this.code === -1 && !this.timedOut && /ENOENT|EACCES/.test(this.message);
  }

  /** the object the command named does not exist (ENOENT from the kernel) */
  get isNotFound(): boolean {
    return /No such file or directory|does not exist|No chain\/target\/match by that name/.test(this.stderr);
  }

  /** the object exists already, or overlaps one that does (EEXIST) */
  get isExists(): boolean {
    return /File exists/.test(this.stderr);
  }

  /** the object is in use: a chain referenced or not empty (EBUSY), or a lock held */
  get isBusy(): boolean {
    return /Device or resource busy|Resource temporarily unavailable|holding the xtables lock/.test(this.stderr) || this.code === 4;
  }
}

export interface RunToolOptions {
  readonly input?: string;
  /** the error class to throw (a ToolError) */
  readonly errorClass?: typeof ToolError;
  /** makes the error message of stderr (default: its first lines) */
  readonly summary?: (stderr: string) => string;
  /** kill the tool after this long (default 60 s; 0: never) */
  readonly timeoutMs?: number;
}

const DEFAULT_TIMEOUT_MS = 60_000;

/** Runs path with args; resolves with stdout, rejects with a ToolError. */
export function runTool(path: string, args: string[], o: RunToolOptions = {}): Promise<string> {
  const ErrorClass = o.errorClass ?? ToolError;
  const tool = path.slice(path.lastIndexOf('/') + 1);
  return new Promise((resolve, reject) => {
    const p = spawn(path, args, { stdio: ['pipe', 'pipe', 'pipe'] });
    let timedOut = false;
    const limit = o.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    const timer = limit > 0 ? setTimeout(() => ((timedOut = true), p.kill('SIGKILL')), limit) : undefined;
    // first: a spawn that fails (EMFILE: no file left for its pipes) has no streams, and says why here only
    p.on('error', (e) => {
      clearTimeout(timer);
      reject(new ErrorClass(`cannot run ${path}: ${e.message}`, '', -1, tool));
    });
    if (p.pid === undefined) return;
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    p.stdout.on('data', (d) => out.push(d));
    p.stderr.on('data', (d) => err.push(d));
    p.on('close', (code) => {
      clearTimeout(timer);
      const stderr = Buffer.concat(err).toString();
      if (code === 0) return resolve(Buffer.concat(out).toString());
      if (timedOut) return reject(new ErrorClass(`${path} ${args.join(' ')}: no answer in ${limit} ms (killed)`, stderr, -1, tool, true));
      reject(new ErrorClass(`${path} ${args.join(' ')} failed (exit ${code}): ${(o.summary ?? ((e) => firstLines(e, 6)))(stderr)}`, stderr, code ?? -1, tool));
    });
    p.stdin.on('error', () => {}); // the tool may exit before reading everything; 'close' says why
    p.stdin.end(o.input ?? '');
  });
}

/** The first n lines of a tool's output, on one line. */
export function firstLines(s: string, n: number): string {
  const lines = s.trim().split('\n');
  return lines.slice(0, n).join(' | ') + (lines.length > n ? ` | ... (${lines.length - n} more lines)` : '');
}
