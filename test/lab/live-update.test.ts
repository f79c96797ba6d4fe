// Rules updated while connections stay open: kpng follows a state directory;
// endpoints and Services change under an open TCP connection, which keeps
// working, while new connections follow the new rules. For every backend;
// once the Service is deleted, nftables drops its (now unallocated) ClusterIP
// and iptables leaves it alone ("", answered by the world).
import { it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { describeOutcome, verdict, type LabConnection } from '../../src/lab/index.js';
import { node, service, serviceCIDR, slice } from '../helpers/k8s.js';
import { KpngLab, answeredBy, backendConfig, backendTag, describeBackends, pollUntil } from '../helpers/lab-kpng.js';

const VIP = '10.96.0.10';
const A = '10.244.1.10';
const B = '10.244.1.11';
const C = '10.244.1.12';
const base = [node('node-a', undefined, ['192.168.0.2']), serviceCIDR('kubernetes', ['10.96.0.0/16'])];
const web = (ports = [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }]) => service('demo', 'web', { clusterIP: VIP, ports });
const eps = (ips: string[], ports = [{ name: 'http', port: 8080 }]) => slice('demo', 'web-1', 'web', ips.map((ip) => ({ ip, node: 'node-a' })), ports);

await describeBackends('rules updated while connections stay open', (b) => {
  let kl: KpngLab;
  let conn: LabConnection;
  let held = '';
  const burst = (port = 80) => kl.lab.burst({ from: '10.244.1.50', to: VIP, port, count: 16 });
  const stderr = () => kl.kpng?.stderr.slice(-3000) ?? '';

  before(async () => {
    kl = await KpngLab.create(
      b,
      {
        tag: `live${backendTag(b)}`,
        node: { name: 'node-a', interfaces: [{ name: 'eth0', addresses: ['192.168.0.2/24'] }] },
        pods: [
          { name: 'web-a', ips: [A] },
          { name: 'web-b', ips: [B] },
          { name: 'web-c', ips: [C] },
          { name: 'client', ips: ['10.244.1.50'] },
        ],
      },
      [...base, web(), eps([A, B])],
      backendConfig(b, { clusterCIDR: '10.244.0.0/16' }),
    );
    // the world answers what kpng leaves alone ("")
    await Promise.all([...['web-a', 'web-b', 'web-c'].map((p) => kl.lab.serve(p, { tcp: [8080, 8443] })), kl.lab.serve('world', { tcp: [80] })]);
    await kl.startAndWait(() => kl.lab.connect({ from: '10.244.1.50', to: VIP, port: 80 }));
    conn = await kl.lab.open({ from: '10.244.1.50', to: VIP, port: 80 });
    assert.equal(conn.first.kind, 'answered', describeOutcome(conn.first));
    held = verdict(conn.first, VIP, 80);
  });
  after(() => kl?.close());

  const stillOpen = async () => {
    const o = await conn.send();
    assert.equal(verdict(o, VIP, 80), held, `the open connection: ${describeOutcome(o)}`);
  };

  it('the held endpoint leaves, another joins: new connections move, the open one stays', async () => {
    const gone = held.split(':')[0];
    const stay = gone === A ? B : A;
    kl.setState([...base, web(), eps([stay, C])]);
    const want = [`${stay}:8080`, `${C}:8080`].sort();
    const r = await pollUntil(burst, (out) => answeredBy(out).join() === want.join(), 15_000, 200);
    assert.deepEqual(answeredBy(r.value), want, `new connections after the change (waited ${r.ms} ms)\n${stderr()}`);
    await stillOpen();
  });

  it('scaled down to one endpoint and back up: new connections follow, the open one stays', async () => {
    const gone = held.split(':')[0];
    const one = gone === C ? A : C;
    kl.setState([...base, web(), eps([one])]);
    let r = await pollUntil(burst, (out) => answeredBy(out).join() === `${one}:8080`, 15_000, 200);
    assert.deepEqual(answeredBy(r.value), [`${one}:8080`], `with one endpoint (waited ${r.ms} ms)\n${stderr()}`);
    await stillOpen();
    kl.setState([...base, web(), eps([A, C])]);
    r = await pollUntil(burst, (out) => answeredBy(out).join() === `${A}:8080,${C}:8080`, 15_000, 200);
    assert.deepEqual(answeredBy(r.value), [`${A}:8080`, `${C}:8080`], `back to two (waited ${r.ms} ms)\n${stderr()}`);
    await stillOpen();
  });

  it('the Service gains a port: new connections reach it, and the open connection stays', async () => {
    kl.setState([...base, web([{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }, { name: 'https', port: 443, protocol: 'TCP', targetPort: 8443 }]), eps([A, C], [{ name: 'http', port: 8080 }, { name: 'https', port: 8443 }])]);
    const r = await pollUntil(() => burst(443), (out) => out.every((o) => o.kind === 'answered'), 15_000, 200);
    assert.deepEqual(answeredBy(r.value), [`${A}:8443`, `${C}:8443`], `${r.value.map(describeOutcome).join('\n')}\n${stderr()}`);
    await stillOpen();
  });

  const deleted = b.name === 'nft' ? { want: 'DROP', what: 'dropped (unallocated ClusterIP)' } : { want: '', what: 'left alone (not DNATed)' };
  it(`the Service is deleted: new connections are ${deleted.what}, the open one stays`, async () => {
    kl.setState([...base]);
    const r = await pollUntil(() => kl.lab.connect({ from: '10.244.1.50', to: VIP, port: 80, timeoutMs: 700 }), (o) => verdict(o, VIP, 80) === deleted.want, 15_000, 200);
    assert.equal(verdict(r.value, VIP, 80), deleted.want, describeOutcome(r.value));
    await stillOpen();
    await conn.close();
  });

  it('kpng applied every change without a failed sync', () => {
    const failed = (kl.kpng?.stderr ?? '').split('\n').filter((l) => /sync failed|ERROR/.test(l));
    assert.deepEqual(failed, []);
  });
});
