// Running the kpng CLI as a real process, from the sources.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { until, type UntilOptions } from './until.js';

export const ROOT = fileURLToPath(new URL('../..', import.meta.url));
export const KPNG = [process.execPath, '--import', 'tsx', `${ROOT}src/cli/index.ts`];

export function kpngSync(args: string[], opts: { timeoutMs?: number; env?: NodeJS.ProcessEnv } = {}) {
  const r = spawnSync(KPNG[0], [...KPNG.slice(1), ...args], { cwd: ROOT, encoding: 'utf8', timeout: opts.timeoutMs ?? 30_000, env: { ...process.env, ...opts.env } });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

/**
 * A running kpng; always stop() it in a finally/after hook. From the sources
 * through tsx, or with bin as a user runs it (node bin/kpng.js).
 */
export function kpngSpawn(args: string[], opts: { env?: NodeJS.ProcessEnv; bin?: boolean } = {}) {
  const command = opts.bin ? [process.execPath, join(ROOT, 'bin/kpng.js')] : KPNG;
  const p: ChildProcess = spawn(command[0], [...command.slice(1), ...args], { cwd: ROOT, env: { ...process.env, ...opts.env } });
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
    until(what: string, cond: () => boolean, o: UntilOptions = {}) {
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
