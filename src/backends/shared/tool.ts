// Running a dataplane tool (nft, iptables-restore, ...): its input on stdin,
// its output back; a failure carries stderr and names its first lines.
import { spawn } from 'node:child_process';

export class ToolError extends Error {
  constructor(
    message: string,
    readonly stderr: string,
    /** the tool's exit code; -1 = it could not run */
    readonly code = -1,
  ) {
    super(message);
  }
}

/** Runs path with args, input on stdin; resolves with stdout, rejects with an ErrorClass (a ToolError) whose message `summary` makes of stderr. */
export function runTool(path: string, args: string[], input?: string, ErrorClass: typeof ToolError = ToolError, summary: (stderr: string) => string = (e) => firstLines(e, 6)): Promise<string> {
  return new Promise((resolve, reject) => {
    const p = spawn(path, args, { stdio: ['pipe', 'pipe', 'pipe'] });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    p.stdout.on('data', (d) => out.push(d));
    p.stderr.on('data', (d) => err.push(d));
    p.on('error', (e) => reject(new ErrorClass(`cannot run ${path}: ${e.message}`, '')));
    p.on('close', (code) => {
      const stderr = Buffer.concat(err).toString();
      if (code === 0) resolve(Buffer.concat(out).toString());
      else reject(new ErrorClass(`${path} ${args.join(' ')} failed (exit ${code}): ${summary(stderr)}`, stderr, code ?? -1));
    });
    p.stdin.on('error', () => {}); // the tool may exit before reading everything; 'close' says why
    p.stdin.end(input ?? '');
  });
}

/** The first n lines of a tool's output, on one line. */
export function firstLines(s: string, n: number): string {
  const lines = s.trim().split('\n');
  return lines.slice(0, n).join(' | ') + (lines.length > n ? ` | ... (${lines.length - n} more lines)` : '');
}
