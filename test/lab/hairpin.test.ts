// Hairpin: a pod reaching itself through its own Service is answered by
// itself, masqueraded (otherwise its reply would never go back through the
// node to be un-DNATed); the same pod reaching another endpoint is not. For
// every backend.
import { it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { Lab, POD_GATEWAY, describeOutcome, seenSource, verdict } from '../../src/lab/index.js';
import { node, service, serviceCIDR, slice } from '../helpers/k8s.js';
import { answeredBy, applyOnce, backendConfig, backendTag, describeBackends } from '../helpers/lab-kpng.js';

await describeBackends('hairpin', (b) => {
  let lab: Lab;
  before(async () => {
    lab = await Lab.create({
      tag: `hairpin${backendTag(b)}`,
      node: { name: 'node-a', interfaces: [{ name: 'eth0', addresses: ['192.168.0.2/24', '2001:db8::1/64'] }] },
      pods: [
        { name: 'solo', ips: ['10.244.1.5', 'fd00:10::5'] },
        { name: 'web-1', ips: ['10.244.1.10'] },
        { name: 'web-2', ips: ['10.244.1.11'] },
      ],
    });
    await Promise.all(['solo', 'web-1', 'web-2'].map((p) => lab.serve(p, { tcp: [8080], udp: [5353] })));
    await applyOnce(
      b,
      lab,
      [
        node('node-a', undefined, ['192.168.0.2', '2001:db8::1']),
        serviceCIDR('kubernetes', ['10.96.0.0/16', 'fd00:96::/112']),
        service('demo', 'solo', { clusterIP: '10.96.0.5', ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }, { name: 'dns', port: 53, protocol: 'UDP', targetPort: 5353 }] }),
        slice('demo', 'solo-1', 'solo', [{ ip: '10.244.1.5', node: 'node-a' }], [{ name: 'http', port: 8080 }, { name: 'dns', port: 5353, protocol: 'UDP' }]),
        service('demo', 'solo6', { clusterIP: 'fd00:96::5', ipFamilies: ['IPv6'], ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }] }),
        slice('demo', 'solo6-1', 'solo6', [{ ip: 'fd00:10::5', node: 'node-a' }]),
        service('demo', 'web', { clusterIP: '10.96.0.10', ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }] }),
        slice('demo', 'web-1', 'web', [{ ip: '10.244.1.10', node: 'node-a' }, { ip: '10.244.1.11', node: 'node-a' }]),
      ],
      backendConfig(b, { clusterCIDR: '10.244.0.0/16,fd00:10::/64' }),
    );
  });
  after(() => lab?.close());

  it('a pod reaching itself through its ClusterIP (TCP, UDP, IPv6) is answered by itself, masqueraded', async () => {
    const cases: [string, string, number, 'TCP' | 'UDP', string, string][] = [
      ['10.244.1.5', '10.96.0.5', 80, 'TCP', '10.244.1.5:8080', POD_GATEWAY[4]],
      ['10.244.1.5', '10.96.0.5', 53, 'UDP', '10.244.1.5:5353', POD_GATEWAY[4]],
      ['fd00:10::5', 'fd00:96::5', 80, 'TCP', '[fd00:10::5]:8080', POD_GATEWAY[6]],
    ];
    for (const [from, to, port, protocol, endpoint, masq] of cases) {
      const o = await lab.connect({ from, to, port, protocol });
      assert.equal(verdict(o, to, port), endpoint, describeOutcome(o));
      assert.equal(seenSource(o), masq, describeOutcome(o));
    }
  });

  it('with two endpoints, only the connections that come back to the client pod are masqueraded', async () => {
    const out = await lab.burst({ from: '10.244.1.10', to: '10.96.0.10', port: 80, count: 24 });
    assert.deepEqual(answeredBy(out), ['10.244.1.10:8080', '10.244.1.11:8080']);
    for (const o of out) {
      const self = verdict(o, '10.96.0.10', 80) === '10.244.1.10:8080';
      assert.equal(seenSource(o), self ? POD_GATEWAY[4] : '10.244.1.10', describeOutcome(o));
    }
  });
});
