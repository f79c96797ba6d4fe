// to-userspace under a slow reader, with real packets: a client pushes as
// fast as it can into an endpoint that never reads, and an endpoint pushes
// into a client that never reads. kpng must stop reading the fast side
// (pause/resume) instead of buffering: its RSS must not grow past the bound
// stated here, and the fast side must be held back.
import { it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { node, service, serviceCIDR, slice } from '../helpers/k8s.js';
import { KpngLab, backendConfig, describeBackends } from '../helpers/lab-kpng.js';

const VIP = '10.96.0.20';
const PEER = fileURLToPath(new URL('./stream-peer.mjs', import.meta.url));
/** kpng may grow by at most this while the streams are stuck */
const RSS_BOUND_MB = 48;
/** what may sit in kernel socket buffers and kpng's stream buffers of one relayed connection, at most */
const FLUSHED_BOUND_MB = 64;
const PUSH_MS = 4000;

function rssMB(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) / 1024 : 0;
}

await describeBackends(
  'to-userspace: slow readers',
  () => {
    let kl: KpngLab;
    const peers: ChildProcess[] = [];
    const peer = (agent: string, args: string[]): Promise<{ p: ChildProcess; out: () => string }> => {
      const p = spawn('ip', ['netns', 'exec', kl.lab.ns(agent), process.execPath, PEER, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
      peers.push(p);
      let out = '';
      p.stdout!.on('data', (d) => (out += d));
      p.stderr!.on('data', (d) => (out += d));
      return new Promise((resolve, reject) => {
        const t = setTimeout(() => reject(new Error(`${agent} ${args.join(' ')}: not ready: ${out}`)), 10_000);
        const check = () => {
          if (out.includes('ready')) {
            clearTimeout(t);
            resolve({ p, out: () => out });
          }
        };
        p.stdout!.on('data', check);
        p.on('exit', () => (clearTimeout(t), reject(new Error(`${agent} ${args.join(' ')} exited: ${out}`))));
      });
    };
    const finished = (p: ChildProcess) => new Promise<void>((r) => (p.exitCode !== null ? r() : p.on('exit', () => r())));

    before(async () => {
      kl = await KpngLab.create(
        { name: 'userspace' },
        {
          tag: 'usbp',
          node: { name: 'node-a', interfaces: [{ name: 'eth0', addresses: ['192.168.0.2/24'] }] },
          pods: [
            { name: 'web-1', ips: ['10.244.1.10'] },
            { name: 'client', ips: ['10.244.1.50'] },
          ],
        },
        [
          node('node-a', undefined, ['192.168.0.2']),
          serviceCIDR('kubernetes', ['10.96.0.0/16']),
          service('demo', 'bulk', {
            clusterIP: VIP,
            ports: [
              { name: 'probe', port: 80, protocol: 'TCP', targetPort: 8080 },
              { name: 'sink', port: 81, protocol: 'TCP', targetPort: 9001 },
              { name: 'source', port: 82, protocol: 'TCP', targetPort: 9002 },
            ],
          }),
          slice('demo', 'bulk-1', 'bulk', [{ ip: '10.244.1.10', node: 'node-a' }], [
            { name: 'probe', port: 8080 },
            { name: 'sink', port: 9001 },
            { name: 'source', port: 9002 },
          ]),
        ],
        backendConfig({ name: 'userspace' }, { clusterCIDR: '10.244.0.0/16' }),
      );
      await kl.lab.serve('web-1', { tcp: [8080] });
      await Promise.all([peer('web-1', ['sink', '9001']), peer('web-1', ['source', '9002'])]);
      await kl.startAndWait(() => kl.lab.connect({ from: '10.244.1.50', to: VIP, port: 80 }));
    });
    after(async () => {
      for (const p of peers) if (p.exitCode === null) p.kill('SIGKILL');
      await kl?.close();
    });

    for (const [title, mode, port] of [
      ['a client pushing into an endpoint that never reads', 'push', 81],
      ['an endpoint pushing into a client that never reads', 'hold', 82],
    ] as const) {
      it(`${title}: kpng's RSS grows by less than ${RSS_BOUND_MB} MB and the fast side is held back`, async () => {
        const pid = kl.kpng!.process.pid!;
        const before = rssMB(pid);
        let peak = before;
        const { p, out } = await peer('client', [mode, VIP, String(port), String(PUSH_MS)]);
        const sampler = setInterval(() => (peak = Math.max(peak, rssMB(pid))), 100);
        try {
          await finished(p);
        } finally {
          clearInterval(sampler);
        }
        const result = JSON.parse(out().split('\n').filter((l) => l.startsWith('{')).pop() ?? '{}') as { flushed?: number; read?: number; error?: string };
        assert.ok(!result.error, `the client failed: ${out()}`);
        const grew = peak - before;
        console.log(`${mode}: kpng RSS ${before.toFixed(1)} MB -> peak ${peak.toFixed(1)} MB; client flushed ${((result.flushed ?? 0) / 2 ** 20).toFixed(1)} MB`);
        assert.ok(grew < RSS_BOUND_MB, `kpng grew by ${grew.toFixed(1)} MB`);
        if (mode === 'push') {
          assert.ok((result.flushed ?? 0) > 0, 'nothing went through');
          assert.ok((result.flushed ?? 0) < FLUSHED_BOUND_MB * 2 ** 20, `the client pushed ${result.flushed} bytes into a reader that never reads: kpng buffers`);
        }
      });
    }
  },
  [{ name: 'userspace' }],
);
