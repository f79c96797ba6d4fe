// to-userspace with real packets: ClusterIP, NodePort, externalIP and
// LoadBalancer IP from a pod, from the node itself and from outside; TCP and
// UDP, IPv4 and IPv6; balanced over the endpoints; ClientIP affinity;
// Services without endpoints refused; eTP=Local; endpoints changing under an
// open connection. The endpoint sees the node's address as the source (kpng
// connects to it): the node's pod-link address here.
import { it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { POD_GATEWAY, describeOutcome, seenSource, type Outcome } from '../../src/lab/index.js';
import { node, service, serviceCIDR, slice } from '../helpers/k8s.js';
import { KpngLab, backendConfig, describeBackends } from '../helpers/lab-kpng.js';
import { until, type UntilOptions } from '../helpers/until.js';

const NODE4 = '192.168.0.2';
const NODE6 = '2001:db8::1';
const WEB = { 4: ['10.244.1.10', '10.244.1.11'], 6: ['fd00:10::10', 'fd00:10::11'] } as const;
const VIP = { 4: '10.96.0.10', 6: 'fd00:96::10' } as const;
const EXT = { 4: '198.51.100.80', 6: '2001:db8:80::80' } as const;
const LB = { 4: '198.51.100.90', 6: '2001:db8:90::90' } as const;
const NODE = { 4: NODE4, 6: NODE6 } as const;
const CLIENT = { pod: { 4: '10.244.1.50', 6: 'fd00:10::50' }, host: NODE, outside: { 4: '203.0.113.7', 6: '2001:db8:77::7' } } as const;

const webPorts = [
  { name: 'http', port: 80, protocol: 'TCP', targetPort: 8080, nodePort: 30080 },
  { name: 'dns', port: 53, protocol: 'UDP', targetPort: 5353, nodePort: 30053 },
];
const slicePorts = [
  { name: 'http', port: 8080 },
  { name: 'dns', port: 5353, protocol: 'UDP' },
];

export function objects(webEndpoints: { 4: readonly string[]; 6: readonly string[] } = WEB): Record<string, any>[] {
  return [
    node('node-a', undefined, [NODE4, NODE6]),
    node('node-b', undefined, ['192.168.50.3']),
    serviceCIDR('kubernetes', ['10.96.0.0/16', 'fd00:96::/112']),
    service(
      'demo',
      'web',
      {
        type: 'LoadBalancer',
        clusterIP: VIP[4],
        clusterIPs: [VIP[4], VIP[6]],
        ipFamilies: ['IPv4', 'IPv6'],
        ipFamilyPolicy: 'RequireDualStack',
        externalIPs: [EXT[4], EXT[6]],
        ports: webPorts,
      },
      { status: { loadBalancer: { ingress: [{ ip: LB[4] }, { ip: LB[6] }] } } },
    ),
    slice('demo', 'web-v4', 'web', webEndpoints[4].map((ip) => ({ ip, node: 'node-a' })), slicePorts),
    slice('demo', 'web-v6', 'web', webEndpoints[6].map((ip) => ({ ip, node: 'node-a' })), slicePorts),
    service('demo', 'sticky', { clusterIP: '10.96.0.11', externalIPs: ['198.51.100.81'], sessionAffinity: 'ClientIP', sessionAffinityConfig: { clientIP: { timeoutSeconds: 2 } }, ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }] }),
    slice('demo', 'sticky-1', 'sticky', WEB[4].map((ip) => ({ ip, node: 'node-a' }))),
    service('demo', 'none', { type: 'NodePort', clusterIP: '10.96.0.12', ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080, nodePort: 30090 }, { name: 'dns', port: 53, protocol: 'UDP', targetPort: 5353, nodePort: 30091 }] }),
    // eTP=Local, its only endpoint on node-b: from outside nothing; from the node, the cluster-wide endpoints
    service('demo', 'far', { type: 'NodePort', clusterIP: '10.96.0.13', externalTrafficPolicy: 'Local', ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080, nodePort: 30081 }] }),
    slice('demo', 'far-1', 'far', [{ ip: '10.244.2.10', node: 'node-b' }]),
    // loadBalancerSourceRanges: one client in, one out
    service(
      'demo',
      'fw',
      { type: 'LoadBalancer', clusterIP: '10.96.0.14', loadBalancerSourceRanges: ['203.0.113.0/25'], ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080, nodePort: 30085 }] },
      { status: { loadBalancer: { ingress: [{ ip: '198.51.100.95' }] } } },
    ),
    slice('demo', 'fw-1', 'fw', [{ ip: WEB[4][0], node: 'node-a' }]),
  ];
}

type Fam = 4 | 6;
type From = keyof typeof CLIENT;
const kinds = (f: Fam) => [
  { kind: 'ClusterIP', to: VIP[f], tcp: 80, udp: 53 },
  { kind: 'NodePort', to: NODE[f], tcp: 30080, udp: 30053 },
  { kind: 'externalIP', to: EXT[f], tcp: 80, udp: 53 },
  { kind: 'LoadBalancer IP', to: LB[f], tcp: 80, udp: 53 },
];

const endpointOf = (o: Outcome) => (o.kind === 'answered' ? o.local : o.kind.toUpperCase());

await describeBackends(
  'to-userspace: the userspace proxy with real packets',
  () => {
    let kl: KpngLab;
    before(async () => {
      kl = await KpngLab.create(
        { name: 'userspace' },
        {
          tag: 'us',
          node: { name: 'node-a', interfaces: [{ name: 'eth0', addresses: [`${NODE4}/24`, `${NODE6}/64`] }] },
          peers: [{ name: 'node-b', ips: ['192.168.50.3'] }],
          pods: [
            { name: 'web-1', ips: [WEB[4][0], WEB[6][0]] },
            { name: 'web-2', ips: [WEB[4][1], WEB[6][1]] },
            { name: 'web-b', ips: ['10.244.2.10'], node: 'node-b' },
            { name: 'client', ips: [CLIENT.pod[4], CLIENT.pod[6]] },
          ],
        },
        objects(),
        backendConfig({ name: 'userspace' }, { clusterCIDR: '10.244.0.0/16,fd00:10::/64', minSyncPeriod: '0s' }),
      );
      await Promise.all([...['web-1', 'web-2', 'web-b'].map((p) => kl.lab.serve(p, { tcp: [8080], udp: [5353] })), kl.lab.serve('world', { tcp: [80] })]);
      await kl.startAndWait(() => kl.lab.connect({ from: CLIENT.pod[4], to: VIP[4], port: 80 }));
    });
    after(() => kl?.close());

    for (const f of [4, 6] as const) {
      for (const from of ['pod', 'host', 'outside'] as const) {
        for (const k of kinds(f)) {
          for (const protocol of ['TCP', 'UDP'] as const) {
            it(`IPv${f} ${k.kind} ${protocol} from ${from === 'host' ? 'the node' : from}: balanced over both endpoints`, async () => {
              const send = () => kl.lab.burst({ from: CLIENT[from as From][f], to: k.to, port: k[protocol === 'TCP' ? 'tcp' : 'udp'], protocol, count: 8 });
              const out = await send();
              const seen = [...new Set(out.map(endpointOf))].sort();
              const port = protocol === 'TCP' ? 8080 : 5353;
              const want = WEB[f].map((ip) => (f === 6 ? `[${ip}]:${port}` : `${ip}:${port}`)).sort();
              assert.deepEqual(seen, want, out.map(describeOutcome).join('\n'));
              // the endpoint sees the node (kpng's own connection), not the client
              for (const o of out) assert.equal(seenSource(o), POD_GATEWAY[f], describeOutcome(o));
            });
          }
        }
      }
    }

    it('ClientIP affinity: a client sticks to its endpoint, clients spread', async () => {
      const clients = Array.from({ length: 12 }, (_, i) => `203.0.113.${20 + i}`);
      const firsts: string[] = [];
      for (const c of clients) {
        const out = await kl.lab.burst({ from: c, to: '10.96.0.11', port: 80, count: 4 });
        const seen = new Set(out.map(endpointOf));
        assert.equal(seen.size, 1, `${c} reached ${[...seen].join(', ')}`);
        firsts.push([...seen][0]);
      }
      assert.deepEqual([...new Set(firsts)].sort(), ['10.244.1.10:8080', '10.244.1.11:8080']);
      // whichever address of the service port the client uses (another listener), the same endpoint
      for (const [i, c] of clients.entries()) {
        const o = await kl.lab.connect({ from: c, to: '198.51.100.81', port: 80 });
        assert.equal(endpointOf(o), firsts[i], `${c} via the external IP: ${describeOutcome(o)}`);
      }
    });

    for (const from of ['pod', 'host', 'outside'] as const) {
      it(`a Service without endpoints is refused (TCP and UDP, ClusterIP and NodePort) from ${from === 'host' ? 'the node' : from}`, async () => {
        const c = CLIENT[from][4];
        for (const [to, port] of [['10.96.0.12', 80], [NODE4, 30090]] as const) assert.equal((await kl.lab.connect({ from: c, to, port })).kind, 'refused', `tcp ${to}:${port}`);
        for (const [to, port] of [['10.96.0.12', 53], [NODE4, 30091]] as const) {
          const o = await kl.lab.connect({ from: c, to, port, protocol: 'UDP' });
          // from the node itself the REJECT in the output hook fails the send at once (EPERM)
          const refused = o.kind === 'refused' || (from === 'host' && o.kind === 'error' && o.code === 'EPERM');
          assert.ok(refused, `udp ${to}:${port}: ${describeOutcome(o)}`);
        }
      });
    }

    it('eTP=Local without a local endpoint: the node reaches the cluster-wide endpoint, outside gets nothing', async () => {
      const fromNode = await kl.lab.connect({ from: NODE4, to: NODE4, port: 30081 });
      assert.equal(endpointOf(fromNode), '10.244.2.10:8080', describeOutcome(fromNode));
      const viaVip = await kl.lab.connect({ from: CLIENT.pod[4], to: '10.96.0.13', port: 80 });
      assert.equal(endpointOf(viaVip), '10.244.2.10:8080', describeOutcome(viaVip));
      const outside = await kl.lab.connect({ from: CLIENT.outside[4], to: NODE4, port: 30081, timeoutMs: 1500 });
      assert.notEqual(outside.kind, 'answered', describeOutcome(outside));
    });

    it('loadBalancerSourceRanges: a source in the ranges reaches the LB IP, one outside them is dropped', async () => {
      const inside = await kl.lab.connect({ from: '203.0.113.7', to: '198.51.100.95', port: 80 });
      assert.equal(endpointOf(inside), '10.244.1.10:8080', describeOutcome(inside));
      const outside = await kl.lab.connect({ from: '203.0.113.200', to: '198.51.100.95', port: 80, timeoutMs: 1500 });
      assert.equal(outside.kind, 'timeout', describeOutcome(outside));
    });

    it('endpoints change under open connections: they keep their endpoint, new ones follow', async () => {
      const conns = await Promise.all([0, 1, 2, 3].map(() => kl.lab.open({ from: CLIENT.pod[4], to: VIP[4], port: 80 })));
      try {
        const was = conns.map((c) => endpointOf(c.first));
        assert.ok(was.includes('10.244.1.10:8080'), `none of ${was.join(', ')} on web-1`);
        // web-1 leaves the Service (the pod still runs: its open connections may go on)
        kl.setState(objects({ 4: [WEB[4][1]], 6: WEB[6] }));
        const burst = () => kl.lab.burst({ from: CLIENT.pod[4], to: VIP[4], port: 80, count: 6 });
        await until('new connections to leave web-1', async () => (await burst()).every((x) => endpointOf(x) === '10.244.1.11:8080'), whileKpngRuns(kl));
        for (let i = 0; i < conns.length; i++) {
          const again = await conns[i].send();
          assert.equal(endpointOf(again), was[i], `connection ${i}: ${describeOutcome(again)}`);
        }
        // and back: both again, nothing reopened (the listener keeps its port)
        kl.setState(objects());
        await until('web-1 to come back', async () => new Set((await burst()).map(endpointOf)).size === 2, whileKpngRuns(kl));
      } finally {
        await Promise.all(conns.map((c) => c.close().catch(() => {})));
      }
    });

    it('health and metrics: /healthz healthy, /proxyMode userspace, per-Service counters', async () => {
      const get = async (url: string) => {
        const script = `fetch(${JSON.stringify(url)}).then(async (r) => console.log(r.status + '\\n' + (await r.text())), (e) => console.log('error ' + e.message))`;
        return (await kl.lab.exec('node-a', [process.execPath, '-e', script])).stdout;
      };
      assert.match(await get('http://127.0.0.1:10256/healthz'), /^200\n/);
      assert.match(await get('http://127.0.0.1:10249/proxyMode'), /^200\nuserspace/);
      const m = await get('http://127.0.0.1:10249/metrics');
      const count = (re: RegExp) => Number(re.exec(m)?.[1] ?? 0);
      assert.ok(count(/^kpng_userspace_connections_total\{service="demo\/web",protocol="tcp"\} (\d+)/m) > 0, m.slice(0, 3000));
      assert.ok(count(/^kpng_userspace_connections_total\{service="demo\/web",protocol="udp"\} (\d+)/m) > 0);
      assert.ok(count(/^kpng_userspace_bytes_total\{service="demo\/web",protocol="tcp",direction="to_client"\} (\d+)/m) > 0);
      assert.ok(count(/^kpng_userspace_errors_total\{service="demo\/far",protocol="tcp",reason="no_endpoints"\} (\d+)/m) > 0, 'eTP=Local from outside, counted');
    });

    it('restart: the rules stay while kpng is down, the listeners come back; connections through the old process are lost', async () => {
      const held = await kl.lab.open({ from: CLIENT.pod[4], to: VIP[4], port: 80 });
      try {
        assert.equal(held.first.kind, 'answered', describeOutcome(held.first));
        await kl.kpng!.stop();
        const table = await kl.lab.exec('node-a', ['nft', 'list', 'table', 'inet', 'kpng-userspace']);
        assert.match(table.stdout, /service-ips-v4/, 'the table went with the process');
        const lost = await held.send(1500);
        assert.notEqual(lost.kind, 'answered', `a connection through the stopped process: ${describeOutcome(lost)}`);
        await kl.startAndWait(() => kl.lab.connect({ from: CLIENT.pod[4], to: VIP[4], port: 80 }));
        const out = await kl.lab.burst({ from: CLIENT.outside[6], to: NODE6, port: 30053, protocol: 'UDP', count: 6 });
        assert.equal(new Set(out.map(endpointOf)).size, 2, out.map(describeOutcome).join('\n'));
      } finally {
        await held.close().catch(() => {});
      }
    });
  },
  [{ name: 'userspace' }],
);

/** until() options for a lab's bursts: they take a while, and kpng must stay up */
function whileKpngRuns(kl: KpngLab): UntilOptions {
  return {
    timeoutMs: 15_000,
    everyMs: 200,
    failIf: () => (kl.kpng && kl.kpng.process.exitCode !== null ? `kpng exited:\n${kl.kpng.stderr.slice(-2000)}\n` : undefined),
  };
}
