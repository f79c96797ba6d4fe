// runInVm: a command under Debian's kernel in QEMU (TCG), with the host's
// files. The VM is always killed and its run directory removed: when the
// command ends, on timeout, on abort, when this process exits or is
// interrupted, and (setpriv --pdeathsig) when it dies.
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync, openSync, readSync, closeSync, fstatSync } from 'node:fs';
import { join } from 'node:path';
import { alive } from '../netns.js';
import { GUEST_RUN_DIR, MARK, findTool, kernelLabDir, kernelLabUnavailable, readManifest } from './prepare.js';

export interface VmRunOptions {
  /** the whole run, boot included; then the VM is killed (status 124, timedOut). Default 5 min. */
  timeoutMs?: number;
  /** the command's working directory in the guest (the host's paths are the guest's). Default / */
  cwd?: string;
  /** the command's environment besides PATH, HOME, LANG and KPNG_VMLAB=1 (the guest starts from a clean one) */
  env?: Record<string, string>;
  /** the command's stdin (default: empty) */
  input?: string;
  /** guest memory, MiB (default 2048: a lab of node processes) */
  memoryMiB?: number;
  /** guest CPUs (default 2: QEMU runs one host thread per CPU) */
  cpus?: number;
  /** kills the VM; runInVm then rejects with the signal's reason */
  signal?: AbortSignal;
}

export interface VmRunResult {
  /** the command's exit status; 124 when timedOut */
  status: number;
  /** its stdout and stderr, merged (at most the last MAX_OUTPUT bytes) */
  output: string;
  timedOut: boolean;
  /** from starting QEMU to the guest starting the command */
  bootMs: number;
  ms: number;
  kernel: string;
}

const MAX_OUTPUT = 8 << 20;
const CONSOLE_TAIL = 16_000;

/** Quotes an argument for bash. */
export function shellQuote(s: string): string {
  return /^[\w@%+=:,./-]+$/.test(s) ? s : `'${s.replace(/'/g, `'\\''`)}'`;
}

interface LiveRun {
  kill(): void;
  dir: string;
}
const live = new Set<LiveRun>();
let hooked = false;

function cleanupSync() {
  for (const r of live) {
    r.kill();
    rmSync(r.dir, { recursive: true, force: true });
  }
  live.clear();
}

const SIGNALS: NodeJS.Signals[] = ['SIGINT', 'SIGTERM', 'SIGHUP'];
function onSignal(sig: NodeJS.Signals) {
  cleanupSync();
  // nobody else handles it: die of it, as without us
  if (process.listenerCount(sig) === 1) {
    process.removeListener(sig, onSignal);
    process.kill(process.pid, sig);
  }
}

function track(r: LiveRun) {
  if (!hooked) {
    hooked = true;
    process.on('exit', cleanupSync);
  }
  if (live.size === 0) for (const s of SIGNALS) process.on(s, onSignal);
  live.add(r);
}

function untrack(r: LiveRun) {
  live.delete(r);
  if (live.size === 0) for (const s of SIGNALS) process.removeListener(s, onSignal);
}

/** Run directories of runs whose process is gone (killed before it could clean up). */
export function removeStaleRuns(runs = join(kernelLabDir(), 'runs')): string[] {
  const removed: string[] = [];
  let names: string[] = [];
  try {
    names = readdirSync(runs);
  } catch {
    return removed;
  }
  for (const n of names) {
    const m = /^(\d+)-[0-9a-f]+$/.exec(n);
    if (!m || Number(m[1]) === process.pid || alive(Number(m[1]))) continue;
    rmSync(join(runs, n), { recursive: true, force: true });
    removed.push(n);
  }
  return removed;
}

/** The run directories in use (by this and other processes). */
export function listRuns(runs = join(kernelLabDir(), 'runs')): string[] {
  try {
    return readdirSync(runs);
  } catch {
    return [];
  }
}

function tail(path: string, max: number): string {
  if (!existsSync(path)) return '';
  const fd = openSync(path, 'r');
  try {
    const size = fstatSync(fd).size;
    const n = Math.min(size, max);
    const b = Buffer.alloc(n);
    readSync(fd, b, 0, n, size - n);
    return (size > max ? `[... ${size - max} bytes cut]\n` : '') + b.toString('utf8');
  } finally {
    closeSync(fd);
  }
}

/**
 * Runs a command in the kernel lab: a bash script (a string), or a program
 * and its arguments (an array). Resolves with its status and output, or
 * status 124 and timedOut when the time ran out; rejects when the VM could
 * not run it (not prepared, boot failure: with the console's last lines).
 */
export async function runInVm(command: string | string[], opts: VmRunOptions = {}): Promise<VmRunResult> {
  const why = kernelLabUnavailable();
  if (why) throw new Error(why);
  const m = readManifest()!;
  if (opts.signal?.aborted) throw opts.signal.reason ?? new Error('aborted');
  const timeoutMs = opts.timeoutMs ?? 300_000;
  const lines = ['set +e'];
  for (const [k, v] of Object.entries(opts.env ?? {})) {
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(k)) throw new Error(`runInVm: bad environment variable name ${JSON.stringify(k)}`);
    lines.push(`export ${k}=${shellQuote(v)}`);
  }
  lines.push(`cd ${shellQuote(opts.cwd ?? '/')} || exit 125`);
  const stdin = opts.input !== undefined ? `< ${GUEST_RUN_DIR}/input` : '';
  if (typeof command === 'string') lines.push(`exec /bin/bash ${GUEST_RUN_DIR}/command.sh ${stdin}`);
  else if (!command.length) throw new Error('runInVm: empty command');
  else lines.push(`exec ${command.map(shellQuote).join(' ')} ${stdin}`);

  const runs = join(kernelLabDir(), 'runs');
  mkdirSync(runs, { recursive: true });
  removeStaleRuns(runs);
  const dir = join(runs, `${process.pid}-${randomBytes(4).toString('hex')}`);
  mkdirSync(dir, { mode: 0o755 });
  try {
    if (opts.input !== undefined) writeFileSync(join(dir, 'input'), opts.input);
    if (typeof command === 'string') writeFileSync(join(dir, 'command.sh'), command);
    writeFileSync(join(dir, 'cmd.sh'), lines.join('\n') + '\n');
  } catch (e) {
    rmSync(dir, { recursive: true, force: true });
    throw e;
  }

  const qemu = [
    findTool('qemu-system-x86_64')!,
    ...['-accel', 'tcg', '-cpu', 'max', '-m', String(opts.memoryMiB ?? 2048), '-smp', String(opts.cpus ?? 2)],
    ...['-nodefaults', '-no-user-config', '-display', 'none', '-no-reboot'],
    ...['-chardev', 'stdio,id=console,signal=off', '-serial', 'chardev:console'],
    ...['-kernel', m.vmlinux, '-initrd', m.initrd],
    ...['-append', 'console=ttyS0 panic=-1 quiet mitigations=off tsc=reliable cryptomgr.notests'],
    ...['-virtfs', 'local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap'],
    ...['-virtfs', `local,path=${dir},mount_tag=run,security_model=none`],
  ];
  // setpriv: QEMU dies with this process, however it dies
  const setpriv = findTool('setpriv');
  const argv = setpriv ? [setpriv, '--pdeathsig', 'KILL', '--', ...qemu] : qemu;

  const t0 = Date.now();
  const p = spawn(argv[0], argv.slice(1), { stdio: ['ignore', 'pipe', 'pipe'] });
  let exited = false;
  const run: LiveRun = {
    dir,
    kill: () => {
      if (!exited) p.kill('SIGKILL');
    },
  };
  track(run);

  let consoleText = '';
  let bootMs = -1;
  let status: number | undefined;
  let failure: string | undefined;
  let timedOut = false;
  const onData = (d: Buffer) => {
    consoleText += d.toString('utf8');
    if (bootMs < 0 && consoleText.includes(MARK.begin)) bootMs = Date.now() - t0;
    status ??= ((s) => (s ? Number(s[1]) : undefined))(MARK.status.exec(consoleText));
    failure ??= MARK.fail.exec(consoleText)?.[1];
    if (consoleText.length > 4 * CONSOLE_TAIL) consoleText = consoleText.slice(-CONSOLE_TAIL);
  };
  p.stdout!.on('data', onData);
  p.stderr!.on('data', onData);

  const timer = setTimeout(() => {
    timedOut = true;
    run.kill();
  }, timeoutMs);
  const onAbort = () => run.kill();
  opts.signal?.addEventListener('abort', onAbort, { once: true });
  try {
    const exit = await new Promise<string>((resolve) => {
      p.on('error', (e) => resolve(e.message));
      p.on('close', (code, sig) => resolve(sig ? `signal ${sig}` : `status ${code}`));
    });
    exited = true;
    const ms = Date.now() - t0;
    const output = tail(join(dir, 'output'), MAX_OUTPUT);
    if (opts.signal?.aborted) throw opts.signal.reason ?? new Error('aborted');
    if (timedOut) return { status: 124, output, timedOut, bootMs, ms, kernel: m.kernel };
    if (status === undefined) {
      // the guest writes its status to the run directory too: trust it if the console lost it
      const s = existsSync(join(dir, 'status')) ? Number(readFileSync(join(dir, 'status'), 'utf8').trim()) : NaN;
      if (Number.isInteger(s)) status = s;
    }
    if (status === undefined) {
      const why = failure ? `the guest failed: ${failure}` : `QEMU ended (${exit}) before the command reported a status`;
      throw new Error(`kernel lab: ${why}\n--- console (last lines) ---\n${consoleText.slice(-CONSOLE_TAIL).trim()}\n--- command output ---\n${output.slice(-4000)}`);
    }
    return { status, output, timedOut, bootMs, ms, kernel: m.kernel };
  } finally {
    clearTimeout(timer);
    opts.signal?.removeEventListener('abort', onAbort);
    run.kill();
    untrack(run);
    rmSync(dir, { recursive: true, force: true });
  }
}
