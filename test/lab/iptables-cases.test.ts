// The lab cases of the nftables backend (external traffic, hairpin, session
// affinity, stale UDP conntrack entries, IPv6 and dual-stack, rules updated
// under open connections, restart) through to-iptables, with iptables-nft
// and iptables-legacy; plus what only iptables mode has: localhost NodePorts,
// the canary (a flush behind kpng's back is repaired) and the mode kpng picks
// when not told. Outcomes differ from nftables only where upstream's do: a
// ClusterIP on an undefined port, or an unallocated one, is not touched ("").
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { Lab, POD_GATEWAY, describeOutcome, seenSource, verdict, type LabConnection, type Outcome } from '../../src/lab/index.js';
import { node, service, serviceCIDR, slice } from '../helpers/k8s.js';
import { KpngLab, answeredBy, kubeProxyConfig, list, pollUntil } from '../helpers/lab-kpng.js';
import { MODES, iptablesArgs, iptablesLabUnsupported } from '../helpers/iptables.js';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { IptablesMode } from '../../src/backends/iptables/iptables.js';

type Obj = Record<string, any>;
const NODE_IP = '192.168.0.2';
const NODE6 = '2001:db8::1';
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const config = (clusterCIDR = '10.244.0.0/16', extra: Obj = {}) => {
  const c = kubeProxyConfig({ mode: 'iptables', clusterCIDR });
  c.iptables = { ...c.iptables, ...extra };
  return c;
};

/** kpng --once with to-iptables in a lab; throws with kpng's stderr on failure */
async function applyOnce(lab: Lab, mode: IptablesMode, objects: Obj[], cfg: Obj): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'kpng-ipt-lab-'));
  try {
    writeFileSync(join(dir, 'state.json'), JSON.stringify(list(objects)));
    writeFileSync(join(dir, 'config.json'), JSON.stringify(cfg));
    const r = await lab.runKpng(iptablesArgs(join(dir, 'state.json'), lab.nodeName, join(dir, 'config.json'), mode, { once: true }));
    if (r.code !== 0) throw new Error(`kpng --once failed (${r.code}):\n${r.stderr.slice(-4000)}`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** kpng following a state directory with to-iptables; waits until a probe is answered */
async function startFollowing(kl: KpngLab, mode: IptablesMode, probe: () => Promise<Outcome>, extra: string[] = []): Promise<void> {
  kl.kpng = kl.lab.startKpng(iptablesArgs(kl.statePath, kl.lab.nodeName, kl.configPath, mode, { extra }));
  // answered by an endpoint, not by the world (a ClusterIP not yet programmed is routed there)
  const ready = await pollUntil(probe, (o) => o.kind === 'answered' && o.by !== 'world', 20_000);
  assert.ok(ready.ok, `kpng never programmed the Service: ${describeOutcome(ready.value)}\n${kl.kpng.stderr.slice(-3000)}`);
}

for (const mode of MODES) {
  const skip = await iptablesLabUnsupported(mode);
  const tag = (t: string) => `ipt${mode[0]}${t}`;

  describe(`to-iptables lab cases (iptables-${mode})`, { skip, concurrency: 2 }, () => {
    describe('NodePort and LoadBalancer from outside', { concurrency: 1 }, () => {
      const LB_LOCAL = '198.51.100.10';
      const LB_RANGES = '198.51.100.20';
      let lab: Lab;
      before(async () => {
        lab = await Lab.create({
          tag: tag('ext'),
          node: { name: 'node-a', interfaces: [{ name: 'eth0', addresses: [`${NODE_IP}/24`] }] },
          peers: [{ name: 'node-b', ips: ['192.168.50.3'] }],
          pods: [
            { name: 'web-a', ips: ['10.244.1.10'] },
            { name: 'web-b', ips: ['10.244.2.10'], node: 'node-b' },
            { name: 'client', ips: ['10.244.1.50'] },
          ],
        });
        await Promise.all([lab.serve('web-a', { tcp: [8080] }), lab.serve('web-b', { tcp: [8080] }), lab.serve('world', { tcp: [80] })]);
        await applyOnce(
          lab,
          mode,
          [
            node('node-a', undefined, [NODE_IP]),
            node('node-b', undefined, ['192.168.50.3']),
            serviceCIDR('kubernetes', ['10.96.0.0/16']),
            service('demo', 'np', { type: 'NodePort', clusterIP: '10.96.0.11', ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080, nodePort: 30080 }] }),
            slice('demo', 'np-1', 'np', [{ ip: '10.244.1.10', node: 'node-a' }, { ip: '10.244.2.10', node: 'node-b' }]),
            service(
              'demo',
              'lb',
              { type: 'LoadBalancer', clusterIP: '10.96.0.12', externalTrafficPolicy: 'Local', healthCheckNodePort: 32000, ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080, nodePort: 30081 }] },
              { status: { loadBalancer: { ingress: [{ ip: LB_LOCAL, ipMode: 'VIP' }] } } },
            ),
            slice('demo', 'lb-1', 'lb', [{ ip: '10.244.1.10', node: 'node-a' }, { ip: '10.244.2.10', node: 'node-b' }]),
            service(
              'demo',
              'fw',
              { type: 'LoadBalancer', clusterIP: '10.96.0.13', loadBalancerSourceRanges: ['203.0.113.0/25'], ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080, nodePort: 30082 }] },
              { status: { loadBalancer: { ingress: [{ ip: LB_RANGES }] } } },
            ),
            slice('demo', 'fw-1', 'fw', [{ ip: '10.244.1.10', node: 'node-a' }]),
            // eTP=Local with its only endpoint elsewhere, and a Service without endpoints
            service('demo', 'far', { type: 'NodePort', clusterIP: '10.96.0.14', externalTrafficPolicy: 'Local', externalIPs: ['198.51.100.30'], ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080, nodePort: 30083 }] }),
            slice('demo', 'far-1', 'far', [{ ip: '10.244.2.10', node: 'node-b' }]),
            service('demo', 'none', { type: 'NodePort', clusterIP: '10.96.0.15', ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080, nodePort: 30084 }] }),
          ],
          config(),
        );
      });
      after(() => lab?.close());

      it("NodePort (eTP=Cluster) from an external client: both nodes' endpoints, masqueraded", async () => {
        const out = await lab.burst({ from: '203.0.113.2', to: NODE_IP, port: 30080, count: 24 });
        assert.deepEqual(answeredBy(out), ['10.244.1.10:8080', '10.244.2.10:8080'], out.map(describeOutcome).join('\n'));
        for (const o of out) assert.equal(seenSource(o), POD_GATEWAY[4], describeOutcome(o));
      });

      it('LoadBalancer IP and NodePort of the eTP=Local Service from outside: only the local endpoint, client address kept', async () => {
        for (const [to, port] of [[LB_LOCAL, 80], [NODE_IP, 30081]] as const) {
          const out = await lab.burst({ from: '203.0.113.2', to, port, count: 16 });
          assert.deepEqual(answeredBy(out), ['10.244.1.10:8080'], `${to}:${port}`);
          for (const o of out) assert.equal(seenSource(o), '203.0.113.2');
        }
      });

      it('a pod reaching the eTP=Local LoadBalancer IP gets every endpoint, unmasqueraded', async () => {
        const out = await lab.burst({ from: '10.244.1.50', to: LB_LOCAL, port: 80, count: 24 });
        assert.deepEqual(answeredBy(out), ['10.244.1.10:8080', '10.244.2.10:8080']);
        for (const o of out) assert.equal(seenSource(o), '10.244.1.50');
      });

      it('loadBalancerSourceRanges: an allowed client is answered, another is dropped, the NodePort is not filtered', async () => {
        const [ok, blocked, nodePort] = await Promise.all([
          lab.connect({ from: '203.0.113.2', to: LB_RANGES, port: 80 }),
          lab.connect({ from: '203.0.113.200', to: LB_RANGES, port: 80 }),
          lab.connect({ from: '203.0.113.200', to: NODE_IP, port: 30082 }),
        ]);
        assert.equal(verdict(ok, LB_RANGES, 80), '10.244.1.10:8080', describeOutcome(ok));
        assert.equal(verdict(blocked, LB_RANGES, 80), 'DROP', describeOutcome(blocked));
        assert.equal(verdict(nodePort, NODE_IP, 30082), '10.244.1.10:8080', describeOutcome(nodePort));
      });

      it('eTP=Local without a local endpoint: outside traffic dropped, pods still served; no endpoints at all: rejected', async () => {
        const [extIP, np, pod, none, noneNP] = await Promise.all([
          lab.connect({ from: '203.0.113.2', to: '198.51.100.30', port: 80, timeoutMs: 800 }),
          lab.connect({ from: '203.0.113.2', to: NODE_IP, port: 30083, timeoutMs: 800 }),
          lab.connect({ from: '10.244.1.50', to: '198.51.100.30', port: 80 }),
          lab.connect({ from: '10.244.1.50', to: '10.96.0.15', port: 80 }),
          lab.connect({ from: '203.0.113.2', to: NODE_IP, port: 30084 }),
        ]);
        assert.equal(verdict(extIP, '198.51.100.30', 80), 'DROP', describeOutcome(extIP));
        assert.equal(verdict(np, NODE_IP, 30083), 'DROP', describeOutcome(np));
        assert.equal(verdict(pod, '198.51.100.30', 80), '10.244.2.10:8080', describeOutcome(pod));
        assert.equal(verdict(none, '10.96.0.15', 80), 'REJECT', describeOutcome(none));
        assert.equal(verdict(noneNP, NODE_IP, 30084), 'REJECT', describeOutcome(noneNP));
      });
    });

    describe('healthCheckNodePort of an eTP=Local LoadBalancer', { concurrency: 1 }, () => {
      let kl: KpngLab;
      before(async () => {
        kl = await KpngLab.create(
          { tag: tag('hc'), node: { name: 'node-a', interfaces: [{ name: 'eth0', addresses: [`${NODE_IP}/24`] }] }, pods: [{ name: 'web-a', ips: ['10.244.1.10'] }] },
          [
            node('node-a', undefined, [NODE_IP]),
            service(
              'demo',
              'lb',
              { type: 'LoadBalancer', clusterIP: '10.96.0.12', externalTrafficPolicy: 'Local', healthCheckNodePort: 32000, ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080, nodePort: 30081 }] },
              { status: { loadBalancer: { ingress: [{ ip: '198.51.100.10' }] } } },
            ),
            slice('demo', 'lb-1', 'lb', [{ ip: '10.244.1.10', node: 'node-a' }]),
          ],
          config(),
        );
        await kl.lab.serve('web-a', { tcp: [8080] });
        await startFollowing(kl, mode, () => kl.lab.connect({ from: '203.0.113.2', to: '198.51.100.10', port: 80 }));
      });
      after(() => kl?.close());

      it('the health check server answers through KUBE-NODEPORTS: 200 with one local endpoint', async () => {
        // from an external client's address (the world has no address of its own to pick)
        const get = `require('node:http').get({ host: '${NODE_IP}', port: 32000, path: '/', localAddress: '203.0.113.2' }, (r) => { let b = ''; r.on('data', (d) => (b += d)); r.on('end', () => console.log(r.statusCode, b)); })`;
        const r = await kl.lab.exec('world', [process.execPath, '-e', get], { timeoutMs: 10_000 });
        assert.match(r.stdout, /^200 \{"service":\{"namespace":"demo","name":"lb"\},"localEndpoints":1,"serviceProxyHealthy":true\}/, r.stderr);
        const rules = await kl.lab.exec('node-a', [`iptables-${mode}-save`, '-t', 'filter']);
        assert.match(rules.stdout, /^-A KUBE-NODEPORTS -p tcp -m comment --comment "demo\/lb:http health check node port" -m tcp --dport 32000 -j ACCEPT$/m);
      });
    });

    describe('hairpin, IPv6 and dual-stack', { concurrency: 1 }, () => {
      let lab: Lab;
      before(async () => {
        lab = await Lab.create({
          tag: tag('hp6'),
          node: { name: 'node-a', interfaces: [{ name: 'eth0', addresses: [`${NODE_IP}/24`, `${NODE6}/64`] }] },
          pods: [
            { name: 'solo', ips: ['10.244.1.5', 'fd00:10::5'] },
            { name: 'web-1', ips: ['10.244.1.10', 'fd00:10::10'] },
            { name: 'web-2', ips: ['10.244.1.11', 'fd00:10::11'] },
            { name: 'client', ips: ['10.244.1.50', 'fd00:10::50'] },
          ],
        });
        await Promise.all([...['solo', 'web-1', 'web-2'].map((p) => lab.serve(p, { tcp: [8080], udp: [5353] })), lab.serve('world', { tcp: [80, 443] })]);
        await applyOnce(
          lab,
          mode,
          [
            node('node-a', undefined, [NODE_IP, NODE6]),
            serviceCIDR('kubernetes', ['10.96.0.0/16', 'fd00:96::/112']),
            service('demo', 'solo', { clusterIP: '10.96.0.5', ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }, { name: 'dns', port: 53, protocol: 'UDP', targetPort: 5353 }] }),
            slice('demo', 'solo-1', 'solo', [{ ip: '10.244.1.5', node: 'node-a' }], [{ name: 'http', port: 8080 }, { name: 'dns', port: 5353, protocol: 'UDP' }]),
            service('demo', 'solo6', { clusterIP: 'fd00:96::5', ipFamilies: ['IPv6'], ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }] }),
            slice('demo', 'solo6-1', 'solo6', [{ ip: 'fd00:10::5', node: 'node-a' }]),
            service('demo', 'web', { clusterIP: '10.96.0.10', ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }] }),
            slice('demo', 'web-1', 'web', [{ ip: '10.244.1.10', node: 'node-a' }, { ip: '10.244.1.11', node: 'node-a' }]),
            service('demo', 'web6', {
              type: 'NodePort',
              clusterIP: 'fd00:96::10',
              ipFamilies: ['IPv6'],
              ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080, nodePort: 30080 }, { name: 'dns', port: 53, protocol: 'UDP', targetPort: 5353, nodePort: 30053 }],
            }),
            slice('demo', 'web6-1', 'web6', [{ ip: 'fd00:10::10', node: 'node-a' }, { ip: 'fd00:10::11', node: 'node-a' }], [{ name: 'http', port: 8080 }, { name: 'dns', port: 5353, protocol: 'UDP' }]),
            service('demo', 'dual', { clusterIP: '10.96.0.20', clusterIPs: ['10.96.0.20', 'fd00:96::20'], ipFamilies: ['IPv4', 'IPv6'], ipFamilyPolicy: 'RequireDualStack', ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }] }),
            slice('demo', 'dual-v4', 'dual', [{ ip: '10.244.1.10', node: 'node-a' }]),
            slice('demo', 'dual-v6', 'dual', [{ ip: 'fd00:10::11', node: 'node-a' }]),
          ],
          config('10.244.0.0/16,fd00:10::/64'),
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
        for (const o of out) assert.equal(seenSource(o), verdict(o, '10.96.0.10', 80) === '10.244.1.10:8080' ? POD_GATEWAY[4] : '10.244.1.10', describeOutcome(o));
      });

      it('a pod reaches an IPv6 ClusterIP: both endpoints, unmasqueraded (TCP and UDP)', async () => {
        for (const [port, protocol, target] of [[80, 'TCP', 8080], [53, 'UDP', 5353]] as const) {
          const out = await lab.burst({ from: 'fd00:10::50', to: 'fd00:96::10', port, protocol, count: 20 });
          assert.deepEqual(answeredBy(out), [`[fd00:10::10]:${target}`, `[fd00:10::11]:${target}`], out.map(describeOutcome).join('\n'));
          for (const o of out) assert.equal(seenSource(o), 'fd00:10::50');
        }
      });

      it("an external IPv6 client reaches the NodePort on the node's IPv6 address, masqueraded", async () => {
        const out = await lab.burst({ from: '2600:5200::1', to: NODE6, port: 30080, count: 20 });
        assert.deepEqual(answeredBy(out), ['[fd00:10::10]:8080', '[fd00:10::11]:8080'], out.map(describeOutcome).join('\n'));
        for (const o of out) assert.equal(seenSource(o), POD_GATEWAY[6]);
        const udp = await lab.connect({ from: '2600:5200::1', to: NODE6, port: 30053, protocol: 'UDP' });
        assert.match(verdict(udp, NODE6, 30053), /^\[fd00:10::1[01]\]:5353$/, describeOutcome(udp));
      });

      it('iptables mode leaves a ClusterIP on an undefined port, and an unallocated one, alone ("")', async () => {
        const [port, unallocated] = await Promise.all([lab.connect({ from: '10.244.1.50', to: '10.96.0.10', port: 443 }), lab.connect({ from: 'fd00:10::50', to: 'fd00:96::99', port: 80 })]);
        assert.equal(verdict(port, '10.96.0.10', 443), '', describeOutcome(port));
        assert.equal(verdict(unallocated, 'fd00:96::99', 80), '', describeOutcome(unallocated));
      });

      it("a dual-stack Service answers on both ClusterIPs, each from its family's endpoints", async () => {
        const v4 = await lab.connect({ from: '10.244.1.50', to: '10.96.0.20', port: 80 });
        const v6 = await lab.connect({ from: 'fd00:10::50', to: 'fd00:96::20', port: 80 });
        assert.equal(verdict(v4, '10.96.0.20', 80), '10.244.1.10:8080', describeOutcome(v4));
        assert.equal(verdict(v6, 'fd00:96::20', 80), '[fd00:10::11]:8080', describeOutcome(v6));
      });
    });

    describe('localhost NodePorts (route_localnet, IPv4)', { concurrency: 1 }, () => {
      let lab: Lab;
      const objects = [
        node('node-a', undefined, [NODE_IP]),
        service('demo', 'np', { type: 'NodePort', clusterIP: '10.96.0.11', ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080, nodePort: 30080 }] }),
        slice('demo', 'np-1', 'np', [{ ip: '10.244.1.10', node: 'node-a' }]),
      ];
      before(async () => {
        lab = await Lab.create({ tag: tag('lhnp'), node: { name: 'node-a', interfaces: [{ name: 'lo', addresses: ['127.0.0.1/8', '::1/128'] }, { name: 'eth0', addresses: [`${NODE_IP}/24`] }] }, pods: [{ name: 'web-a', ips: ['10.244.1.10'] }] });
        await Promise.all([lab.serve('web-a', { tcp: [8080] }), lab.serve('node-a', { tcp: [30080] })]);
      });
      after(() => lab?.close());

      it('127.0.0.1:<nodePort> from the node reaches the endpoint, masqueraded; not with localhostNodePorts false', async () => {
        await applyOnce(lab, mode, objects, config());
        const o = await lab.connect({ from: '127.0.0.1', to: '127.0.0.1', port: 30080 });
        assert.equal(verdict(o, '127.0.0.1', 30080), '10.244.1.10:8080', describeOutcome(o));
        assert.equal(seenSource(o), POD_GATEWAY[4]);
        assert.equal((await lab.exec('node-a', ['sysctl', '-n', 'net.ipv4.conf.all.route_localnet'])).stdout.trim(), '1');
        await applyOnce(lab, mode, objects, config(undefined, { localhostNodePorts: false }));
        const off = await lab.connect({ from: '127.0.0.1', to: '127.0.0.1', port: 30080 });
        assert.equal(verdict(off, '127.0.0.1', 30080), '', describeOutcome(off));
        const node = await lab.connect({ from: NODE_IP, to: NODE_IP, port: 30080 });
        assert.equal(verdict(node, NODE_IP, 30080), '10.244.1.10:8080', describeOutcome(node));
      });
    });

    describe('session affinity (ClientIP, -m recent)', { concurrency: 1 }, () => {
      const VIP = '10.96.0.10';
      const TIMEOUT_S = 2;
      const CLIENTS = Array.from({ length: 16 }, (_, i) => `203.0.113.${i + 1}`);
      const first = new Map<string, string>();
      const endpointOf = (o: Outcome) => verdict(o, VIP, 80);
      let kl: KpngLab;
      before(async () => {
        kl = await KpngLab.create(
          { tag: tag('aff'), node: { name: 'node-a', interfaces: [{ name: 'eth0', addresses: [`${NODE_IP}/24`] }] }, pods: [{ name: 'web-1', ips: ['10.244.1.10'] }, { name: 'web-2', ips: ['10.244.1.11'] }, { name: 'client', ips: ['10.244.1.50'] }] },
          [
            node('node-a', undefined, [NODE_IP]),
            service('demo', 'web', { clusterIP: VIP, sessionAffinity: 'ClientIP', sessionAffinityConfig: { clientIP: { timeoutSeconds: TIMEOUT_S } }, ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }] }),
            slice('demo', 'web-1', 'web', [{ ip: '10.244.1.10', node: 'node-a' }, { ip: '10.244.1.11', node: 'node-a' }]),
          ],
          config(),
        );
        await Promise.all(['web-1', 'web-2'].map((p) => kl.lab.serve(p, { tcp: [8080] })));
        await startFollowing(kl, mode, () => kl.lab.connect({ from: '10.244.1.99', via: 'world', to: VIP, port: 80 }));
      });
      after(() => kl?.close());

      it('the same client sticks to one endpoint; different clients spread, each sticking to its own', async () => {
        const out: Outcome[] = [];
        for (let i = 0; i < 12; i++) out.push(await kl.lab.connect({ from: '10.244.1.50', to: VIP, port: 80 }));
        assert.equal(new Set(out.map(endpointOf)).size, 1, `one client reached ${[...new Set(out.map(endpointOf))].join(', ')}`);
        for (const c of CLIENTS) first.set(c, endpointOf(await kl.lab.connect({ from: c, to: VIP, port: 80 })));
        const again = await Promise.all(CLIENTS.map((c) => kl.lab.burst({ from: c, to: VIP, port: 80, count: 4 })));
        CLIENTS.forEach((c, i) => assert.deepEqual([...new Set(again[i].map(endpointOf))], [first.get(c)], `client ${c} moved`));
        assert.deepEqual([...new Set(first.values())].sort(), ['10.244.1.10:8080', '10.244.1.11:8080']);
      });

      it(`after ${TIMEOUT_S}s without connections, a client may be placed elsewhere`, async () => {
        await sleep(TIMEOUT_S * 1000 + 1200);
        const now = await Promise.all(CLIENTS.map((c) => kl.lab.connect({ from: c, to: VIP, port: 80 })));
        for (const o of now) assert.match(endpointOf(o), /^10\.244\.1\.1[01]:8080$/, describeOutcome(o));
        assert.ok(CLIENTS.some((c, i) => endpointOf(now[i]) !== first.get(c)), 'no client changed endpoint after the affinity timeout');
      });
    });

    describe('stale UDP conntrack entries', { concurrency: 1 }, () => {
      const VIP = '10.96.0.53';
      const [A, B] = ['10.244.1.10', '10.244.1.11'];
      const state = (ips: string[]) => [
        node('node-a', undefined, [NODE_IP]),
        service('demo', 'dns', { type: 'NodePort', clusterIP: VIP, ports: [{ name: 'dns', port: 53, protocol: 'UDP', targetPort: 5353, nodePort: 30053 }] }),
        slice('demo', 'dns-1', 'dns', ips.map((ip) => ({ ip, node: 'node-a' })), [{ name: 'dns', port: 5353, protocol: 'UDP' }]),
      ];
      let kl: KpngLab;
      before(async () => {
        kl = await KpngLab.create(
          { tag: tag('ct'), node: { name: 'node-a', interfaces: [{ name: 'eth0', addresses: [`${NODE_IP}/24`] }] }, pods: [{ name: 'dns-a', ips: [A] }, { name: 'dns-b', ips: [B] }, { name: 'client', ips: ['10.244.1.50'] }] },
          state([A, B]),
          config(),
        );
        await Promise.all(['dns-a', 'dns-b'].map((p) => kl.lab.serve(p, { udp: [5353] })));
        await startFollowing(kl, mode, () => kl.lab.connect({ from: '10.244.1.50', to: VIP, port: 53, protocol: 'UDP' }));
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
            assert.equal(verdict(await sock.send(), dst, port), first);
            const remaining = first.startsWith(A) ? B : A;
            kl.setState(state([remaining]));
            const r = await pollUntil(() => sock.send(500), (o) => verdict(o, dst, port) === `${remaining}:5353`, 15_000, 200);
            assert.equal(verdict(r.value, dst, port), `${remaining}:5353`, `the socket still reaches the removed endpoint ${r.ms} ms later: ${describeOutcome(r.value)}`);
          } finally {
            await sock.close();
          }
        });
      }
    });

    describe('rules updated while connections stay open; a flush behind kpng\'s back', { concurrency: 1 }, () => {
      const VIP = '10.96.0.10';
      const [A, B, C] = ['10.244.1.10', '10.244.1.11', '10.244.1.12'];
      const base = [node('node-a', undefined, [NODE_IP])];
      const web = (ports = [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }]) => service('demo', 'web', { clusterIP: VIP, ports });
      const eps = (ips: string[], ports = [{ name: 'http', port: 8080 }]) => slice('demo', 'web-1', 'web', ips.map((ip) => ({ ip, node: 'node-a' })), ports);
      const burst = (port = 80) => kl.lab.burst({ from: '10.244.1.50', to: VIP, port, count: 16 });
      let kl: KpngLab;
      let conn: LabConnection;
      let held = '';
      const stillOpen = async () => {
        const o = await conn.send();
        assert.equal(verdict(o, VIP, 80), held, `the open connection: ${describeOutcome(o)}`);
      };
      before(async () => {
        kl = await KpngLab.create(
          { tag: tag('live'), node: { name: 'node-a', interfaces: [{ name: 'eth0', addresses: [`${NODE_IP}/24`] }] }, pods: [{ name: 'web-a', ips: [A] }, { name: 'web-b', ips: [B] }, { name: 'web-c', ips: [C] }, { name: 'client', ips: ['10.244.1.50'] }] },
          [...base, web(), eps([A, B])],
          config('10.244.0.0/16', { syncPeriod: '1s', minSyncPeriod: '100ms' }),
        );
        await Promise.all([...['web-a', 'web-b', 'web-c'].map((p) => kl.lab.serve(p, { tcp: [8080, 8443] })), kl.lab.serve('world', { tcp: [80] })]);
        await startFollowing(kl, mode, () => kl.lab.connect({ from: '10.244.1.50', to: VIP, port: 80 }));
        conn = await kl.lab.open({ from: '10.244.1.50', to: VIP, port: 80 });
        assert.equal(conn.first.kind, 'answered', describeOutcome(conn.first));
        held = verdict(conn.first, VIP, 80);
      });
      after(() => kl?.close());

      it('the held endpoint leaves, another joins: new connections move, the open one stays', async () => {
        const stay = held.startsWith(A) ? B : A;
        kl.setState([...base, web(), eps([stay, C])]);
        const want = [`${stay}:8080`, `${C}:8080`].sort();
        const r = await pollUntil(burst, (out) => answeredBy(out).join() === want.join(), 15_000, 200);
        assert.deepEqual(answeredBy(r.value), want, `new connections after the change (waited ${r.ms} ms)\n${kl.kpng?.stderr.slice(-3000)}`);
        await stillOpen();
      });

      it('the Service gains a port: new connections reach it, and the open connection stays', async () => {
        kl.setState([...base, web([{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }, { name: 'https', port: 443, protocol: 'TCP', targetPort: 8443 }]), eps([A, C], [{ name: 'http', port: 8080 }, { name: 'https', port: 8443 }])]);
        const r = await pollUntil(() => burst(443), (out) => out.every((o) => o.kind === 'answered'), 15_000, 200);
        assert.deepEqual(answeredBy(r.value), [`${A}:8443`, `${C}:8443`], `${r.value.map(describeOutcome).join('\n')}\n${kl.kpng?.stderr.slice(-3000)}`);
        await stillOpen();
      });

      it('iptables flushed behind kpng\'s back (canary gone): kpng reprograms everything within syncPeriod', async () => {
        const flush = [mode === 'nft' ? 'iptables-nft' : 'iptables-legacy'];
        for (const t of ['nat', 'filter', 'mangle']) {
          await kl.lab.exec('node-a', [...flush, '-w', '5', '-t', t, '-F']);
          await kl.lab.exec('node-a', [...flush, '-w', '5', '-t', t, '-X']);
        }
        const gone = await kl.lab.connect({ from: '10.244.1.50', to: VIP, port: 80 });
        assert.equal(verdict(gone, VIP, 80), '', `right after the flush: ${describeOutcome(gone)}`);
        const r = await pollUntil(burst, (out) => out.every((o) => /^10\.244\.1\.1[02]:8080$/.test(verdict(o, VIP, 80))), 15_000, 200);
        assert.ok(r.ok, `not reprogrammed ${r.ms} ms after the flush\n${kl.kpng?.stderr.slice(-3000)}`);
        assert.match(kl.kpng!.stderr, /canary chain is gone/);
      });

      it('the Service is deleted: new connections are left alone (not DNATed), the open one stays', async () => {
        kl.setState([...base]);
        const r = await pollUntil(() => kl.lab.connect({ from: '10.244.1.50', to: VIP, port: 80, timeoutMs: 700 }), (o) => verdict(o, VIP, 80) === '', 15_000, 200);
        assert.equal(verdict(r.value, VIP, 80), '', describeOutcome(r.value));
        await stillOpen();
        await conn.close();
        const failed = (kl.kpng?.stderr ?? '').split('\n').filter((l) => /sync failed|ERROR/.test(l));
        assert.deepEqual(failed, []);
      });
    });

    describe('restart with connections open', { concurrency: 1 }, () => {
      const VIP = '10.96.0.10';
      const [A, B, C] = ['10.244.1.10', '10.244.1.11', '10.244.1.12'];
      const ports = [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }, { name: 'dns', port: 53, protocol: 'UDP', targetPort: 5353 }];
      const state = (ips: string[]) => [
        node('node-a', undefined, [NODE_IP]),
        service('demo', 'web', { type: 'NodePort', clusterIP: VIP, ports: ports.map((p, i) => ({ ...p, nodePort: 30080 + i })) }),
        slice('demo', 'web-1', 'web', ips.map((ip) => ({ ip, node: 'node-a' })), [{ name: 'http', port: 8080 }, { name: 'dns', port: 5353, protocol: 'UDP' }]),
      ];
      let kl: KpngLab;
      before(async () => {
        kl = await KpngLab.create(
          { tag: tag('rst'), node: { name: 'node-a', interfaces: [{ name: 'eth0', addresses: [`${NODE_IP}/24`] }] }, pods: [{ name: 'web-a', ips: [A] }, { name: 'web-b', ips: [B] }, { name: 'web-c', ips: [C] }, { name: 'client', ips: ['10.244.1.50'] }] },
          state([A, B]),
          config(),
        );
        await Promise.all(['web-a', 'web-b', 'web-c'].map((p) => kl.lab.serve(p, { tcp: [8080], udp: [5353] })));
        await startFollowing(kl, mode, () => kl.lab.connect({ from: '10.244.1.50', to: VIP, port: 80 }));
      });
      after(() => kl?.close());

      it('SIGTERM, start again: open connections survive, no new connection fails meanwhile, nothing rewritten', async () => {
        const lab = kl.lab;
        const open: { c: LabConnection; dst: string; port: number }[] = [];
        for (const [dst, port, protocol] of [[VIP, 80, 'TCP'], [VIP, 53, 'UDP'], [NODE_IP, 30080, 'TCP']] as const) {
          const c = await lab.open({ from: protocol === 'UDP' || dst === VIP ? '10.244.1.50' : '203.0.113.7', to: dst, port, protocol });
          assert.equal(c.first.kind, 'answered', describeOutcome(c.first));
          open.push({ c, dst, port });
        }
        let stop = false;
        const probes: { o: Outcome; dst: string; port: number }[] = [];
        const prober = (async () => {
          for (let i = 0; i < 3000 && !stop; i++) {
            const [a, b] = await Promise.all([
              lab.connect({ from: '10.244.1.50', to: VIP, port: 80, timeoutMs: 1000 }),
              lab.connect({ from: '203.0.113.8', to: NODE_IP, port: 30080, timeoutMs: 1000 }),
            ]);
            probes.push({ o: a, dst: VIP, port: 80 }, { o: b, dst: NODE_IP, port: 30080 });
            await sleep(20);
          }
        })();
        try {
          await sleep(300);
          const code = await kl.kpng!.stop('SIGTERM', 10_000);
          assert.equal(code, 0, `kpng exit on SIGTERM\n${kl.kpng!.stderr.slice(-3000)}`);
          const saved = await lab.exec(lab.nodeName, [`iptables-${mode}-save`, '-t', 'nat']);
          assert.match(saved.stdout, /^-A KUBE-SERVICES .*-j KUBE-SVC-/m, 'the rules stay while kpng is down');
          await sleep(500);
          kl.kpng = lab.startKpng(['--log-level', 'debug', ...iptablesArgs(kl.statePath, lab.nodeName, kl.configPath, mode)]);
          await kl.kpng.until(() => /iptables: synced/.test(kl.kpng!.stderr), 'the first sync after the restart');
          assert.match(kl.kpng.stderr, /iptables: synced .*full=true .*chainsWritten=0 chainsDeleted=0/, 'the restarted kpng rewrote no chain');
          kl.setState(state([A, B, C]));
          const r = await pollUntil(() => lab.burst({ from: '10.244.1.50', to: VIP, port: 80, count: 16 }), (out) => answeredBy(out).includes(`${C}:8080`), 20_000, 200);
          assert.ok(r.ok, `the restarted kpng never added ${C}\n${kl.kpng.stderr.slice(-3000)}`);
          await sleep(300);
        } finally {
          stop = true;
          await prober;
        }
        const bad = probes.filter(({ o, dst, port }) => !/^10\.244\.1\.1[0-2]:8080$/.test(verdict(o, dst, port)));
        assert.ok(probes.length > 20, `only ${probes.length} probes`);
        assert.deepEqual(bad.map(({ o, dst, port }) => `${dst}:${port} ${describeOutcome(o)}`), [], `${bad.length} of ${probes.length} new connections failed`);
        for (const { c, dst, port } of open) {
          const o = await c.send();
          assert.equal(verdict(o, dst, port), verdict(c.first, dst, port), `open connection to ${dst}:${port}: ${describeOutcome(o)}`);
          await c.close();
        }
      });
    });
  });
}

describe('to-iptables picks the iptables the node uses', { skip: await iptablesLabUnsupported('legacy') }, () => {
  let lab: Lab;
  before(async () => {
    lab = await Lab.create({ tag: 'iptdetect', node: { name: 'node-a', interfaces: [{ name: 'eth0', addresses: [`${NODE_IP}/24`] }] }, pods: [{ name: 'web-a', ips: ['10.244.1.10'] }] });
    await lab.serve('web-a', { tcp: [8080] });
  });
  after(() => lab?.close());

  it('rules in iptables-legacy (a kubelet canary): kpng uses legacy and leaves iptables-nft empty', async () => {
    const r0 = await lab.exec('node-a', ['iptables-legacy-restore', '--noflush'], { input: '*mangle\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n' });
    assert.equal(r0.code, 0, r0.stderr);
    const dir = mkdtempSync(join(tmpdir(), 'kpng-ipt-lab-'));
    try {
      writeFileSync(join(dir, 'state.json'), JSON.stringify(list([node('node-a', undefined, [NODE_IP]), service('demo', 'web', { clusterIP: '10.96.0.10', ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }] }), slice('demo', 'web-1', 'web', [{ ip: '10.244.1.10', node: 'node-a' }])])));
      writeFileSync(join(dir, 'config.json'), JSON.stringify(config()));
      const args = iptablesArgs(join(dir, 'state.json'), 'node-a', join(dir, 'config.json'), 'nft', { once: true });
      const r = await lab.runKpng(args.filter((a, i) => a !== '--iptables-mode' && args[i - 1] !== '--iptables-mode'));
      assert.equal(r.code, 0, r.stderr.slice(-3000));
      assert.match(r.stderr, /using iptables-legacy/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
    const o = await lab.connect({ from: '10.244.1.99', via: 'world', to: '10.96.0.10', port: 80 });
    assert.equal(verdict(o, '10.96.0.10', 80), '10.244.1.10:8080', describeOutcome(o));
    assert.doesNotMatch((await lab.exec('node-a', ['iptables-nft-save'])).stdout, /KUBE-/);
  });
});
