// Running the kpng CLI as a real process, from the sources.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { until, type UntilOptions } from './until.js';

export const ROOT = fileURLToPath(new URL('../..', import.meta.url));
export const KPNG = [process.execPath, '--import', 'tsx', `${ROOT}src/cli/index.ts`];

/**
 * the command line running kpng with args: from the sources through tsx, or
 * with bin as a user runs it (node bin/kpng.js); in a network namespace when
 * given (`ip netns exec` execs it: same pid)
 */
function commandLine(args: string[], netns?: string, bin?: boolean): [string, ...string[]] {
  const kpng = bin ? [process.execPath, join(ROOT, 'bin/kpng.js')] : KPNG;
  return netns ? ['ip', 'netns', 'exec', netns, ...kpng, ...args] : [kpng[0]!, ...kpng.slice(1), ...args];
}

export function kpngSync(args: string[], opts: { timeoutMs?: number; env?: NodeJS.ProcessEnv; netns?: string } = {}) {
  const [cmd, ...rest] = commandLine(args, opts.netns);
  const r = spawnSync(cmd, rest, { cwd: ROOT, encoding: 'utf8', timeout: opts.timeoutMs ?? 30_000, env: { ...process.env, ...opts.env } });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** A running kpng (see commandLine); always stop() it in a finally/after hook. */
export function kpngSpawn(args: string[], opts: { env?: NodeJS.ProcessEnv; netns?: string; bin?: boolean } = {}) {
  const [cmd, ...rest] = commandLine(args, opts.netns, opts.bin);
  const p: ChildProcess = spawn(cmd, rest, { cwd: ROOT, env: { ...process.env, ...opts.env } });
  let stdout = '';
  let stderr = '';
  p.stdout!.setEncoding('utf8').on('data', (d) => (stdout += d));
  p.stderr!.setEncoding('utf8').on('data', (d) => (stderr += d));
  const exited = new Promise<number | null>((r) => p.on('exit', (code) => r(code)));
  return {
    process: p,
    get stdout() { return stdout; },
    get stderr() { return stderr; },
    exited,
    /** until() that also gives up when kpng exits, and shows what it printed */
    until(what: string, cond: () => boolean | Promise<boolean>, o: UntilOptions = {}) {
      return until(what, cond, {
        timeoutMs: 15_000,
        everyMs: 25,
        ...o,
        failIf: () => (p.exitCode !== null ? `kpng exited (${p.exitCode})` : undefined),
        detail: () => `\nstdout:\n${stdout.slice(-3000)}\nstderr:\n${stderr.slice(-3000)}`,
      });
    },
    async stop(signal: NodeJS.Signals = 'SIGTERM') {
      if (p.exitCode === null && p.signalCode === null) {
        p.kill(signal);
        const t = setTimeout(() => p.kill('SIGKILL'), 5000);
        await exited;
        clearTimeout(t);
      }
    },
  };
}
