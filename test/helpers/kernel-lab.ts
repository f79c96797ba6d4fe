// Tests in the kernel lab (docs/kernel-lab.md): whether it can run here (in
// CI it must: a missing one fails), and TypeScript run in the guest with JSON
// in and out, so a test's guest half uses the project's own code (the lab,
// kpng) as the host does.
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { kernelLabUnavailable, runInVm, type VmRunOptions } from '../../src/lab/vm/index.js';

const RESULT = 'KPNG-VMLAB-RESULT ';
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

/**
 * Runs a TypeScript file in the kernel lab (`node --import tsx FILE` in the
 * repository), input as JSON on its stdin; resolves with what its guestMain
 * returned. Rejects when the VM fails, the script fails or times out.
 */
export async function runScriptInVm<T>(file: string, input: unknown, opts: Pick<VmRunOptions, 'timeoutMs' | 'memoryMiB' | 'cpus'> = {}): Promise<GuestRun<T>> {
  const r = await runInVm([process.execPath, '--import', 'tsx', file], { ...opts, cwd: ROOT, input: JSON.stringify(input), env: { KPNG_TEST: '1' } });
  const lines = r.output.split('\n');
  const line = lines.find((l) => l.startsWith(RESULT));
  if (r.status !== 0 || !line) {
    throw new Error(`${file} in the kernel lab ${r.timedOut ? 'timed out' : `ended with status ${r.status}`} after ${r.ms} ms:\n${r.output.slice(-6000)}`);
  }
  return { result: JSON.parse(line.slice(RESULT.length)) as T, log: lines.filter((l) => !l.startsWith(RESULT)).join('\n').trim(), bootMs: r.bootMs, ms: r.ms };
}

/** True when the module (its import.meta.url) is the script node was started with. */
export function isMain(moduleUrl: string): boolean {
  return process.argv[1] === fileURLToPath(moduleUrl);
}

/** The guest half of runScriptInVm: reads the input, runs fn, prints its result. */
export async function guestMain<I, O>(fn: (input: I) => Promise<O>): Promise<void> {
  const out = await fn(JSON.parse(readFileSync(0, 'utf8')) as I);
  console.log(RESULT + JSON.stringify(out));
}
