// Running the kpng CLI as a real process, from the sources.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';

export const ROOT = fileURLToPath(new URL('../..', import.meta.url));
export const KPNG = [process.execPath, '--import', 'tsx', `${ROOT}src/cli/index.ts`];

/** the command line running kpng with args, in a network namespace when given (`ip netns exec` execs it: same pid) */
function commandLine(args: string[], netns?: string): [string, ...string[]] {
  return netns ? ['ip', 'netns', 'exec', netns, ...KPNG, ...args] : [KPNG[0]!, ...KPNG.slice(1), ...args];
}

export function kpngSync(args: string[], opts: { timeoutMs?: number; env?: NodeJS.ProcessEnv; netns?: string } = {}) {
  const [cmd, ...rest] = commandLine(args, opts.netns);
  const r = spawnSync(cmd, rest, { cwd: ROOT, encoding: 'utf8', timeout: opts.timeoutMs ?? 30_000, env: { ...process.env, ...opts.env } });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** A running kpng (in the network namespace netns, when given); always stop() it in a finally/after hook. */
export function kpngSpawn(args: string[], opts: { env?: NodeJS.ProcessEnv; netns?: string } = {}) {
  const [cmd, ...rest] = commandLine(args, opts.netns);
  const p: ChildProcess = spawn(cmd, rest, { cwd: ROOT, env: { ...process.env, ...opts.env } });
  let stdout = '';
  let stderr = '';
  p.stdout!.on('data', (d) => (stdout += d));
  p.stderr!.on('data', (d) => (stderr += d));
  const exited = new Promise<number | null>((r) => p.on('exit', (code) => r(code)));
  return {
    process: p,
    get stdout() { return stdout; },
    get stderr() { return stderr; },
    exited,
    async until(cond: () => boolean, what: string, ms = 15_000) {
      const end = Date.now() + ms;
      while (!cond()) {
        if (Date.now() > end) throw new Error(`timed out waiting for ${what}\nstdout:\n${stdout}\nstderr:\n${stderr}`);
        if (p.exitCode !== null) throw new Error(`kpng exited (${p.exitCode}) before ${what}\nstderr:\n${stderr}`);
        await new Promise((r) => setTimeout(r, 25));
      }
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
