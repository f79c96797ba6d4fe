// to-ebpf beside to-nft with real packets: the lab's client pod is put in a
// cgroup the test creates, the programs are attached to that cgroup only and
// pinned in a bpffs mount of the test's own; both are removed at the end
// (also on failure). What eBPF translated is told apart from what nftables
// did by kpng's translation counter and by a counter of packets to the
// Service addresses in the node's netfilter (zero when the socket was
// translated before a packet left it).
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { labCgroupUnsupported, describeOutcome, type LabCgroup, type Outcome } from '../../src/lab/index.js';
import { node, service, serviceCIDR, slice } from '../helpers/k8s.js';
import { answeredBy, backendConfig, backendLabUnsupported, createEbpfLab, pollUntil, restartEbpf, type EbpfLab, type EbpfNftBackend, type KpngLab } from '../helpers/lab-kpng.js';
import { skipOrFailInCI } from '../helpers/ci.js';
import { unlinkSync } from 'node:fs';
import { libbpfUnavailable, linkDetach, objGet } from '../../src/backends/ebpf/libbpf.js';
import { readCounters, type Counters } from '../../src/backends/ebpf/maps.js';

const VIP4 = '10.96.0.10';
const VIP6 = 'fd00:96::10';
const STICKY = '10.96.0.20';
const EMPTY = '10.96.0.30';
const EXT = '203.0.113.10';
const LB = '198.51.100.10';
const CLIENT = { v4: '10.244.1.5', v6: 'fd00:244::5' };
const A = { v4: '10.244.2.1', v6: 'fd00:244::21' };
const B = { v4: '10.244.2.2', v6: 'fd00:244::22' };
const NODE_IP = '192.168.0.2';
const ports = [
  { name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 },
  { name: 'dns', port: 53, protocol: 'UDP', targetPort: 5353 },
];
const slicePorts = [{ name: 'http', port: 8080 }, { name: 'dns', port: 5353, protocol: 'UDP' }];

function state(web: { v4: string; v6: string }[]) {
  return [
    node('node-a', undefined, [NODE_IP]),
    serviceCIDR('kubernetes', ['10.96.0.0/16', 'fd00:96::/112']),
    service(
      'demo',
      'web',
      { type: 'LoadBalancer', clusterIP: VIP4, clusterIPs: [VIP4, VIP6], ipFamilies: ['IPv4', 'IPv6'], ipFamilyPolicy: 'RequireDualStack', externalIPs: [EXT], ports: ports.map((p, i) => ({ ...p, nodePort: 30080 + i })) },
      { status: { loadBalancer: { ingress: [{ ip: LB }] } } },
    ),
    slice('demo', 'web-4', 'web', web.map((e) => ({ ip: e.v4, node: 'node-a' })), slicePorts),
    slice('demo', 'web-6', 'web', web.map((e) => ({ ip: e.v6, node: 'node-a' })), slicePorts, { addressType: 'IPv6' }),
    service('demo', 'sticky', { clusterIP: STICKY, ports: [ports[0]], sessionAffinity: 'ClientIP', sessionAffinityConfig: { clientIP: { timeoutSeconds: 300 } } }),
    slice('demo', 'sticky-1', 'sticky', [A, B].map((e) => ({ ip: e.v4, node: 'node-a' })), [slicePorts[0]]),
    service('demo', 'empty', { clusterIP: EMPTY, ports: [ports[0]] }),
  ];
}

// packets to the Service addresses that reach the node's netfilter (before kpng's DNAT)
const PROBE = `table inet ebpfprobe {
  chain pre { type filter hook prerouting priority -400; ip daddr { ${VIP4}, ${STICKY}, ${EXT}, ${LB} } counter; ip6 daddr ${VIP6} counter; }
  chain out { type filter hook output priority -400; ip daddr { ${VIP4}, ${STICKY}, ${EXT}, ${LB} } counter; ip6 daddr ${VIP6} counter; }
}
`;

const why = skipOrFailInCI(labCgroupUnsupported() ?? libbpfUnavailable()) ?? (await backendLabUnsupported({ name: 'ebpf+nft', cgroupPath: '', bpffs: '' }));

describe('to-ebpf beside to-nft (pods in a test cgroup)', { skip: why, concurrency: 1 }, () => {
  let cg: LabCgroup;
  let kl: KpngLab;
  let backend: EbpfNftBackend;

  const counters = (): Counters => {
    const fd = objGet(join(backend.bpffs, 'kpng_counters'));
    assert.ok(fd, 'the counters map is pinned');
    try {
      return readCounters(fd.fd);
    } finally {
      fd.close();
    }
  };
  /** packets to Service addresses netfilter saw in the node's namespace */
  const nftSeen = async (): Promise<number> => {
    const r = await kl.lab.exec('node-a', ['nft', 'list', 'table', 'inet', 'ebpfprobe']);
    assert.equal(r.code, 0, r.stderr);
    return [...r.stdout.matchAll(/packets (\d+)/g)].reduce((a, m) => a + Number(m[1]), 0);
  };
  const from = (ip: string, to: string, port = 80, protocol: 'TCP' | 'UDP' = 'TCP') => kl.lab.connect({ from: ip, to, port, protocol });
  const burst = (ip: string, to: string, count: number, port = 80, protocol: 'TCP' | 'UDP' = 'TCP') => kl.lab.burst({ from: ip, to, port, protocol, count });
  const isEndpoint = (o: Outcome) => o.kind === 'answered' && (o.by === 'ep-a' || o.by === 'ep-b');

  let lab: EbpfLab | undefined;
  before(async () => {
    lab = await createEbpfLab(
      {
        tag: 'ebpf',
        node: { name: 'node-a', interfaces: [{ name: 'eth0', addresses: [`${NODE_IP}/24`, 'fd00:1::2/64'] }] },
        pods: [
          { name: 'client', ips: [CLIENT.v4, CLIENT.v6] },
          { name: 'ep-a', ips: [A.v4, A.v6] },
          { name: 'ep-b', ips: [B.v4, B.v6] },
        ],
      },
      state([A, B]),
      backendConfig({ name: 'nft' }, { clusterCIDR: '10.244.0.0/16,fd00:244::/64', minSyncPeriod: '0s', syncPeriod: '1s' }),
      async (l) => {
        ({ kl, cg, backend } = l);
        const lab = kl.lab;
        // the client pod's agent is in the cgroup: its sockets are the programs' to translate
        cg.place(lab.agent('client').pid!);
        await Promise.all([lab.serve('ep-a', { tcp: [8080], udp: [5353] }), lab.serve('ep-b', { tcp: [8080], udp: [5353] }), lab.serve('node-a', { tcp: [8080] })]);
        const probe = await lab.exec('node-a', ['nft', '-f', '-'], { input: PROBE });
        assert.equal(probe.code, 0, probe.stderr);
        await kl.startAndWait(() => from(CLIENT.v4, VIP4), { pre: ['--log-level', 'debug'] });
        // both backends programmed: the node (outside the cgroup) goes through nftables
        const ready = await pollUntil(() => from(NODE_IP, VIP4), isEndpoint);
        assert.ok(ready.ok, describeOutcome(ready.value));
      },
    );
  });

  after(() => lab?.close());

  it('pod -> ClusterIP (TCP, IPv4) is translated by eBPF: the counter rises, no packet to the ClusterIP reaches netfilter', async () => {
    const c0 = counters();
    const n0 = await nftSeen();
    const out = await burst(CLIENT.v4, VIP4, 20);
    assert.deepEqual(answeredBy(out), [`${A.v4}:8080`, `${B.v4}:8080`]);
    // no masquerade: the endpoint sees the pod
    for (const o of out) if (o.kind === 'answered') assert.match(o.remote, new RegExp(`^${CLIENT.v4.replace(/\./g, '\\.')}:`));
    assert.ok(counters().translated - c0.translated >= 20, `every connection was translated by kpng_connect4: ${JSON.stringify(counters())}\n${(kl.kpng!.stdout + kl.kpng!.stderr).split('\n').filter((l) => /ebpf|error/i.test(l)).slice(-8).join('\n')}`);
    assert.equal(await nftSeen(), n0, 'no packet to the ClusterIP reached netfilter (no DNAT)');
  });

  it('/metrics: the programs\' translations, map fill levels and sizes', async () => {
    const r = await kl.lab.exec('node-a', [process.execPath, '-e', "fetch('http://127.0.0.1:10249/metrics').then((r) => r.text()).then((t) => console.log(t))"]);
    assert.equal(r.code, 0, r.stderr);
    const value = (re: RegExp) => Number(re.exec(r.stdout)?.[1] ?? NaN);
    assert.ok(value(/^kpng_ebpf_socket_operations_total\{result="translated"\} (\d+)/m) >= 20, r.stdout.split('\n').filter((l) => l.includes('ebpf')).join('\n'));
    // web: 2 cluster IPs x 2 ports, externalIP, LB IP, NodePorts on the node's IPv4 and 127.0.0.1 (x 2 ports each); sticky; empty
    assert.ok(value(/^kpng_ebpf_map_entries\{map="services"\} (\d+)/m) >= 10);
    assert.equal(value(/^kpng_ebpf_map_capacity\{map="endpoints"\} (\d+)/m), 262144);
  });

  it('pod -> externalIP, LoadBalancer IP and NodePort on the node address are translated by eBPF too', async () => {
    const c0 = counters();
    const n0 = await nftSeen();
    for (const [to, port] of [[EXT, 80], [LB, 80], [NODE_IP, 30080]] as const) {
      const out = await burst(CLIENT.v4, to, 6, port);
      assert.deepEqual(answeredBy(out).filter((x) => !x.endsWith(':8080')), [], `${to}:${port}: ${out.map(describeOutcome).join('; ')}`);
    }
    assert.ok(counters().translated - c0.translated >= 18);
    assert.equal(await nftSeen(), n0);
  });

  it('a process outside the cgroup is untouched: nftables DNATs it, the eBPF counter does not move', async () => {
    const c0 = counters();
    const n0 = await nftSeen();
    const out = await burst(NODE_IP, VIP4, 6);
    assert.ok(out.every(isEndpoint), out.map(describeOutcome).join('; '));
    assert.equal(counters().translated, c0.translated);
    assert.ok((await nftSeen()) > n0, 'the node process reached the ClusterIP through netfilter');
  });

  it('IPv6: pod -> ClusterIP (TCP and UDP) translated by kpng_connect6', async () => {
    const c0 = counters();
    // 30 each: both endpoints are picked but for a chance of 2^-29
    const tcp = await burst(CLIENT.v6, VIP6, 30);
    assert.deepEqual(answeredBy(tcp), [`[${A.v6}]:8080`, `[${B.v6}]:8080`]);
    const udp = await burst(CLIENT.v6, VIP6, 30, 53, 'UDP');
    assert.deepEqual(answeredBy(udp), [`[${A.v6}]:5353`, `[${B.v6}]:5353`]);
    assert.ok(counters().translated - c0.translated >= 60);
  });

  it('UDP, connected: translated at connect, answered by an endpoint', async () => {
    const c0 = counters();
    const n0 = await nftSeen();
    // 30: both endpoints are picked but for a chance of 2^-29 (10 failed once in a suite run)
    const out = await burst(CLIENT.v4, VIP4, 30, 53, 'UDP');
    assert.deepEqual(answeredBy(out), [`${A.v4}:5353`, `${B.v4}:5353`]);
    assert.ok(counters().translated - c0.translated >= 30);
    assert.equal(await nftSeen(), n0);
  });

  it('UDP unconnected (sendmsg/recvmsg) and TCP getpeername show the Service address, never the endpoint', async () => {
    const script = `
      const dgram = require('node:dgram'), net = require('node:net');
      const out = {};
      const s = dgram.createSocket('udp4');
      s.on('message', (m, r) => { out.udpFrom = r.address + ':' + r.port; out.udpBody = String(m).split(' ')[2]; s.close(); tcp(); });
      s.bind(0, '${CLIENT.v4}', () => s.send('x\\n', 53, '${VIP4}'));
      function tcp() {
        const c = net.connect({ host: '${VIP4}', port: 80, localAddress: '${CLIENT.v4}' }, () => {
          out.peer = c.remoteAddress + ':' + c.remotePort;
          c.write('y\\n');
        });
        c.on('data', (d) => { out.tcpBody = String(d).split(' ')[2]; console.log(JSON.stringify(out)); process.exit(0); });
      }
      setTimeout(() => { console.log(JSON.stringify(out)); process.exit(1); }, 5000);
    `;
    const c0 = counters();
    const r = await cg.exec(kl.lab.ns('client'), [process.execPath, '-e', script], { timeoutMs: 15_000 });
    assert.equal(r.code, 0, `${r.stdout}${r.stderr}`);
    const got = JSON.parse(r.stdout.trim().split('\n').pop()!);
    assert.equal(got.udpFrom, `${VIP4}:53`, 'the UDP reply comes from the Service address (recvmsg4)');
    assert.ok(['ep-a', 'ep-b'].includes(got.udpBody), `answered by an endpoint: ${got.udpBody}`);
    assert.equal(got.peer, `${VIP4}:80`, 'getpeername shows the Service address');
    assert.ok(['ep-a', 'ep-b'].includes(got.tcpBody));
    assert.ok(counters().reversed - c0.reversed >= 2);
  });

  it('a dual-stack socket (AF_INET6) reaching an IPv4 ClusterIP as ::ffff:a.b.c.d is translated, and getpeername shows that address', async () => {
    const script = `
      const c = require('node:net').connect({ host: '::ffff:${VIP4}', port: 80 }, () => { c.write('m\\n'); });
      c.on('data', (d) => { console.log(JSON.stringify({ peer: c.remoteAddress + ':' + c.remotePort, by: String(d).split(' ')[2] })); process.exit(0); });
      c.on('error', (e) => { console.log(JSON.stringify({ error: e.code })); process.exit(0); });
      setTimeout(() => { console.log(JSON.stringify({ error: 'TIMEOUT' })); process.exit(0); }, 4000);
    `;
    const c0 = counters();
    const r = await cg.exec(kl.lab.ns('client'), [process.execPath, '-e', script], { timeoutMs: 15_000 });
    const got = JSON.parse(r.stdout.trim().split('\n').pop() || '{}');
    assert.ok(['ep-a', 'ep-b'].includes(got.by), `${r.stdout}${r.stderr}`);
    assert.equal(got.peer, `::ffff:${VIP4}:80`);
    assert.ok(counters().translated > c0.translated);
  });

  it("NodePort on localhost: translated for the node's processes, never for a pod (its localhost is its own)", async () => {
    const probe = (ns: string) =>
      cg.exec(ns, [process.execPath, '-e', `const c = require('node:net').connect(30080, '127.0.0.1', () => c.write('z\\n')); c.on('data', (d) => { console.log(String(d).split(' ')[2]); process.exit(0); }); c.on('error', (e) => { console.log(e.code); process.exit(0); }); setTimeout(() => { console.log('TIMEOUT'); process.exit(0); }, 3000);`], { timeoutMs: 10_000 });
    const host = await probe(kl.lab.nodeNs);
    assert.ok(['ep-a', 'ep-b'].includes(host.stdout.trim()), `a node process in the cgroup reaches an endpoint: ${host.stdout}${host.stderr}`);
    const pod = await probe(kl.lab.ns('client'));
    assert.ok(!['ep-a', 'ep-b'].includes(pod.stdout.trim()), `a pod's 127.0.0.1 stays its own: ${pod.stdout}${pod.stderr}`);
  });

  it('ClientIP affinity: every connection of a pod goes to one endpoint', async () => {
    const out = await burst(CLIENT.v4, STICKY, 12);
    assert.equal(answeredBy(out).length, 1, out.map(describeOutcome).join('; '));
    assert.ok(out.every(isEndpoint));
  });

  it('a Service without endpoints refuses the connection (ECONNREFUSED from bpf_set_retval)', async () => {
    const c0 = counters();
    const o = await from(CLIENT.v4, EMPTY);
    assert.equal(o.kind, 'refused', describeOutcome(o));
    assert.equal(counters().refused - c0.refused, 1);
  });

  it('an endpoint removed while connections are open: new connections avoid it, the open one stays', async () => {
    const conn = await kl.lab.open({ from: CLIENT.v4, to: VIP4, port: 80 });
    try {
      assert.ok(isEndpoint(conn.first), describeOutcome(conn.first));
      const mine = conn.first.kind === 'answered' ? conn.first.by : '';
      const other = mine === 'ep-a' ? B : A;
      kl.setState(state([other]));
      const moved = await pollUntil(() => burst(CLIENT.v4, VIP4, 8), (out) => out.every((o) => o.kind === 'answered' && o.by !== mine));
      assert.ok(moved.ok, `new connections still reach ${mine}: ${moved.value.map(describeOutcome).join('; ')}`);
      const again = await conn.send();
      assert.ok(again.kind === 'answered' && again.by === mine, `the open connection keeps its endpoint: ${describeOutcome(again)}`);
    } finally {
      await conn.close();
      kl.setState(state([A, B]));
    }
    const back = await pollUntil(() => burst(CLIENT.v4, VIP4, 12), (out) => answeredBy(out).length === 2);
    assert.ok(back.ok);
  });

  it('a restart with connections open: programs stay attached while kpng is down, the new kpng adopts maps and links', async () => {
    const conn = await kl.lab.open({ from: CLIENT.v4, to: VIP4, port: 80 });
    try {
      assert.ok(isEndpoint(conn.first));
      await kl.kpng!.stop();
      // kpng is down: the pinned programs and maps keep translating
      const c0 = counters();
      const down = await burst(CLIENT.v4, VIP4, 6);
      assert.ok(down.every(isEndpoint), down.map(describeOutcome).join('; '));
      assert.ok(counters().translated - c0.translated >= 6);
      assert.equal((await conn.send()).kind, 'answered');
      const { k, loaded } = await restartEbpf(kl);
      assert.deepEqual(loaded, { adoptedMaps: 6, adoptedLinks: 8, attached: 0 });
      // the first sync read the maps back and found nothing to change
      await k.until('the first sync', () => /ebpf: synced/.test(k.stdout + k.stderr));
      assert.match((k.stdout + k.stderr).split('\n').find((l) => l.includes('ebpf: synced'))!, /full=true .*writes=0/, 'the restarted kpng wrote nothing');

      const again = await conn.send();
      assert.equal(again.kind, 'answered', describeOutcome(again));
      // and it follows changes again
      kl.setState(state([B]));
      const moved = await pollUntil(() => burst(CLIENT.v4, VIP4, 6), (out) => answeredBy(out).join() === `${B.v4}:8080`);
      assert.ok(moved.ok, moved.value.map(describeOutcome).join('; '));
    } finally {
      await conn.close();
      kl.setState(state([A, B]));
    }
  });

  it('drift: a link someone detached is attached again, a map someone unpinned made again and refilled', async () => {
    const link = objGet(join(backend.bpffs, 'link_kpng_connect4'));
    assert.ok(link);
    try {
      linkDetach(link.fd);
    } finally {
      link.close();
    }
    unlinkSync(join(backend.bpffs, 'kpng_services'));
    const c0 = counters();
    // repaired by the periodic check (syncPeriod 1s): new pod connections are translated again
    const back = await pollUntil(
      async () => {
        const out = await burst(CLIENT.v4, VIP4, 4);
        return { out, translated: counters().translated - c0.translated };
      },
      (r) => r.translated >= 4 && r.out.every(isEndpoint),
      20_000,
      250,
    );
    assert.ok(back.ok, `not repaired: ${JSON.stringify(back.value.translated)} ${back.value.out.map(describeOutcome).join('; ')}\n${kl.kpng!.stderr.slice(-2000)}`);
    assert.match(kl.kpng!.stdout + kl.kpng!.stderr, /changed by someone else/);
  });

  it('kpng cleanup detaches the programs and unpins the maps, nothing else', async () => {
    await kl.kpng!.stop();
    const stranger = join(backend.bpffs, 'not-kpngs');
    const { mkdirSync, existsSync, readdirSync } = await import('node:fs');
    mkdirSync(stranger);
    const k = kl.lab.startKpng(['cleanup'], { env: { KPNG_EBPF_BPFFS: backend.bpffs } });
    const code = await k.wait(60_000);
    assert.equal(code, 0, k.stderr);
    assert.deepEqual(readdirSync(backend.bpffs), ['not-kpngs'], 'only kpng\'s pins went');
    assert.ok(existsSync(stranger));
    const o = await from(CLIENT.v4, VIP4);
    // nothing translates any more: nftables is gone too, so the ClusterIP is routed to the world
    assert.ok(!isEndpoint(o) || o.kind !== 'answered', describeOutcome(o));
  });
});
