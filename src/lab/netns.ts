// Network namespaces for the lab: names, `ip` invocations (always with -n or
// netns exec: never against the root namespace), and removal of leftovers
// from crashed earlier runs.
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, readFileSync, readdirSync, statSync } from 'node:fs';
import { randomBytes } from 'node:crypto';

export const NETNS_DIR = '/run/netns';
const PREFIX = 'kpng-';

export interface RunResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs a command with a hard timeout (then SIGKILL); never throws. */
export function run(cmd: string, args: string[], opts: { input?: string; timeoutMs?: number } = {}): Promise<RunResult> {
  return new Promise((resolve) => {
    const p = spawn(cmd, args, { stdio: ['pipe', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    p.stdout.on('data', (d) => (stdout += d));
    p.stderr.on('data', (d) => (stderr += d));
    const timer = setTimeout(() => {
      stderr += `\n(killed after ${opts.timeoutMs ?? 20_000} ms)`;
      p.kill('SIGKILL');
    }, opts.timeoutMs ?? 20_000);
    p.on('error', (e) => {
      clearTimeout(timer);
      resolve({ code: -1, stdout, stderr: stderr + e.message });
    });
    p.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
    p.stdin.on('error', () => {});
    p.stdin.end(opts.input ?? '');
  });
}

/** Like run, but throws with the command's stderr when it fails. */
export async function must(cmd: string, args: string[], opts: { input?: string; timeoutMs?: number } = {}): Promise<string> {
  const r = await run(cmd, args, opts);
  if (r.code !== 0) {
    const input = opts.input ? `\ninput:\n${opts.input}` : '';
    throw new Error(`${cmd} ${args.join(' ')} failed (${r.code}): ${r.stderr.trim()}${input}`);
  }
  return r.stdout;
}

/** `ip -n NS -batch -`: many commands, one process, inside NS. */
export function ipBatch(ns: string, lines: string[], family?: 4 | 6): Promise<string> {
  const args = family ? [`-${family}`, '-n', ns, '-batch', '-'] : ['-n', ns, '-batch', '-'];
  return must('ip', args, { input: lines.join('\n') + '\n' });
}

/**
 * A unique namespace-name stem for one lab: kpng-<tag>-<pid>-<random>. The
 * pid lets a later run tell a crashed run's leftovers from a live parallel run.
 */
export function labStem(tag: string): string {
  const t = tag.toLowerCase().replace(/[^a-z0-9]+/g, '').slice(0, 12) || 'lab';
  return `${PREFIX}${t}-${process.pid}-${randomBytes(3).toString('hex')}`;
}

export function listNamespaces(): string[] {
  try {
    return readdirSync(NETNS_DIR);
  } catch {
    return [];
  }
}

/** Whether a process lives (a run whose leftovers may be removed is gone). */
export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** Pids of the processes inside a namespace. */
export function pidsIn(ns: string): number[] {
  const r = spawnSync('ip', ['netns', 'pids', ns], { encoding: 'utf8', timeout: 10_000 });
  return (r.stdout ?? '')
    .split(/\s+/)
    .filter(Boolean)
    .map(Number)
    .filter((n) => Number.isInteger(n) && n > 1);
}

/**
 * Removes namespaces left by crashed earlier runs of the same tag: only ours
 * (prefix kpng-<tag>-), only when the run that made them is gone and they are
 * older than this process (olderThanMs). Their processes (agents, kpng) are
 * killed first.
 */
export function removeLeftovers(tag: string, olderThanMs = Date.now() - process.uptime() * 1000): string[] {
  const t = tag.toLowerCase().replace(/[^a-z0-9]+/g, '').slice(0, 12) || 'lab';
  const started = olderThanMs;
  const removed: string[] = [];
  for (const name of listNamespaces()) {
    const m = new RegExp(`^${PREFIX}${t}-(\\d+)-[0-9a-f]{6}-`).exec(name);
    if (!m) continue;
    const pid = Number(m[1]);
    if (pid === process.pid || alive(pid)) continue;
    let mtime = Infinity;
    try {
      mtime = statSync(`${NETNS_DIR}/${name}`).mtimeMs;
    } catch {
      continue;
    }
    if (mtime >= started) continue;
    for (const p of pidsIn(name)) {
      try {
        process.kill(p, 'SIGKILL');
      } catch {
        // gone already
      }
    }
    spawnSync('ip', ['netns', 'del', name], { timeout: 10_000 });
    removed.push(name);
  }
  return removed;
}

/** Deletes namespaces (synchronously: also usable from an exit handler). */
export function deleteNamespacesSync(names: string[]): void {
  if (!names.length) return;
  spawnSync('ip', ['-force', '-batch', '-'], { input: names.map((n) => `netns del ${n}`).join('\n') + '\n', timeout: 20_000, stdio: ['pipe', 'ignore', 'ignore'] });
}

export function hasTool(tool: string): boolean {
  return ['/usr/sbin', '/sbin', '/usr/bin', '/bin'].some((d) => existsSync(`${d}/${tool}`));
}

/** Why the lab cannot run here, or undefined when it can. */
export function labUnsupported(): string | undefined {
  if (process.platform !== 'linux') return 'the lab needs Linux network namespaces';
  if (process.getuid?.() !== 0) return 'the lab needs root (network namespaces, nftables)';
  for (const t of ['ip', 'nft']) if (!hasTool(t)) return `the lab needs the ${t} command (apt-get install ${t === 'ip' ? 'iproute2' : 'nftables'})`;
  return undefined;
}

export function kernelHasSCTP(): boolean {
  try {
    return /^SCTP/m.test(readFileSync('/proc/net/protocols', 'utf8'));
  } catch {
    return false;
  }
}
