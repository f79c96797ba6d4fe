// Tests in the kernel lab (docs/kernel-lab.md): whether it can run here (in
// CI it must: a missing one fails), and TypeScript run in the guest with JSON
// in and out, so a test's guest half uses the project's own code (the lab,
// kpng) as the host does.
import { readFileSync } from 'node:fs';
import { constants } from 'node:os';
import { fileURLToPath } from 'node:url';
import { EMULATION_FAULTS } from '../../src/lab/lab.js';
import { kernelLabUnavailable, runInVm, shellQuote, type VmRunOptions } from '../../src/lab/vm/index.js';

const RESULT = 'KPNG-VMLAB-RESULT ';
const PARTIAL = 'KPNG-VMLAB-PARTIAL ';
const ROOT = fileURLToPath(new URL('../../', import.meta.url));

/** The skip option of a suite that needs the kernel lab: its reason, or false (always false in CI, see requireKernelLab). */
export function kernelLabSkip(): string | false {
  const why = kernelLabUnavailable();
  return why && process.env.CI !== 'true' ? why : false;
}

/** For the suite's before(): throws when the kernel lab cannot run (in CI, where kernelLabSkip does not skip). */
export function requireKernelLab(): void {
  const why = kernelLabUnavailable();
  if (why) throw new Error(why);
}

export interface GuestRun<T> {
  result: T;
  /** what the guest printed besides the result */
  log: string;
  bootMs: number;
  ms: number;
}

/** The guest script failed (or the VM did): what it handed out before (emitPartial), in order. */
export class GuestRunFailed extends Error {
  constructor(
    message: string,
    readonly partials: unknown[],
  ) {
    super(message);
  }
}

// when the script fails, the guest says what it can about why: killed by the
// OOM killer (oom_kill counts), memory left, the kernel's last words
const ON_FAILURE = `s=$?; if [ $s -ne 0 ]; then echo "guest: the script ended with status $s; $(grep oom_kill /proc/vmstat); $(grep MemAvailable /proc/meminfo)"; dmesg | tail -n 25; fi; exit $s`;

/**
 * Runs a TypeScript file in the kernel lab (`node --import tsx FILE` in the
 * repository), input as JSON on its stdin; resolves with what its guestMain
 * returned. Rejects (GuestRunFailed) when the VM fails, the script fails or
 * times out.
 */
export async function runScriptInVm<T>(file: string, input: unknown, opts: Pick<VmRunOptions, 'timeoutMs' | 'memoryMiB' | 'cpus'> = {}): Promise<GuestRun<T>> {
  let r;
  for (let attempt = 1; ; attempt++) {
    try {
      r = await runInVm(`${[process.execPath, '--import', 'tsx', file].map(shellQuote).join(' ')}\n${ON_FAILURE}\n`, { ...opts, cwd: ROOT, input: JSON.stringify(input), env: { KPNG_TEST: '1' } });
    } catch (e) {
      throw new GuestRunFailed((e as Error).message, []);
    }
    // 132, 139: node died of SIGILL or SIGSEGV, QEMU's emulation (TCG)
    // failing on V8's generated code (see Lab.startKpng): a fresh VM runs it
    // again, once
    const status = r.status;
    const signal = EMULATION_FAULTS.find((s) => status === 128 + constants.signals[s]);
    if (!signal || attempt > 1) break;
    // the guest kernel's line about it (ON_FAILURE prints its log), if any
    const trap = r.output.split('\n').filter((l) => /trap invalid opcode|segfault at|general protection/.test(l));
    console.log(`# ${file}: the guest's node died of ${signal} (QEMU's emulation); running it again in a fresh VM${trap.length ? `\n# ${trap.join('\n# ')}` : ''}`);
  }
  const lines = r.output.split('\n');
  const line = lines.find((l) => l.startsWith(RESULT));
  if (r.status !== 0 || !line) {
    const partials = lines.filter((l) => l.startsWith(PARTIAL)).map((l) => JSON.parse(l.slice(PARTIAL.length)) as unknown);
    const output = lines.filter((l) => !l.startsWith(PARTIAL)).join('\n');
    throw new GuestRunFailed(`${file} in the kernel lab ${r.timedOut ? 'timed out' : `ended with status ${r.status}`} after ${r.ms} ms:\n${output.slice(-6000)}`, partials);
  }
  return { result: JSON.parse(line.slice(RESULT.length)) as T, log: lines.filter((l) => !l.startsWith(RESULT) && !l.startsWith(PARTIAL)).join('\n').trim(), bootMs: r.bootMs, ms: r.ms };
}

/** In the guest: hands part of the result out at once, so that it survives the script failing later (GuestRunFailed.partials). */
export function emitPartial(part: unknown): void {
  console.log(PARTIAL + JSON.stringify(part));
}

/** True when the module (its import.meta.url) is the script node was started with. */
export function isMain(moduleUrl: string): boolean {
  return process.argv[1] === fileURLToPath(moduleUrl);
}

/** The guest half of runScriptInVm: reads the input, runs fn, prints its result. */
export async function guestMain<I, O>(fn: (input: I) => Promise<O>): Promise<void> {
  // a stray rejection (a lab's helper process gone under the emulator's
  // timing, say) is logged, not the end of every case after it
  process.on('unhandledRejection', (e) => console.log(`guest: unhandled rejection (going on): ${(e as Error)?.stack ?? String(e)}`));
  const out = await fn(JSON.parse(readFileSync(0, 'utf8')) as I);
  console.log(RESULT + JSON.stringify(out));
}
