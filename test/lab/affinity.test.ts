// Session affinity (ClientIP) with a short timeout: a client sticks to its
// endpoint, different clients spread, and once a client has been quiet for
// longer than the timeout its next connection is placed afresh; affinity is
// per client and service port, whichever of its IPs the client uses. For
// every backend (nftables: a set per endpoint, with timeouts; iptables: -m recent).
import { it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { describeOutcome, verdict, type Outcome } from '../../src/lab/index.js';
import { node, service, serviceCIDR, slice } from '../helpers/k8s.js';
import { KpngLab, backendConfig, backendTag, describeBackends } from '../helpers/lab-kpng.js';

const VIP = '10.96.0.10';
const EXTERNAL_IP = '198.51.100.80';
const TIMEOUT_S = 2;
// 16 external clients: P(all on one endpoint by chance) = 2^-15
const CLIENTS = Array.from({ length: 16 }, (_, i) => `203.0.113.${i + 1}`);

await describeBackends('session affinity (ClientIP)', (b) => {
  let kl: KpngLab;
  const first = new Map<string, string>();
  const endpointOf = (o: Outcome) => verdict(o, VIP, 80);

  before(async () => {
    kl = await KpngLab.create(
      b,
      {
        tag: `affinity${backendTag(b)}`,
        node: { name: 'node-a', interfaces: [{ name: 'eth0', addresses: ['192.168.0.2/24'] }] },
        pods: [
          { name: 'web-1', ips: ['10.244.1.10'] },
          { name: 'web-2', ips: ['10.244.1.11'] },
          { name: 'client', ips: ['10.244.1.50'] },
        ],
      },
      [
        node('node-a', undefined, ['192.168.0.2']),
        serviceCIDR('kubernetes', ['10.96.0.0/16']),
        service('demo', 'web', {
          clusterIP: VIP,
          externalIPs: [EXTERNAL_IP],
          sessionAffinity: 'ClientIP',
          sessionAffinityConfig: { clientIP: { timeoutSeconds: TIMEOUT_S } },
          ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }],
        }),
        slice('demo', 'web-1', 'web', [{ ip: '10.244.1.10', node: 'node-a' }, { ip: '10.244.1.11', node: 'node-a' }]),
      ],
      backendConfig(b, { clusterCIDR: '10.244.0.0/16' }),
    );
    await Promise.all(['web-1', 'web-2'].map((p) => kl.lab.serve(p, { tcp: [8080] })));
    await kl.startAndWait(() => kl.lab.connect({ from: '10.244.1.99', via: 'world', to: VIP, port: 80 }));
  });
  after(() => kl?.close());

  it('the same client sticks to one endpoint', async () => {
    const out: Outcome[] = [];
    for (let i = 0; i < 12; i++) out.push(await kl.lab.connect({ from: '10.244.1.50', to: VIP, port: 80 }));
    const seen = new Set(out.map(endpointOf));
    assert.equal(seen.size, 1, `one client reached ${[...seen].join(', ')}`);
    assert.match([...seen][0], /^10\.244\.1\.1[01]:8080$/);
  });

  it('different clients spread over the endpoints, each sticking to its own', async () => {
    for (const c of CLIENTS) first.set(c, endpointOf(await kl.lab.connect({ from: c, to: VIP, port: 80 })));
    const again = await Promise.all(CLIENTS.map((c) => kl.lab.burst({ from: c, to: VIP, port: 80, count: 4 })));
    CLIENTS.forEach((c, i) => assert.deepEqual([...new Set(again[i].map(endpointOf))], [first.get(c)], `client ${c} moved`));
    assert.deepEqual([...new Set(first.values())].sort(), ['10.244.1.10:8080', '10.244.1.11:8080']);
  });

  it('a client keeps its endpoint whichever service IP it uses', async () => {
    const sticks = async (c: string) => {
      const viaVip = endpointOf(await kl.lab.connect({ from: c, to: VIP, port: 80 }));
      const viaExternal = verdict(await kl.lab.connect({ from: c, to: EXTERNAL_IP, port: 80 }), EXTERNAL_IP, 80);
      return { viaVip, viaExternal };
    };
    // per service IP, 16 clients all landing on the same endpoint both ways has p = 2^-16
    const seen = await Promise.all(CLIENTS.map(sticks));
    CLIENTS.forEach((c, i) => {
      assert.match(seen[i].viaVip, /^10\.244\.1\.1[01]:8080$/, c);
      assert.equal(seen[i].viaExternal, seen[i].viaVip, `client ${c}`);
    });
  });

  it(`after ${TIMEOUT_S}s without connections, a client may be placed elsewhere`, async () => {
    await new Promise((r) => setTimeout(r, TIMEOUT_S * 1000 + 1200));
    const now = await Promise.all(CLIENTS.map((c) => kl.lab.connect({ from: c, to: VIP, port: 80 })));
    const moved = CLIENTS.filter((c, i) => endpointOf(now[i]) !== first.get(c));
    for (const o of now) assert.match(endpointOf(o), /^10\.244\.1\.1[01]:8080$/, describeOutcome(o));
    // if affinity never expired, none of the 16 would move; with expiry all 16 staying has p = 2^-16
    assert.ok(moved.length > 0, 'no client changed endpoint after the affinity timeout');
  });
});
