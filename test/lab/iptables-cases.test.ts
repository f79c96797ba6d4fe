// What only the iptables backend has, in the lab with iptables-nft and
// iptables-legacy: the health check server reached through KUBE-NODEPORTS'
// ACCEPT rule, localhost NodePorts (route_localnet), the canary (a flush
// behind kpng's back is repaired) and the iptables kpng picks when not told.
// The cases every backend shares (external traffic, hairpin, IPv6, conntrack,
// affinity, live updates, restart) are in their own files, run for each.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Lab, POD_GATEWAY, describeOutcome, seenSource, verdict, type LabConnection } from '../../src/lab/index.js';
import { node, service, slice } from '../helpers/k8s.js';
import { BACKENDS, KpngLab, applyOnce, backendConfig, backendLabUnsupported, backendTag, describeBackends, kpngArgs, list, pollUntil, type LabBackend } from '../helpers/lab-kpng.js';

const NODE_IP = '192.168.0.2';
type IptablesBackend = Extract<LabBackend, { name: 'iptables' }>;
const IPTABLES = BACKENDS.filter((b): b is IptablesBackend => b.name === 'iptables');

await describeBackends(
  'healthCheckNodePort of an eTP=Local LoadBalancer',
  (b) => {
    let kl: KpngLab;
    before(async () => {
      kl = await KpngLab.create(
        b,
        { tag: `hc${backendTag(b)}`, node: { name: 'node-a', interfaces: [{ name: 'eth0', addresses: [`${NODE_IP}/24`] }] }, pods: [{ name: 'web-a', ips: ['10.244.1.10'] }] },
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
        backendConfig(b, { clusterCIDR: '10.244.0.0/16' }),
      );
      await kl.lab.serve('web-a', { tcp: [8080] });
      await kl.startAndWait(() => kl.lab.connect({ from: '203.0.113.2', to: '198.51.100.10', port: 80 }));
    });
    after(() => kl?.close());

    it('the health check server answers through KUBE-NODEPORTS: 200 with one local endpoint', async () => {
      // from an external client's address (the world has no address of its own to pick)
      const get = `require('node:http').get({ host: '${NODE_IP}', port: 32000, path: '/', localAddress: '203.0.113.2' }, (r) => { let b = ''; r.on('data', (d) => (b += d)); r.on('end', () => console.log(r.statusCode, b)); })`;
      // the LB's traffic passing says the rules are in; the sync that put them there may still be starting its servers (a few ms)
      let r = await kl.lab.exec('world', [process.execPath, '-e', get], { timeoutMs: 10_000 });
      for (let i = 0; i < 10 && r.stderr.includes('ECONNREFUSED'); i++) {
        await new Promise((ok) => setTimeout(ok, 200));
        r = await kl.lab.exec('world', [process.execPath, '-e', get], { timeoutMs: 10_000 });
      }
      assert.match(r.stdout, /^200 \{"service":\{"namespace":"demo","name":"lb"\},"localEndpoints":1,"serviceProxyHealthy":true\}/, r.stderr);
      const rules = await kl.lab.exec('node-a', [`iptables-${b.mode}-save`, '-t', 'filter']);
      assert.match(rules.stdout, /^-A KUBE-NODEPORTS -p tcp -m comment --comment "demo\/lb:http health check node port" -m tcp --dport 32000 -j ACCEPT$/m);
    });
  },
  IPTABLES,
);

await describeBackends(
  'localhost NodePorts (route_localnet, IPv4)',
  (b) => {
    let lab: Lab;
    const objects = [
      node('node-a', undefined, [NODE_IP]),
      service('demo', 'np', { type: 'NodePort', clusterIP: '10.96.0.11', ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080, nodePort: 30080 }] }),
      slice('demo', 'np-1', 'np', [{ ip: '10.244.1.10', node: 'node-a' }]),
    ];
    before(async () => {
      lab = await Lab.create({ tag: `lhnp${backendTag(b)}`, node: { name: 'node-a', interfaces: [{ name: 'lo', addresses: ['127.0.0.1/8', '::1/128'] }, { name: 'eth0', addresses: [`${NODE_IP}/24`] }] }, pods: [{ name: 'web-a', ips: ['10.244.1.10'] }] });
      await Promise.all([lab.serve('web-a', { tcp: [8080] }), lab.serve('node-a', { tcp: [30080] })]);
    });
    after(() => lab?.close());

    it('127.0.0.1:<nodePort> from the node reaches the endpoint, masqueraded; not with localhostNodePorts false', async () => {
      await applyOnce(b, lab, objects, backendConfig(b, { clusterCIDR: '10.244.0.0/16' }));
      const o = await lab.connect({ from: '127.0.0.1', to: '127.0.0.1', port: 30080 });
      assert.equal(verdict(o, '127.0.0.1', 30080), '10.244.1.10:8080', describeOutcome(o));
      assert.equal(seenSource(o), POD_GATEWAY[4]);
      assert.equal((await lab.exec('node-a', ['sysctl', '-n', 'net.ipv4.conf.all.route_localnet'])).stdout.trim(), '1');
      await applyOnce(b, lab, objects, backendConfig(b, { clusterCIDR: '10.244.0.0/16', localhostNodePorts: false }));
      const off = await lab.connect({ from: '127.0.0.1', to: '127.0.0.1', port: 30080 });
      assert.equal(verdict(off, '127.0.0.1', 30080), '', describeOutcome(off));
      const node = await lab.connect({ from: NODE_IP, to: NODE_IP, port: 30080 });
      assert.equal(verdict(node, NODE_IP, 30080), '10.244.1.10:8080', describeOutcome(node));
    });
  },
  IPTABLES,
);

await describeBackends(
  "a flush behind kpng's back while a connection stays open",
  (b) => {
    const VIP = '10.96.0.10';
    const [A, B] = ['10.244.1.10', '10.244.1.11'];
    let kl: KpngLab;
    let conn: LabConnection;
    before(async () => {
      kl = await KpngLab.create(
        b,
        { tag: `canary${backendTag(b)}`, node: { name: 'node-a', interfaces: [{ name: 'eth0', addresses: [`${NODE_IP}/24`] }] }, pods: [{ name: 'web-a', ips: [A] }, { name: 'web-b', ips: [B] }, { name: 'client', ips: ['10.244.1.50'] }] },
        [
          node('node-a', undefined, [NODE_IP]),
          service('demo', 'web', { clusterIP: VIP, ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }] }),
          slice('demo', 'web-1', 'web', [A, B].map((ip) => ({ ip, node: 'node-a' }))),
        ],
        backendConfig(b, { clusterCIDR: '10.244.0.0/16', syncPeriod: '1s', minSyncPeriod: '100ms' }),
      );
      // the world answers what kpng leaves alone ("")
      await Promise.all([...['web-a', 'web-b'].map((p) => kl.lab.serve(p, { tcp: [8080] })), kl.lab.serve('world', { tcp: [80] })]);
      await kl.startAndWait(() => kl.lab.connect({ from: '10.244.1.50', to: VIP, port: 80 }));
      conn = await kl.lab.open({ from: '10.244.1.50', to: VIP, port: 80 });
      assert.equal(conn.first.kind, 'answered', describeOutcome(conn.first));
    });
    after(() => kl?.close());

    it("iptables flushed behind kpng's back (canary gone): kpng reprograms everything within syncPeriod; the open connection stays", async () => {
      const flush = [`iptables-${b.mode}`];
      for (const t of ['nat', 'filter', 'mangle']) {
        await kl.lab.exec('node-a', [...flush, '-w', '5', '-t', t, '-F']);
        await kl.lab.exec('node-a', [...flush, '-w', '5', '-t', t, '-X']);
      }
      const gone = await kl.lab.connect({ from: '10.244.1.50', to: VIP, port: 80 });
      assert.equal(verdict(gone, VIP, 80), '', `right after the flush: ${describeOutcome(gone)}`);
      const r = await pollUntil(
        () => kl.lab.burst({ from: '10.244.1.50', to: VIP, port: 80, count: 16 }),
        (out) => out.every((o) => /^10\.244\.1\.1[01]:8080$/.test(verdict(o, VIP, 80))),
        15_000,
        200,
      );
      assert.ok(r.ok, `not reprogrammed ${r.ms} ms after the flush\n${kl.kpng?.stderr.slice(-3000)}`);
      assert.match(kl.kpng!.stderr, /the dataplane was changed by someone else; repairing it/);
      const o = await conn.send();
      assert.equal(verdict(o, VIP, 80), verdict(conn.first, VIP, 80), `the open connection: ${describeOutcome(o)}`);
      await conn.close();
      const failed = (kl.kpng?.stderr ?? '').split('\n').filter((l) => /sync failed|ERROR/.test(l));
      assert.deepEqual(failed, []);
    });
  },
  IPTABLES,
);

describe('to-iptables picks the iptables the node uses', { skip: await backendLabUnsupported({ name: 'iptables', mode: 'legacy' }) }, () => {
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
      writeFileSync(join(dir, 'config.json'), JSON.stringify(backendConfig({ name: 'iptables', mode: 'legacy' }, { clusterCIDR: '10.244.0.0/16' })));
      // to-iptables without --iptables-mode
      const args = kpngArgs({ name: 'iptables', mode: 'nft' }, join(dir, 'state.json'), 'node-a', join(dir, 'config.json'), { once: true });
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
