// Stale UDP conntrack entries: a UDP "connection" (the same socket, so the
// same conntrack entry) to a ClusterIP or a NodePort whose endpoint is removed
// moves to the remaining endpoint on a later datagram instead of sticking to
// the removed one (kpng deletes the stale entry). The removed endpoint keeps
// answering, so only the conntrack cleanup can make the socket move. For every
// backend.
import { it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { describeOutcome, verdict } from '../../src/lab/index.js';
import { node, service, serviceCIDR, slice } from '../helpers/k8s.js';
import { KpngLab, backendConfig, backendLabel, backendTag, describeBackends, pollUntil } from '../helpers/lab-kpng.js';

const VIP = '10.96.0.53';
const NODE_IP = '192.168.0.2';
const A = '10.244.1.10';
const B = '10.244.1.11';
const state = (ips: string[]) => [
  node('node-a', undefined, [NODE_IP]),
  serviceCIDR('kubernetes', ['10.96.0.0/16']),
  service('demo', 'dns', { type: 'NodePort', clusterIP: VIP, ports: [{ name: 'dns', port: 53, protocol: 'UDP', targetPort: 5353, nodePort: 30053 }] }),
  slice('demo', 'dns-1', 'dns', ips.map((ip) => ({ ip, node: 'node-a' })), [{ name: 'dns', port: 5353, protocol: 'UDP' }]),
];

await describeBackends('stale UDP conntrack entries', (b) => {
  let kl: KpngLab;
  before(async () => {
    kl = await KpngLab.create(
      b,
      {
        tag: `ctrack${backendTag(b)}`,
        node: { name: 'node-a', interfaces: [{ name: 'eth0', addresses: [`${NODE_IP}/24`] }] },
        pods: [
          { name: 'dns-a', ips: [A] },
          { name: 'dns-b', ips: [B] },
          { name: 'client', ips: ['10.244.1.50'] },
        ],
      },
      state([A, B]),
      backendConfig(b, { clusterCIDR: '10.244.0.0/16' }),
    );
    await Promise.all(['dns-a', 'dns-b'].map((p) => kl.lab.serve(p, { udp: [5353] })));
    await kl.startAndWait(() => kl.lab.connect({ from: '10.244.1.50', to: VIP, port: 53, protocol: 'UDP' }));
  });
  after(() => kl?.close());

  for (const [what, from, dst, port] of [
    ['ClusterIP, from a pod', '10.244.1.50', VIP, 53],
    ['NodePort, from outside', '203.0.113.9', NODE_IP, 30053],
  ] as const) {
    it(`${what}: the socket moves to the remaining endpoint`, async () => {
      kl.setState(state([A, B]));
      await pollUntil(() => kl.lab.burst({ from, to: dst, port, protocol: 'UDP', count: 12 }), (out) => new Set(out.map((o) => verdict(o, dst, port))).size === 2, 15_000, 200);
      const sock = await kl.lab.open({ from, to: dst, port, protocol: 'UDP' });
      try {
        const first = verdict(sock.first, dst, port);
        assert.match(first, /^10\.244\.1\.1[01]:5353$/, describeOutcome(sock.first));
        // the same entry keeps the same endpoint while nothing changes
        assert.equal(verdict(await sock.send(), dst, port), first);
        const removed = first.split(':')[0];
        const remaining = removed === A ? B : A;
        kl.setState(state([remaining]));
        const r = await pollUntil(() => sock.send(500), (o) => verdict(o, dst, port) === `${remaining}:5353`, 15_000, 200);
        assert.equal(verdict(r.value, dst, port), `${remaining}:5353`, `the socket still reaches ${removed} ${r.ms} ms after it was removed: ${describeOutcome(r.value)}`);
        console.log(`${backendLabel(b)} ${what}: moved ${r.ms} ms after the change`);
      } finally {
        await sock.close();
      }
    });
  }
});
