// In the kernel lab, node dies now and then of QEMU's emulation (SIGILL,
// SIGSEGV; docs/kernel-lab.md): the lab starts such a kpng again once, in
// place (Lab.startKpng). Proven on the host with a SIGSEGV sent to a kpng
// that serves: started again under KPNG_VMLAB, serving again, a second death
// final; without KPNG_VMLAB, the first death is final.
import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { describeOutcome } from '../../src/lab/index.js';
import { node, service, serviceCIDR, slice } from '../helpers/k8s.js';
import { KpngLab, backendConfig, backendLabUnsupported, pollUntil } from '../helpers/lab-kpng.js';

const VIP = '10.96.0.10';
const A = '10.244.1.10';
const CLIENT = '10.244.1.50';
const state = [
  node('node-a'),
  serviceCIDR('kubernetes', ['10.96.0.0/16']),
  service('demo', 'web', { clusterIP: VIP, ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }] }),
  slice('demo', 'web-1', 'web', [{ ip: A, node: 'node-a' }], [{ name: 'http', port: 8080 }]),
];
const NFT = { name: 'nft' } as const;

/** A lab serving the Service through kpng (to-nft), started with KPNG_VMLAB as given. */
async function servingLab(tag: string, vmlab: boolean): Promise<KpngLab> {
  const kl = await KpngLab.create(NFT, { tag, node: { name: 'node-a' }, pods: [{ name: 'web-a', ips: [A] }, { name: 'client', ips: [CLIENT] }] }, state, backendConfig(NFT));
  await kl.lab.serve('web-a', { tcp: [8080] });
  const saved = process.env.KPNG_VMLAB;
  if (vmlab) process.env.KPNG_VMLAB = '1';
  else delete process.env.KPNG_VMLAB;
  try {
    await kl.startAndWait(() => kl.lab.connect({ from: CLIENT, to: VIP, port: 80 }), { pre: ['--log-level', 'debug'] });
  } finally {
    if (saved === undefined) delete process.env.KPNG_VMLAB;
    else process.env.KPNG_VMLAB = saved;
  }
  return kl;
}

const t0 = Date.now();
const killed: number[] = [];

/** Sends kpng's node SIGSEGV, as QEMU's emulation would end it. */
function segfault(kl: KpngLab): void {
  killed.push(kl.kpng!.process.pid!);
  kl.kpng!.process.kill('SIGSEGV');
}

/** The core files the killed processes may have left where they ran (where core dumps are on and go to a file). */
function removeCores(): void {
  for (const name of ['core', ...killed.map((pid) => `core.${pid}`)]) {
    const f = join(process.cwd(), name);
    if ((statSync(f, { throwIfNoEntry: false })?.mtimeMs ?? 0) >= t0) rmSync(f, { force: true });
  }
}

/** Whether kpng's process ends within ms. */
async function endsWithin(kl: KpngLab, ms: number): Promise<boolean> {
  return Promise.race([kl.kpng!.exited.then(() => true), new Promise<boolean>((r) => setTimeout(() => r(false), ms))]);
}

describe('lab: kpng killed by QEMU emulation faults', { skip: await backendLabUnsupported(NFT), concurrency: 1 }, () => {
  const labs: KpngLab[] = [];
  after(async () => {
    await Promise.all(labs.map((kl) => kl.close()));
    removeCores();
  });

  it('in the kernel lab: started again once, in place, and serving; a second death is final', async () => {
    const kl = await servingLab('emufault', true);
    labs.push(kl);
    const first = kl.kpng!.process;
    segfault(kl);
    const again = await pollUntil(
      async () => kl.kpng!.process,
      (p) => p !== first && p.pid !== undefined,
    );
    assert.ok(again.ok, 'kpng was not started again');
    assert.match(kl.kpng!.stderr, /died of SIGSEGV in QEMU's emulation; started again/);
    assert.equal(await endsWithin(kl, 200), false, 'the first death ended the kpng process object');
    // the new kpng is serving: it wrote the same rules again (the table survived its predecessor)
    await kl.kpng!.until('the restarted kpng synced', () => /nft: synced/.test(kl.kpng!.stderr.split('started again')[1] ?? ''), { timeoutMs: 30_000 });
    const o = await kl.lab.connect({ from: CLIENT, to: VIP, port: 80 });
    assert.equal(o.kind === 'answered' && o.local, `${A}:8080`, describeOutcome(o));
    segfault(kl);
    assert.equal(await endsWithin(kl, 10_000), true, 'a second death is final');
    assert.equal(await kl.kpng!.exited, -1);
    assert.equal(kl.kpng!.process.signalCode, 'SIGSEGV');
  });

  it('outside the kernel lab: the first death is final', async () => {
    const kl = await servingLab('emufault0', false);
    labs.push(kl);
    segfault(kl);
    assert.equal(await endsWithin(kl, 10_000), true, 'kpng was started again outside the kernel lab');
    assert.doesNotMatch(kl.kpng!.stderr, /started again/);
    await assert.rejects(kl.kpng!.until('never', () => false), /kpng exited \(SIGSEGV\) before never/);
  });
});
