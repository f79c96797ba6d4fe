// Drift repair: someone changes kpng's rules by hand (an nftables map element
// deleted and a chain flushed; an iptables KUBE-SVC-* rule deleted). Within
// 2 x syncPeriod the periodic check notices, kpng repairs its rules, traffic
// flows again, and kpng_dataplane_repairs_total counts it. Nothing is
// repaired while nobody touches anything.
import { it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { describeOutcome, verdict } from '../../src/lab/index.js';
import { node, service, slice } from '../helpers/k8s.js';
import { KpngLab, backendConfig, backendTag, describeBackends, pollUntil } from '../helpers/lab-kpng.js';
import { serviceChains } from '../../src/backends/iptables/names.js';

const VIP = '10.96.0.10';
const A = '10.244.1.10';
const SYNC_PERIOD_MS = 5000;

await describeBackends('drift repair', (b) => {
  let kl: KpngLab;
  before(async () => {
    kl = await KpngLab.create(
      b,
      { tag: `drift${backendTag(b)}`, node: { name: 'node-a', interfaces: [{ name: 'eth0', addresses: ['192.168.0.2/24'] }] }, pods: [{ name: 'web-a', ips: [A] }, { name: 'client', ips: ['10.244.1.50'] }] },
      [node('node-a', undefined, ['192.168.0.2']), service('demo', 'web', { clusterIP: VIP, ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }] }), slice('demo', 'web-1', 'web', [{ ip: A, node: 'node-a' }])],
      backendConfig(b, { clusterCIDR: '10.244.0.0/16', syncPeriod: `${SYNC_PERIOD_MS / 1000}s`, minSyncPeriod: '0s' }),
    );
    await Promise.all([kl.lab.serve('web-a', { tcp: [8080] }), kl.lab.serve('world', { tcp: [80] })]);
    await kl.startAndWait(() => kl.lab.connect({ from: '10.244.1.50', to: VIP, port: 80 }), { pre: ['--log-level', 'debug'] });
  });
  after(() => kl?.close());

  const repairs = async (): Promise<number> => {
    const r = await kl.lab.exec('node-a', [process.execPath, '-e', "fetch('http://127.0.0.1:10249/metrics').then((r) => r.text()).then((t) => console.log(/^kpng_dataplane_repairs_total (\\d+)/m.exec(t)?.[1] ?? 'none'))"]);
    assert.equal(r.code, 0, r.stdout);
    return Number(r.stdout.trim());
  };

  /** the rule of the Service's KUBE-SVC-* chain that jumps to its endpoint, as a delete command */
  const sepJump = async (): Promise<string[]> => {
    const ipt = `iptables-${(b as { mode: string }).mode}`;
    const chain = serviceChains('demo/web:http', 'tcp').svc;
    const r = await kl.lab.exec('node-a', [ipt, '-w', '5', '-t', 'nat', '-S', chain]);
    const rule = r.stdout.split('\n').find((l) => l.startsWith(`-A ${chain} `) && l.includes('-j KUBE-SEP-'));
    assert.ok(rule, r.stdout);
    return ['sh', '-c', `${ipt} -w 5 -t nat -D ${rule.slice(3)}`];
  };

  it('rules changed by hand are repaired within 2 x syncPeriod, and counted', async () => {
    // a quiet period: nothing to repair
    await new Promise((r) => setTimeout(r, SYNC_PERIOD_MS + 1000));
    assert.equal(await repairs(), 0, kl.kpng!.stderr.slice(-2000));
    const nft = ['nft'];
    const edits: string[][] =
      b.name === 'nft'
        ? [
            [...nft, 'delete', 'element', 'ip', 'kpng', 'service-ips', `{ ${VIP} . tcp . 80 }`],
            [...nft, 'flush', 'chain', 'ip', 'kpng', 'services'],
          ]
        : [await sepJump()];
    for (const e of edits) {
      const r = await kl.lab.exec('node-a', e);
      assert.equal(r.code, 0, `${e.join(' ')}: ${r.stdout}`);
    }
    const t0 = Date.now();
    const gone = await kl.lab.connect({ from: '10.244.1.50', to: VIP, port: 80, timeoutMs: 1000 });
    assert.notEqual(verdict(gone, VIP, 80), `${A}:8080`, `still answered right after the edit: ${describeOutcome(gone)}`);
    const r = await pollUntil(() => kl.lab.connect({ from: '10.244.1.50', to: VIP, port: 80, timeoutMs: 1000 }), (o) => verdict(o, VIP, 80) === `${A}:8080`, 2 * SYNC_PERIOD_MS + 3000, 200);
    assert.ok(r.ok, `not repaired ${Date.now() - t0} ms after the edit: ${describeOutcome(r.value)}\n${kl.kpng!.stderr.slice(-3000)}`);
    assert.ok(Date.now() - t0 <= 2 * SYNC_PERIOD_MS + 1000, `repaired after ${Date.now() - t0} ms`);
    assert.equal(await repairs(), 1);
    assert.match(kl.kpng!.stderr, /the dataplane was changed by someone else; repairing it/);
  });
});
