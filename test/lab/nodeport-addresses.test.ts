// nodePortAddresses (issue 12): a node with two addresses, NodePorts served
// on the configured one only. The flows elsewhere set it to the node's only
// address, so a backend ignoring the setting would pass them; here the other
// address must not answer.
import { it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { describeOutcome, verdict } from '../../src/lab/index.js';
import { node, service, slice } from '../helpers/k8s.js';
import { KpngLab, backendConfig, backendTag, describeBackends, pollUntil } from '../helpers/lab-kpng.js';

const SERVED = '192.168.0.2';
const OTHER = '192.168.1.2';
const A = '10.244.1.10';

await describeBackends('nodePortAddresses', (b) => {
  let kl: KpngLab;
  before(async () => {
    kl = await KpngLab.create(
      b,
      { tag: `npa${backendTag(b)}`, node: { name: 'node-a', interfaces: [{ name: 'eth0', addresses: [`${SERVED}/24`, `${OTHER}/24`] }] }, pods: [{ name: 'web-a', ips: [A] }] },
      [
        node('node-a', undefined, [SERVED, OTHER]),
        service('demo', 'np', { type: 'NodePort', clusterIP: '10.96.0.30', ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080, nodePort: 30080 }] }),
        slice('demo', 'np-1', 'np', [{ ip: A, node: 'node-a' }]),
      ],
      backendConfig(b, { clusterCIDR: '10.244.0.0/16', nodePortAddresses: ['192.168.0.0/24'] }),
    );
    await Promise.all([kl.lab.serve('web-a', { tcp: [8080] }), kl.lab.serve('node-a', { tcp: [30080] })]);
    kl.start();
    // (the node's own listener answers until kpng programs the NodePort)
    const r = await pollUntil(() => kl.lab.connect({ from: '203.0.113.7', to: SERVED, port: 30080 }), (o) => verdict(o, SERVED, 30080) === `${A}:8080`, 20_000, 200);
    assert.ok(r.ok, `never programmed: ${describeOutcome(r.value)}\n${kl.kpng?.stderr.slice(-2000)}`);
  });
  after(() => kl?.close());

  it('a NodePort answers on the configured address only', async () => {
    const served = await kl.lab.burst({ from: '203.0.113.7', to: SERVED, port: 30080, count: 8 });
    for (const o of served) assert.equal(verdict(o, SERVED, 30080), `${A}:8080`, describeOutcome(o));
    // the other address: not DNATed (the node's own listener on 30080 answers, kpng left it alone)
    const r = await pollUntil(() => kl.lab.connect({ from: '203.0.113.7', to: OTHER, port: 30080 }), () => true, 1000);
    assert.equal(verdict(r.value, OTHER, 30080), '', describeOutcome(r.value));
  });
});
