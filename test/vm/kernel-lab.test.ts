// The kernel lab itself (docs/kernel-lab.md): Debian's kernel boots under
// QEMU with the host's files, runs a command and returns its output and
// status; it has the modules this machine's kernel lacks; a timeout, an
// abort and an interrupted or killed parent all leave no QEMU process and no
// run directory behind.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { kernelLabDir, listRuns, readManifest, removeStaleRuns, runInVm, type VmRunResult } from '../../src/lab/vm/index.js';
import { kernelLabSkip, requireKernelLab } from '../helpers/kernel-lab.js';
import { until } from '../helpers/until.js';

const RUN_INDEX = fileURLToPath(new URL('../../src/lab/vm/index.ts', import.meta.url));

/** QEMU processes of the kernel lab started by process pid (their run directory names it). */
function qemusOf(pid: number): number[] {
  const runs = join(kernelLabDir(), 'runs', `${pid}-`);
  const out: number[] = [];
  for (const p of readdirSync('/proc')) {
    if (!/^\d+$/.test(p)) continue;
    try {
      const argv = readFileSync(`/proc/${p}/cmdline`, 'utf8').split('\0');
      if (argv.some((a) => a.includes('qemu-system')) && argv.some((a) => a.includes(runs))) out.push(Number(p));
    } catch {
      // gone
    }
  }
  return out;
}

const runsOf = (pid: number) => listRuns().filter((r) => r.startsWith(`${pid}-`));

/** QEMU without KVM is slow to start */
const VM_WAIT = { timeoutMs: 30_000, everyMs: 100 };

describe('kernel lab', { skip: kernelLabSkip() }, () => {
  let run: VmRunResult;
  const children: ReturnType<typeof spawn>[] = [];

  before(async () => {
    requireKernelLab();
    // one boot for output, status, input, environment, directory and modules
    run = await runInVm(
      `uname -r
echo "to stderr" >&2
echo "cwd=$PWD env=$KPNG_GREETING"
echo "stdin=$(cat)"
modprobe ip_vs && echo "ip_vs: $(head -1 /proc/net/ip_vs)"
modprobe sctp && grep -c '^SCTP' /proc/net/protocols | sed 's/^/sctp protocols: /'
exit 7`,
      { cwd: '/usr/share', env: { KPNG_GREETING: "it's here" }, input: 'hello from the host', timeoutMs: 180_000 },
    );
    console.log(`kernel lab: boot ${run.bootMs} ms, whole run ${run.ms} ms (kernel ${run.kernel})`);
  });

  after(() => {
    for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  });

  it("boots Debian's kernel and returns the command's output and non-zero status", () => {
    assert.equal(run.status, 7, run.output);
    assert.equal(run.timedOut, false);
    assert.equal(run.kernel, readManifest()!.kernel);
    const lines = run.output.split('\n');
    assert.equal(lines[0], run.kernel, 'uname -r in the guest is the lab kernel, not the host one');
    assert.ok(lines.includes('to stderr'), run.output);
    assert.ok(run.bootMs > 0 && run.bootMs < run.ms, `boot ${run.bootMs} ms of ${run.ms}`);
  });

  it('runs the command in its directory, with its environment and stdin', () => {
    assert.match(run.output, /^cwd=\/usr\/share env=it's here$/m);
    assert.match(run.output, /^stdin=hello from the host$/m);
  });

  it('has IPVS and SCTP (modprobe ip_vs, modprobe sctp)', () => {
    assert.match(run.output, /^ip_vs: IP Virtual Server version /m, run.output);
    assert.match(run.output, /^sctp protocols: 2$/m, run.output);
  });

  it('runs a program with arguments, and a zero status is 0', async () => {
    const r = await runInVm(['/bin/sh', '-c', 'echo "$0 $1"', 'a b', "c'd"], { timeoutMs: 120_000 });
    assert.equal(r.status, 0, r.output);
    assert.equal(r.output, "a b c'd\n");
  });

  it('kills the VM when the time is up: status 124, timedOut', async () => {
    const t0 = Date.now();
    const r = await runInVm('sleep 600', { timeoutMs: 12_000 });
    assert.equal(r.timedOut, true);
    assert.equal(r.status, 124);
    assert.ok(Date.now() - t0 < 25_000, `took ${Date.now() - t0} ms`);
    assert.deepEqual(qemusOf(process.pid), []);
  });

  it('an abort kills the VM and rejects with the reason', async () => {
    const ac = new AbortController();
    const p = runInVm('sleep 600', { signal: ac.signal, timeoutMs: 120_000 });
    await until('QEMU to start', () => qemusOf(process.pid).length > 0, VM_WAIT);
    ac.abort(new Error('test abort'));
    await assert.rejects(p, /test abort/);
    assert.deepEqual(qemusOf(process.pid), []);
  });

  // a parent that runs a VM until it is interrupted or killed
  function parent(): { child: ReturnType<typeof spawn>; ready: Promise<void> } {
    const code = `import { runInVm } from ${JSON.stringify(RUN_INDEX)}; await runInVm('sleep 600', { timeoutMs: 300000 });`;
    const child = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', code], { stdio: 'ignore' });
    children.push(child);
    return { child, ready: until('the parent to start QEMU', () => qemusOf(child.pid!).length > 0 && runsOf(child.pid!).length > 0, VM_WAIT) };
  }

  it('an interrupted parent (SIGINT) kills its VM and removes its run directory', async () => {
    const { child, ready } = parent();
    await ready;
    const exited = new Promise<NodeJS.Signals | null>((r) => child.once('exit', (_c, s) => r(s)));
    child.kill('SIGINT');
    assert.equal(await exited, 'SIGINT', 'the parent still dies of the signal');
    await until('QEMU to end', () => qemusOf(child.pid!).length === 0, { timeoutMs: 10_000 });
    assert.deepEqual(runsOf(child.pid!), []);
  });

  it('a killed parent (SIGKILL) takes its VM with it; the next run removes its run directory', async () => {
    const { child, ready } = parent();
    await ready;
    const exited = new Promise<void>((r) => child.once('exit', () => r()));
    child.kill('SIGKILL');
    await exited;
    await until('QEMU to end (setpriv --pdeathsig)', () => qemusOf(child.pid!).length === 0, { timeoutMs: 10_000 });
    const left = runsOf(child.pid!);
    assert.equal(left.length, 1, 'a killed process cannot clean up: its run directory is left');
    assert.ok(removeStaleRuns().includes(left[0]));
    assert.deepEqual(runsOf(child.pid!), []);
  });

  it('leaves no QEMU process and no run directory behind', () => {
    assert.deepEqual(qemusOf(process.pid), []);
    assert.deepEqual(runsOf(process.pid), []);
  });
});
