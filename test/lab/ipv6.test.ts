// IPv6: ClusterIP and NodePort, single-stack IPv6 and dual-stack Services,
// for every backend (nft's ip6 table, ip6tables). A ClusterIP on an undefined
// port, or an unallocated one, is where they differ: nftables rejects or
// drops, iptables leaves it alone ("", answered by the world).
import { it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { Lab, POD_GATEWAY, describeOutcome, seenSource, verdict } from '../../src/lab/index.js';
import { node, service, serviceCIDR, slice } from '../helpers/k8s.js';
import { trace, formatTrace, type TraceRequest } from '../../src/trace/index.js';
import { answeredBy, applyOnce, backendConfig, backendTag, describeBackends } from '../helpers/lab-kpng.js';

const NODE6 = '2001:db8::1';

await describeBackends('IPv6 ClusterIP and NodePort', (b) => {
  let lab: Lab;
  before(async () => {
    lab = await Lab.create({
      tag: `ipv6${backendTag(b)}`,
      node: { name: 'node-a', interfaces: [{ name: 'eth0', addresses: ['192.168.0.2/24', `${NODE6}/64`] }] },
      pods: [
        { name: 'web-1', ips: ['10.244.1.10', 'fd00:10::10'] },
        { name: 'web-2', ips: ['10.244.1.11', 'fd00:10::11'] },
        { name: 'client', ips: ['10.244.1.50', 'fd00:10::50'] },
      ],
    });
    // the world answers what kpng leaves alone ("")
    await Promise.all([...['web-1', 'web-2'].map((p) => lab.serve(p, { tcp: [8080], udp: [5353] })), lab.serve('world', { tcp: [80, 443] })]);
    await applyOnce(
      b,
      lab,
      [
        node('node-a', undefined, ['192.168.0.2', NODE6]),
        serviceCIDR('kubernetes', ['10.96.0.0/16', 'fd00:96::/112']),
        service('demo', 'web6', {
          type: 'NodePort',
          clusterIP: 'fd00:96::10',
          ipFamilies: ['IPv6'],
          ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080, nodePort: 30080 }, { name: 'dns', port: 53, protocol: 'UDP', targetPort: 5353, nodePort: 30053 }],
        }),
        slice('demo', 'web6-1', 'web6', [{ ip: 'fd00:10::10', node: 'node-a' }, { ip: 'fd00:10::11', node: 'node-a' }], [{ name: 'http', port: 8080 }, { name: 'dns', port: 5353, protocol: 'UDP' }]),
        service('demo', 'dual', {
          clusterIP: '10.96.0.20',
          clusterIPs: ['10.96.0.20', 'fd00:96::20'],
          ipFamilies: ['IPv4', 'IPv6'],
          ipFamilyPolicy: 'RequireDualStack',
          ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }],
        }),
        slice('demo', 'dual-v4', 'dual', [{ ip: '10.244.1.10', node: 'node-a' }]),
        slice('demo', 'dual-v6', 'dual', [{ ip: 'fd00:10::11', node: 'node-a' }]),
      ],
      backendConfig(b, { clusterCIDR: '10.244.0.0/16,fd00:10::/64' }),
    );
  });
  after(() => lab?.close());

  it('a pod reaches an IPv6 ClusterIP: both endpoints, unmasqueraded (TCP and UDP)', async () => {
    for (const [port, protocol, target] of [[80, 'TCP', 8080], [53, 'UDP', 5353]] as const) {
      const out = await lab.burst({ from: 'fd00:10::50', to: 'fd00:96::10', port, protocol, count: 20 });
      assert.deepEqual(answeredBy(out), [`[fd00:10::10]:${target}`, `[fd00:10::11]:${target}`], out.map(describeOutcome).join('\n'));
      for (const o of out) assert.equal(seenSource(o), 'fd00:10::50');
    }
  });

  it('an external IPv6 client reaches the NodePort on the node\'s IPv6 address, masqueraded', async () => {
    const out = await lab.burst({ from: '2600:5200::1', to: NODE6, port: 30080, count: 20 });
    assert.deepEqual(answeredBy(out), ['[fd00:10::10]:8080', '[fd00:10::11]:8080'], out.map(describeOutcome).join('\n'));
    for (const o of out) assert.equal(seenSource(o), POD_GATEWAY[6]);
    const udp = await lab.connect({ from: '2600:5200::1', to: NODE6, port: 30053, protocol: 'UDP' });
    assert.match(verdict(udp, NODE6, 30053), /^\[fd00:10::1[01]\]:5353$/, describeOutcome(udp));
  });

  // nftables: REJECT (a known ClusterIP, undefined port), DROP (unallocated, in the service CIDR); iptables: both left alone
  const [undefinedPort, unallocated] = b.name === 'nft' ? ['REJECT', 'DROP'] : ['', ''];
  it(`a known ClusterIP (IPv6, IPv4) on an undefined port: ${undefinedPort || '""'}; an unallocated IPv6 one in the service CIDR: ${unallocated || '""'}`, async () => {
    const [rej6, rej4, drop] = await Promise.all([
      lab.connect({ from: 'fd00:10::50', to: 'fd00:96::10', port: 443 }),
      lab.connect({ from: '10.244.1.50', to: '10.96.0.20', port: 443 }),
      lab.connect({ from: 'fd00:10::50', to: 'fd00:96::99', port: 80 }),
    ]);
    assert.equal(verdict(rej6, 'fd00:96::10', 443), undefinedPort, describeOutcome(rej6));
    assert.equal(verdict(rej4, '10.96.0.20', 443), undefinedPort, describeOutcome(rej4));
    assert.equal(verdict(drop, 'fd00:96::99', 80), unallocated, describeOutcome(drop));
  });

  it('a dual-stack Service answers on both ClusterIPs, each from its family\'s endpoints', async () => {
    const v4 = await lab.connect({ from: '10.244.1.50', to: '10.96.0.20', port: 80 });
    const v6 = await lab.connect({ from: 'fd00:10::50', to: 'fd00:96::20', port: 80 });
    assert.equal(verdict(v4, '10.96.0.20', 80), '10.244.1.10:8080', describeOutcome(v4));
    assert.equal(verdict(v6, 'fd00:96::20', 80), '[fd00:10::11]:8080', describeOutcome(v6));
  });
  // kpng trace over the ip6 table / ip6tables the kernel holds predicts each case above
  it('kpng trace predicts the IPv6 outcomes from the rules in the kernel', async () => {
    const exec = (argv: string[]) => lab.exec(lab.nodeName, argv);
    const cases: [TraceRequest, string, string[], boolean][] = [
      [{ src: 'fd00:10::50', dst: 'fd00:96::10', dport: 80 }, 'dnat', ['[fd00:10::10]:8080', '[fd00:10::11]:8080'], false],
      [{ src: 'fd00:10::50', dst: 'fd00:96::10', dport: 53, proto: 'udp' }, 'dnat', ['[fd00:10::10]:5353', '[fd00:10::11]:5353'], false],
      [{ src: '2600:5200::1', dst: NODE6, dport: 30080 }, 'dnat', ['[fd00:10::10]:8080', '[fd00:10::11]:8080'], true],
      [{ src: 'fd00:10::50', dst: 'fd00:96::20', dport: 80 }, 'dnat', ['[fd00:10::11]:8080'], false],
      [{ src: 'fd00:10::50', dst: 'fd00:96::10', dport: 443 }, undefinedPort ? undefinedPort.toLowerCase() : 'accept', [], false],
      [{ src: 'fd00:10::50', dst: 'fd00:96::99', dport: 80 }, unallocated ? unallocated.toLowerCase() : 'accept', [], false],
    ];
    for (const [req, v, endpoints, masq] of cases) {
      const t = await trace(req, exec);
      const what = `${JSON.stringify(req)}\n${formatTrace(t)}`;
      assert.equal(t.verdict, v, what);
      assert.deepEqual([...t.endpoints].sort(), endpoints, what);
      assert.equal(t.masquerade, masq, what);
      assert.deepEqual(t.unknown, [], what);
    }
  });
});
