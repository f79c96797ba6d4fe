// Localhost NodePorts: to-nft serves 127.0.0.1:<nodePort> and [::1]:<nodePort>
// through the userspace proxy (KEP-6032: the feature gate
// KubeProxyNFTablesLocalhostNodePorts, on by default, and nodePortAddresses
// naming localhost), with real packets, and answers as to-iptables does
// (route_localnet) for the same Services: eTP=Cluster, eTP=Local with and
// without a local endpoint, a Service without endpoints, TCP and UDP. IPv6 is
// where they differ: iptables cannot serve ::1 (no route_localnet in IPv6),
// to-nft does. Upstream's TestNodePorts localhost cases (iptables) hold for
// to-nft's knobs: served when enabled and localhost is in nodePortAddresses
// (the keyword or 127.0.0.0/8 among other CIDRs); not when the default
// nodePortAddresses leaves it out, nor with the feature gate off.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { Lab, POD_GATEWAY, describeOutcome, seenSource, type Outcome } from '../../src/lab/index.js';
import { node, service, serviceCIDR, slice } from '../helpers/k8s.js';
import { KpngLab, applyOnce, backendConfig, backendLabUnsupported, type LabBackend } from '../helpers/lab-kpng.js';

const NODE4 = '192.168.0.2';
const NODE6 = '2001:db8::1';
const NFT: LabBackend = { name: 'nft' };
const IPT: LabBackend = { name: 'iptables', mode: 'nft' };

const objects = [
  node('node-a', undefined, [NODE4, NODE6]),
  node('node-b', undefined, ['192.168.50.3']),
  serviceCIDR('kubernetes', ['10.96.0.0/16', 'fd00:96::/112']),
  service('demo', 'cluster', {
    type: 'NodePort',
    clusterIP: '10.96.0.10',
    ports: [
      { name: 'http', port: 80, protocol: 'TCP', targetPort: 8080, nodePort: 30080 },
      { name: 'dns', port: 53, protocol: 'UDP', targetPort: 5353, nodePort: 30053 },
    ],
  }),
  slice('demo', 'cluster-1', 'cluster', [{ ip: '10.244.1.10', node: 'node-a' }, { ip: '10.244.2.10', node: 'node-b' }], [{ name: 'http', port: 8080 }, { name: 'dns', port: 5353, protocol: 'UDP' }]),
  service('demo', 'local-here', { type: 'NodePort', clusterIP: '10.96.0.11', externalTrafficPolicy: 'Local', ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080, nodePort: 30081 }] }),
  slice('demo', 'local-here-1', 'local-here', [{ ip: '10.244.1.10', node: 'node-a' }, { ip: '10.244.2.10', node: 'node-b' }]),
  service('demo', 'local-far', { type: 'NodePort', clusterIP: '10.96.0.12', externalTrafficPolicy: 'Local', ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080, nodePort: 30082 }] }),
  slice('demo', 'local-far-1', 'local-far', [{ ip: '10.244.2.10', node: 'node-b' }]),
  service('demo', 'none', { type: 'NodePort', clusterIP: '10.96.0.13', ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080, nodePort: 30084 }] }),
  service('demo', 'six', {
    type: 'NodePort',
    clusterIP: 'fd00:96::10',
    ipFamilies: ['IPv6'],
    ports: [
      { name: 'http', port: 80, protocol: 'TCP', targetPort: 8080, nodePort: 30086 },
      { name: 'dns', port: 53, protocol: 'UDP', targetPort: 5353, nodePort: 30087 },
    ],
  }),
  slice('demo', 'six-1', 'six', [{ ip: 'fd00:10::10', node: 'node-a' }], [{ name: 'http', port: 8080 }, { name: 'dns', port: 5353, protocol: 'UDP' }]),
];

const spec = (tag: string) => ({
  tag,
  node: { name: 'node-a', interfaces: [{ name: 'lo', addresses: ['127.0.0.1/8', '::1/128'] }, { name: 'eth0', addresses: [`${NODE4}/24`, `${NODE6}/64`] }] },
  peers: [{ name: 'node-b', ips: ['192.168.50.3'] }],
  pods: [
    { name: 'web-a', ips: ['10.244.1.10', 'fd00:10::10'] },
    { name: 'web-b', ips: ['10.244.2.10'], node: 'node-b' },
  ],
});

const CASES = [
  { title: 'eTP=Cluster TCP', to: '127.0.0.1', port: 30080, protocol: 'TCP' as const },
  { title: 'eTP=Cluster UDP', to: '127.0.0.1', port: 30053, protocol: 'UDP' as const },
  { title: 'eTP=Local with a local endpoint', to: '127.0.0.1', port: 30081, protocol: 'TCP' as const },
  { title: 'eTP=Local without a local endpoint', to: '127.0.0.1', port: 30082, protocol: 'TCP' as const },
  { title: 'no endpoints', to: '127.0.0.1', port: 30084, protocol: 'TCP' as const },
];
const V6 = { title: 'IPv6 [::1]', to: '::1', port: 30086, protocol: 'TCP' as const };
const V6UDP = { title: 'IPv6 [::1] UDP', to: '::1', port: 30087, protocol: 'UDP' as const };
/** every port the node itself also serves: a NodePort kpng leaves alone is answered by the node ("") */
const NODE_TCP = [30080, 30081, 30082, 30084, 30086];

/** the endpoints that answered, "" for the node itself, or the failure */
async function answers(lab: Lab, c: { to: string; port: number; protocol: 'TCP' | 'UDP' }): Promise<{ seen: string[]; out: Outcome[] }> {
  const out = await lab.burst({ from: c.to, to: c.to, port: c.port, protocol: c.protocol, count: 16, timeoutMs: 1500 });
  const seen = [...new Set(out.map((o) => (o.kind !== 'answered' ? o.kind.toUpperCase() : o.by === 'node-a' ? '' : o.local)))].sort();
  return { seen, out };
}

const skip = (await backendLabUnsupported(NFT)) ?? (await backendLabUnsupported(IPT));

describe('localhost NodePorts: to-nft through the userspace proxy, as to-iptables', { skip, concurrency: 1 }, () => {
  let nft: KpngLab;
  let ipt: Lab;
  const iptAnswers = new Map<string, string[]>();

  before(async () => {
    ipt = await Lab.create(spec('lhipt'));
    await Promise.all([ipt.serve('web-a', { tcp: [8080], udp: [5353] }), ipt.serve('web-b', { tcp: [8080], udp: [5353] }), ipt.serve('node-a', { tcp: NODE_TCP, udp: [30053, 30087], udpHosts: ['127.0.0.1', '::1', NODE4, NODE6] })]);
    await applyOnce(IPT, ipt, objects, backendConfig(IPT, { clusterCIDR: '10.244.0.0/16,fd00:10::/64' }));
    for (const c of [...CASES, V6, V6UDP]) iptAnswers.set(c.title, (await answers(ipt, c)).seen);
    await ipt.close();

    nft = await KpngLab.create(NFT, spec('lhnft'), objects, backendConfig(NFT, { clusterCIDR: '10.244.0.0/16,fd00:10::/64', nodePortAddresses: ['primary', 'localhost'], syncPeriod: '1s' }));
    await Promise.all([nft.lab.serve('web-a', { tcp: [8080], udp: [5353] }), nft.lab.serve('web-b', { tcp: [8080], udp: [5353] }), nft.lab.serve('node-a', { tcp: NODE_TCP, udp: [30053, 30087], udpHosts: ['127.0.0.1', '::1', NODE4, NODE6] })]);
    await nft.startAndWait(() => nft.lab.connect({ from: '127.0.0.1', to: '127.0.0.1', port: 30080 }).then((o) => (o.kind === 'answered' && o.by === 'node-a' ? { ...o, by: 'world' } : o)));
  });
  after(async () => {
    await ipt?.close();
    await nft?.close();
  });

  for (const c of CASES) {
    it(`${c.title}: 127.0.0.1:${c.port} answers as with to-iptables`, async () => {
      const { seen, out } = await answers(nft.lab, c);
      assert.deepEqual(seen, iptAnswers.get(c.title), out.map(describeOutcome).join('\n'));
      // the endpoint sees the node, as with iptables' masquerade
      for (const o of out) if (o.kind === 'answered' && o.by !== 'node-a') assert.equal(seenSource(o), POD_GATEWAY[4], describeOutcome(o));
    });
  }

  it('the expected answers themselves (to-iptables, route_localnet)', () => {
    assert.deepEqual(iptAnswers.get('eTP=Cluster TCP'), ['10.244.1.10:8080', '10.244.2.10:8080']);
    assert.deepEqual(iptAnswers.get('eTP=Cluster UDP'), ['10.244.1.10:5353', '10.244.2.10:5353']);
    // from the node, eTP=Local goes to every endpoint
    assert.deepEqual(iptAnswers.get('eTP=Local with a local endpoint'), ['10.244.1.10:8080', '10.244.2.10:8080']);
    assert.deepEqual(iptAnswers.get('eTP=Local without a local endpoint'), ['10.244.2.10:8080']);
    assert.deepEqual(iptAnswers.get('no endpoints'), ['REFUSED']);
    // IPv6: iptables leaves ::1 alone
    assert.deepEqual(iptAnswers.get(V6.title), ['']);
    assert.deepEqual(iptAnswers.get(V6UDP.title), ['']);
  });

  it('IPv6: [::1]:<nodePort> reaches the endpoint with to-nft, TCP and UDP (iptables cannot)', async () => {
    const { seen, out } = await answers(nft.lab, V6);
    assert.deepEqual(seen, ['[fd00:10::10]:8080'], out.map(describeOutcome).join('\n'));
    const udp = await answers(nft.lab, V6UDP);
    assert.deepEqual(udp.seen, ['[fd00:10::10]:5353'], udp.out.map(describeOutcome).join('\n'));
  });

  it("the node's own address still goes through to-nft's rules (the proxy only takes loopback)", async () => {
    const { seen, out } = await answers(nft.lab, { to: NODE4, port: 30080, protocol: 'TCP' });
    assert.deepEqual(seen, ['10.244.1.10:8080', '10.244.2.10:8080'], out.map(describeOutcome).join('\n'));
  });

  it('the periodic check puts the table back when someone deletes it', async () => {
    const del = await nft.lab.exec('node-a', ['nft', 'delete', 'table', 'inet', 'kpng-localhost-nodeports']);
    assert.equal(del.code, 0, del.stderr);
    assert.deepEqual((await answers(nft.lab, CASES[0])).seen, [''], 'the deletion did not take');
    let seen: string[] = [];
    for (let i = 0; i < 40 && seen.join() !== '10.244.1.10:8080,10.244.2.10:8080'; i++) {
      await new Promise((r) => setTimeout(r, 250));
      seen = (await answers(nft.lab, CASES[0])).seen;
    }
    assert.deepEqual(seen, ['10.244.1.10:8080', '10.244.2.10:8080'], nft.kpng!.stderr.slice(-2000));
  });

  // upstream's cases with to-nft's knobs (the gate for --iptables-localhost-nodeports); in each, the node and
  // outside still reach the NodePort on the node's address
  const GATE_OFF = { KubeProxyNFTablesLocalhostNodePorts: false };
  for (const [title, cfg, served] of [
    ['enabled: localhost (127.0.0.0/8) among other nodePortAddresses CIDRs', { nodePortAddresses: ['192.168.0.0/24', '127.0.0.0/8'] }, true],
    ['disabled: the gate off, localhost named', { nodePortAddresses: ['primary', 'localhost'], featureGates: GATE_OFF }, false],
    ['disabled, localhost in nodePortAddresses (192.168.0.0/24, 127.0.0.1/32)', { nodePortAddresses: ['192.168.0.0/24', '127.0.0.1/32'], featureGates: GATE_OFF }, false],
    ['multiple nodePortAddresses without localhost (192.168.0.0/24, 192.168.1.0/24, 2001:db8::/64)', { nodePortAddresses: ['192.168.0.0/24', '192.168.1.0/24', '2001:db8::/64'] }, false],
    ['the default nodePortAddresses (primary) leaves localhost out', {}, false],
  ] as const) {
    it(`upstream's TestNodePorts localhost case for to-nft: ${title}`, async () => {
      await nft.kpng?.stop();
      const { featureGates, ...np } = cfg as { featureGates?: Record<string, boolean>; nodePortAddresses?: string[] };
      writeFileSync(nft.configPath, JSON.stringify({ ...backendConfig(NFT, { clusterCIDR: '10.244.0.0/16,fd00:10::/64', ...np }), ...(featureGates ? { featureGates } : {}) }));
      await nft.startAndWait(() => nft.lab.connect({ from: '10.244.1.10', to: NODE4, port: 30080 }));
      // bounded: the first sync may still be running when the node port answers (until then the
      // table the last run left redirects to listeners that went with it: refused)
      const want = served ? ['10.244.1.10:8080', '10.244.2.10:8080'] : [''];
      let seen: string[] = [];
      for (let i = 0; i < 40; i++) {
        seen = (await answers(nft.lab, CASES[0])).seen;
        if (seen.join() === want.join()) break;
        await new Promise((r) => setTimeout(r, 250));
      }
      assert.deepEqual(seen, want, `localhost: ${nft.kpng!.stderr.slice(-2000)}`);
      const both = ['10.244.1.10:8080', '10.244.2.10:8080'];
      assert.deepEqual((await answers(nft.lab, { to: NODE4, port: 30080, protocol: 'TCP' })).seen, both, 'node to NodePort');
      const ext = await nft.lab.burst({ from: '203.0.113.9', to: NODE4, port: 30080, count: 16 });
      assert.deepEqual([...new Set(ext.map((o) => (o.kind === 'answered' ? o.local : o.kind)))].sort(), both, 'external to NodePort');
    });
  }
});
