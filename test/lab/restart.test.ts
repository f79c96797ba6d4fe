// kpng restarted (SIGTERM, then started again) while connections are open and
// new ones keep coming: the rules stay in place while kpng is down, the new
// kpng adopts them, open connections survive and nothing is refused, dropped
// or left untranslated in between. For every backend, each with its own
// check that the rules stayed and that the restarted kpng rewrote nothing.
import { it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { describeOutcome, verdict, type LabConnection, type Outcome } from '../../src/lab/index.js';
import { node, service, serviceCIDR, slice } from '../helpers/k8s.js';
import { KpngLab, answeredBy, backendConfig, backendLabel, backendTag, describeBackends, pollUntil, type HostBackend } from '../helpers/lab-kpng.js';

const VIP = '10.96.0.10';
const A = '10.244.1.10';
const B = '10.244.1.11';
const C = '10.244.1.12';
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const ports = [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }, { name: 'dns', port: 53, protocol: 'UDP', targetPort: 5353 }];
const slicePorts = [{ name: 'http', port: 8080 }, { name: 'dns', port: 5353, protocol: 'UDP' }];
const state = (ips: string[]) => [
  node('node-a', undefined, ['192.168.0.2']),
  serviceCIDR('kubernetes', ['10.96.0.0/16']),
  service('demo', 'web', { type: 'NodePort', clusterIP: VIP, ports: ports.map((p, i) => ({ ...p, nodePort: 30080 + i })) }),
  slice('demo', 'web-1', 'web', ips.map((ip) => ({ ip, node: 'node-a' })), slicePorts),
];

/**
 * Per backend: what shows the rules stayed while kpng is down, and the
 * restarted kpng's first (full) sync when it adopted them and rewrote nothing:
 * nftables changes no set or map element (its chains are declared again in
 * the same atomic transaction), iptables writes and deletes no chain.
 */
function adoption(b: HostBackend): { kept: string[]; keptOk: (r: { code: number | null; stdout: string }) => void; synced: RegExp; nothingRewritten: RegExp; what: string } {
  return b.name === 'nft'
    ? {
        kept: ['nft', 'list', 'table', 'ip', 'kpng'],
        keptOk: (r) => assert.equal(r.code, 0, 'the table stays while kpng is down'),
        synced: /nft: synced/,
        nothingRewritten: /nft: synced .*full=true .*elementChanges=0/,
        what: 'the restarted kpng changed no element',
      }
    : {
        kept: [`iptables-${b.mode}-save`, '-t', 'nat'],
        keptOk: (r) => assert.match(r.stdout, /^-A KUBE-SERVICES .*-j KUBE-SVC-/m, 'the rules stay while kpng is down'),
        synced: /iptables: synced/,
        nothingRewritten: /iptables: synced .*full=true .*chainsWritten=0 chainsDeleted=0/,
        what: 'the restarted kpng rewrote no chain',
      };
}

await describeBackends('restart with connections open', (b) => {
  const { kept, keptOk, synced, nothingRewritten, what } = adoption(b);
  let kl: KpngLab;
  before(async () => {
    kl = await KpngLab.create(
      b,
      {
        tag: `restart${backendTag(b)}`,
        node: { name: 'node-a', interfaces: [{ name: 'eth0', addresses: ['192.168.0.2/24'] }] },
        pods: [
          { name: 'web-a', ips: [A] },
          { name: 'web-b', ips: [B] },
          { name: 'web-c', ips: [C] },
          { name: 'client', ips: ['10.244.1.50'] },
        ],
      },
      state([A, B]),
      backendConfig(b, { clusterCIDR: '10.244.0.0/16' }),
    );
    await Promise.all(['web-a', 'web-b', 'web-c'].map((p) => kl.lab.serve(p, { tcp: [8080], udp: [5353] })));
    await kl.startAndWait(() => kl.lab.connect({ from: '10.244.1.50', to: VIP, port: 80 }));
  });
  after(() => kl?.close());

  it('SIGTERM, start again: open connections survive, no new connection fails meanwhile, nothing rewritten', async () => {
    const lab = kl.lab;
    const open: { c: LabConnection; dst: string; port: number }[] = [];
    for (const [dst, port, protocol] of [[VIP, 80, 'TCP'], [VIP, 53, 'UDP'], ['192.168.0.2', 30080, 'TCP']] as const) {
      const c = await lab.open({ from: protocol === 'UDP' || dst === VIP ? '10.244.1.50' : '203.0.113.7', to: dst, port, protocol });
      assert.equal(c.first.kind, 'answered', describeOutcome(c.first));
      open.push({ c, dst, port });
    }

    // new connections all along: a pod to the ClusterIP, the world to the NodePort
    let stop = false;
    const probes: { o: Outcome; dst: string; port: number }[] = [];
    const prober = (async () => {
      for (let i = 0; i < 3000 && !stop; i++) {
        const [a, b] = await Promise.all([
          lab.connect({ from: '10.244.1.50', to: VIP, port: 80, timeoutMs: 1000 }),
          lab.connect({ from: '203.0.113.8', to: '192.168.0.2', port: 30080, timeoutMs: 1000 }),
        ]);
        probes.push({ o: a, dst: VIP, port: 80 }, { o: b, dst: '192.168.0.2', port: 30080 });
        await sleep(20);
      }
    })();

    try {
      await sleep(300);
      const code = await kl.kpng!.stop('SIGTERM', 10_000);
      assert.equal(code, 0, `kpng exit on SIGTERM\n${kl.kpng!.stderr.slice(-3000)}`);
      keptOk(await lab.exec(lab.nodeName, kept));
      await sleep(500);
      kl.start({ pre: ['--log-level', 'debug'] });
      await kl.kpng!.until('the first sync after the restart', () => synced.test(kl.kpng!.stderr));
      assert.match(kl.kpng!.stderr, nothingRewritten, what);
      // the new kpng is at work once a change made after its start shows
      kl.setState(state([A, B, C]));
      const r = await pollUntil(() => lab.burst({ from: '10.244.1.50', to: VIP, port: 80, count: 16 }), (out) => answeredBy(out).includes(`${C}:8080`), 20_000, 200);
      assert.ok(r.ok, `the restarted kpng never added ${C}\n${kl.kpng!.stderr.slice(-3000)}`);
      await sleep(300);
    } finally {
      stop = true;
      await prober;
    }

    const bad = probes.filter(({ o, dst, port }) => !/^10\.244\.1\.1[0-2]:8080$/.test(verdict(o, dst, port)));
    assert.ok(probes.length > 20, `only ${probes.length} probes`);
    assert.deepEqual(bad.map(({ o, dst, port }) => `${dst}:${port} ${describeOutcome(o)}`), [], `${bad.length} of ${probes.length} new connections failed`);
    for (const { c, dst, port } of open) {
      const o = await c.send();
      assert.equal(verdict(o, dst, port), verdict(c.first, dst, port), `open connection to ${dst}:${port}: ${describeOutcome(o)}`);
      await c.close();
    }
    console.log(`restart (${backendLabel(b)}): ${probes.length} new connections during the restart, all answered`);
  });
});
