// The nftables backend without packets: what it renders, what one change
// costs, and, against the real nft in a throwaway namespace, adoption after a
// restart and minimal transactions.
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, chmodSync, rmSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pino } from 'pino';
import type { Logger } from '../../src/runtime/log.js';
import { syncedStore, load, service, slice, node, serviceCIDR } from '../helpers/k8s.js';
import { NftProxier } from '../../src/backends/nft/proxier.js';
import { assignSlots } from '../../src/backends/nft/service-elements.js';
import type { KubeProxyConfiguration } from '../../src/backends/shared/config.js';
import type { Store } from '../../src/store/store.js';
import { canUseNetns, createNetns, type TestNetns } from '../helpers/netns.js';
import { recordingLogger } from '../helpers/logs.js';
import { driveProxier, printed, testConfig } from '../helpers/proxier-harness.js';
import { ConntrackNetlink } from '../../src/kernel/conntrack.js';

const quiet = pino({ level: 'silent' });

const config = (over: Partial<KubeProxyConfiguration> = {}): KubeProxyConfiguration => ({ ...testConfig(), ...over });

/** a proxier fed by a store through the real diff stream; restart() is a new kpng process (fresh memory, same kernel) */
function harness(store: Store, opts: { ns?: TestNetns; config?: KubeProxyConfiguration; chunk?: number; session?: boolean; nftPath?: string; log?: Logger; netlink?: boolean } = {}) {
  const { out, sink } = printed();
  const make = () =>
    new NftProxier({
      nodeName: 'n1',
      config: opts.config ?? config(),
      log: opts.log ?? quiet,
      dryRun: !opts.ns,
      once: true,
      out: sink,
      nftPath: opts.nftPath ?? opts.ns?.wrapper('nft'),
      conntrack: opts.ns ? new ConntrackNetlink(opts.ns.name) : false,
      healthChecks: false,
      freshLoadChunk: opts.chunk,
      session: opts.session,
      // the cold start's elements over netlink go to the test's namespace (never this process's)
      netns: opts.netlink ? opts.ns?.name : undefined,
      netlink: opts.netlink ?? false,
    });
  return Object.assign(driveProxier(store, make, { printed: out }), { out });
}

const cluster = () => [
  node('n1', 'z1', ['192.168.0.2']),
  serviceCIDR('kubernetes', ['172.30.0.0/16']),
  service('ns', 'web', { clusterIP: '172.30.0.10' }),
  slice('ns', 'web-1', 'web', [{ ip: '10.1.0.1', node: 'n1', pod: 'w1' }, { ip: '10.2.0.1', node: 'n2', pod: 'w2' }]),
  service('ns', 'lb', {
    type: 'LoadBalancer',
    clusterIP: '172.30.0.20',
    externalTrafficPolicy: 'Local',
    loadBalancerSourceRanges: ['203.0.113.0/25'],
    ports: [{ name: 'http', port: 80, nodePort: 30080 }],
  }, { status: { loadBalancer: { ingress: [{ ip: '1.2.3.4' }] } } }),
  slice('ns', 'lb-1', 'lb', [{ ip: '10.1.0.2', node: 'n1', pod: 'l1' }, { ip: '10.2.0.2', node: 'n2', pod: 'l2' }]),
  service('ns', 'dns', { clusterIP: '172.30.0.53', ports: [{ name: 'dns', port: 53, protocol: 'UDP' }], sessionAffinity: 'ClientIP', sessionAffinityConfig: { clientIP: { timeoutSeconds: 60 } } }),
  slice('ns', 'dns-1', 'dns', [{ ip: '10.2.0.3', node: 'n2', pod: 'd1' }], [{ name: 'dns', port: 53, protocol: 'UDP' }]),
  service('ns', 'empty', { clusterIP: '172.30.0.30' }),
];

describe('rendering (dry run)', () => {
  test('the first sync programs every service as elements, with shared lb chains', async () => {
    const h = harness(syncedStore(cluster()));
    const tx = await h.sync();
    assert.match(tx, /add element ip kpng service-ips \{[^}]*172\.30\.0\.10 \. tcp \. 80 comment "ns\/web:http" : goto lb-cluster-tcp-2/);
    assert.match(tx, /172\.30\.0\.10 \. tcp \. 80 \. 0 : 10\.1\.0\.1 \. 8080/);
    // eTP=Local LB IP: external dispatch, cluster set for pods/node, this node's endpoint for the rest
    assert.match(tx, /1\.2\.3\.4 \. tcp \. 80 comment "ns\/lb:http" : goto external-policy-local/);
    assert.match(tx, /add element ip kpng external-local-lb \{ 1\.2\.3\.4 \. tcp \. 80 : goto lb-local-tcp-1 \}/);
    assert.match(tx, /add element ip kpng local-endpoints-tcp \{ 1\.2\.3\.4 \. tcp \. 80 \. 0 : 10\.1\.0\.2 \. 8080 \}/);
    assert.match(tx, /add element ip kpng firewall-allow \{ 1\.2\.3\.4 \. tcp \. 80 \. 203\.0\.113\.0\/25 \}/);
    assert.match(tx, /tcp \. 30080 comment "ns\/lb:http" : goto nodeport-policy-local/);
    // no endpoints anywhere: REJECT
    assert.match(tx, /172\.30\.0\.30 \. tcp \. 80 comment "ns\/empty:http" : goto reject-chain/);
    // ClientIP affinity, as kube-proxy: the service port's own chain, a set of clients per endpoint
    const aff = /172\.30\.0\.53 \. udp \. 53 comment "ns\/dns:dns" : goto (affinity-[0-9a-f]{8})-cluster/.exec(tx)?.[1];
    assert.ok(aff, tx);
    const ep = new RegExp(`add set ip kpng (${aff}-[0-9a-f]{8}) \\{ type ipv4_addr ; flags dynamic,timeout ; timeout 1d ; \\}`).exec(tx)?.[1];
    assert.ok(ep, tx);
    const epChain = `${aff}-endpoint-${ep!.slice(aff!.length + 1)}`;
    assert.match(tx, new RegExp(`add rule ip kpng ${aff}-cluster ip saddr @${ep} goto ${epChain}\n`));
    assert.match(tx, new RegExp(`add rule ip kpng ${aff}-cluster numgen random mod 1 vmap \\{ 0 : goto ${epChain} \\}\n`));
    assert.match(tx, new RegExp(`add rule ip kpng ${epChain} update @${ep} \\{ ip saddr timeout 60s \\}\nadd rule ip kpng ${epChain} meta l4proto udp dnat ip to 10\\.2\\.0\\.3:53\n`));
    // hairpin only for endpoints that can be on this node
    assert.match(tx, /add element ip kpng hairpin \{[^}]*10\.1\.0\.1 \. 10\.1\.0\.1/);
    assert.doesNotMatch(tx, /10\.2\.0\.1 \. 10\.2\.0\.1/);
    // no per-service chain, no anonymous per-service map
    assert.doesNotMatch(tx, /add chain [^\n]*(web|ns\/)/);
  });

  test('one endpoint change is a few element changes and no chain', async () => {
    const store = syncedStore(cluster());
    const h = harness(store);
    await h.sync();
    load(store, [slice('ns', 'web-1', 'web', [{ ip: '10.1.0.1', node: 'n1', pod: 'w1' }, { ip: '10.2.0.9', node: 'n2', pod: 'w3' }])]);
    const tx = await h.sync();
    assert.deepEqual(tx.trim().split('\n'), [
      'delete element ip kpng cluster-endpoints-tcp { 172.30.0.10 . tcp . 80 . 1 }',
      'add element ip kpng cluster-endpoints-tcp { 172.30.0.10 . tcp . 80 . 1 : 10.2.0.9 . 8080 }',
    ]);
  });

  test('a service that goes away leaves nothing behind', async () => {
    const store = syncedStore(cluster());
    const h = harness(store);
    const first = await h.sync();
    store.update((tx) => {
      for (const s of ['web', 'lb', 'dns', 'empty']) tx.deleteService('ns', s);
      for (const s of ['web-1', 'lb-1', 'dns-1']) tx.deleteSlice('ns', s);
    });
    const tx = await h.sync();
    const added = [...first.matchAll(/\{ ([^}]*) \}/g)].filter((m) => !m[0].includes('type ') && !m[0].includes('typeof')).length;
    assert.ok(added > 0);
    assert.doesNotMatch(tx, /^add element/m);
    // every service element is deleted; only the node's and the ServiceCIDR's stay
    for (const set of ['service-ips', 'service-nodeports', 'cluster-ips', 'cluster-endpoints-tcp', 'local-endpoints-tcp', 'firewall-allow', 'hairpin', 'no-endpoint-services']) {
      assert.match(tx, new RegExp(`delete element ip kpng ${set} `), set);
    }
    // and its affinity chains and sets, after the elements that pointed to them
    assert.match(tx, /^delete element[^]*^flush chain ip kpng affinity-[0-9a-f]{8}-cluster\n[^]*^delete chain ip kpng affinity-[0-9a-f]{8}-cluster\n[^]*^delete set ip kpng affinity-[0-9a-f]{8}-[0-9a-f]{8}$/m);
  });

  test('slots stay put: a removed endpoint is replaced by the last one', () => {
    assert.deepEqual(assignSlots(['a', 'b', 'c', 'd'], ['a', 'c', 'd']), ['a', 'd', 'c']);
    assert.deepEqual(assignSlots(['a', 'b', 'c'], ['a', 'c', 'x']), ['a', 'x', 'c']);
    assert.deepEqual(assignSlots(['a', 'b'], ['b', 'c', 'd']), ['c', 'b', 'd']);
    assert.deepEqual(assignSlots(undefined, ['a', 'b']), ['a', 'b']);
    assert.deepEqual(assignSlots(['a', 'b', 'c'], []), []);
  });

  test('detect-local modes and masqueradeAll shape the fixed chains', async () => {
    const run = async (over: Partial<KubeProxyConfiguration>) => (await harness(syncedStore(cluster()), { config: config(over) }).sync()).split('\n').filter((l) => l.startsWith('add rule ip kpng services') || l.startsWith('add rule ip kpng external-policy-local')).join('\n');
    assert.match(await run({}), /services ip daddr @cluster-ips ip saddr != 10\.0\.0\.0\/8 meta mark set/);
    assert.match(await run({ masqueradeAll: true } as never), /services ip daddr @cluster-ips ip saddr != 10\.0\.0\.0\/8/);
    const all = config();
    all.nftables.masqueradeAll = true;
    assert.match(await run(all), /services ip daddr @cluster-ips meta mark set/);
    assert.match(await run({ detectLocalMode: 'BridgeInterface', detectLocal: { bridgeInterface: 'cbr0', interfaceNamePrefix: '' } }), /external-policy-local iifname "cbr0" ip daddr/);
    assert.match(await run({ detectLocalMode: 'InterfaceNamePrefix', detectLocal: { bridgeInterface: '', interfaceNamePrefix: 'veth' } }), /services ip daddr @cluster-ips iifname != "veth\*"/);
    assert.doesNotMatch(await run({ clusterCIDRs: [] }), /@cluster-ips .*mark set/);
  });
});

describe('against nft in a namespace', { skip: canUseNetns() }, () => {
  let ns: TestNetns;
  before(() => (ns = createNetns()));
  after(() => ns?.remove());

  test('a restart adopts the table: nothing is flushed and no element changes', async () => {
    const store = syncedStore(cluster());
    const h = harness(store, { ns });
    await h.sync();
    const before = ns.exec('nft', ['list', 'table', 'ip', 'kpng']);
    assert.match(before, /172\.30\.0\.10 \. tcp \. 80 \. 0 : 10\.1\.0\.1 \. 8080/);
    h.restart();
    await h.sync();
    assert.equal(h.proxier.stats.lastElementChanges, 0);
    assert.equal(ns.exec('nft', ['list', 'table', 'ip', 'kpng']), before);
    // and a change after the restart is incremental again
    load(store, [slice('ns', 'web-1', 'web', [{ ip: '10.1.0.1', node: 'n1', pod: 'w1' }])]);
    await h.sync();
    assert.equal(h.proxier.stats.lastElementChanges, 3);
    assert.match(ns.exec('nft', ['list', 'map', 'ip', 'kpng', 'service-ips']), /172\.30\.0\.10 \. tcp \. 80 comment "ns\/web:http" : goto lb-cluster-tcp-1/);
  });

  test('with localhost NodePorts off, the table of them a previous run left goes (asked over netlink)', async () => {
    const own = createNetns();
    try {
      own.exec('nft', ['add', 'table', 'inet', 'kpng-localhost-nodeports']);
      const h = harness(syncedStore(cluster()), { ns: own, netlink: true });
      await h.sync();
      const tables = own.exec('nft', ['list', 'tables']);
      assert.doesNotMatch(tables, /kpng-localhost-nodeports/);
      assert.match(tables, /table ip kpng\b/);
      await h.proxier.close();
    } finally {
      own.remove();
    }
  });

  test('affinity: its chains and sets follow the endpoints; the clients in them survive a restart', async () => {
    const store = syncedStore(cluster());
    const h = harness(store, { ns });
    await h.sync();
    const affinityNames = () => [...ns.exec('nft', ['list', 'table', 'ip', 'kpng']).matchAll(/^\s*(?:chain|set) (affinity-\S+) \{/gm)].map((m) => m[1]).sort();
    const first = affinityNames();
    assert.equal(first.length, 3, first.join(' ')); // the service port's chain, the endpoint's chain and set
    const set = first.find((n) => /^affinity-[0-9a-f]{8}-[0-9a-f]{8}$/.test(n))!;
    // a client the kernel put there
    ns.exec('nft', ['add', 'element', 'ip', 'kpng', set, '{ 203.0.113.9 timeout 60s }']);
    h.restart();
    await h.sync();
    assert.equal(h.proxier.stats.lastElementChanges, 0);
    assert.match(ns.exec('nft', ['list', 'set', 'ip', 'kpng', set]), /203\.0\.113\.9 timeout 1m/);
    // another endpoint: its chain and set replace the old one's in one transaction
    load(store, [slice('ns', 'dns-1', 'dns', [{ ip: '10.2.0.4', node: 'n2', pod: 'd2' }], [{ name: 'dns', port: 53, protocol: 'UDP' }])]);
    await h.sync();
    const next = affinityNames();
    assert.equal(next.length, 3, next.join(' '));
    assert.ok(!next.includes(set), next.join(' '));
    assert.match(ns.exec('nft', ['list', 'table', 'ip', 'kpng']), /udp dnat to 10\.2\.0\.4:53/);
    // the service goes: nothing of it stays
    store.update((tx) => {
      tx.deleteService('ns', 'dns');
      tx.deleteSlice('ns', 'dns-1');
    });
    await h.sync();
    assert.deepEqual(affinityNames(), []);
  });

  test('a cold start on an empty node loads in chunks, then hooks everything at once', async () => {
    const objs = [node('n1', 'z1', ['192.168.0.2']), serviceCIDR('kubernetes', ['172.30.0.0/16'])];
    for (let i = 0; i < 40; i++) {
      const proto = i % 2 ? 'UDP' : 'TCP';
      objs.push(service('ns', `s${i}`, { clusterIP: `172.30.1.${i}`, ports: [{ name: 'dns', port: 53, protocol: proto }] }));
      // the last services need a load-balancing chain no earlier chunk declared
      const eps = [{ ip: `10.3.0.${i}`, pod: `p${i}` }, { ip: `10.4.0.${i}`, pod: `q${i}` }, ...(i >= 35 ? [{ ip: `10.5.0.${i}`, pod: `r${i}` }] : [])];
      objs.push(slice('ns', `s${i}-1`, `s${i}`, eps, [{ name: 'dns', port: 53, protocol: proto }]));
    }
    // two services (in different chunks) want one element differently: the first by name counts
    objs.push(service('ns', 'a-dup', { clusterIP: '172.30.2.1', externalIPs: ['192.0.2.9'], ports: [{ name: 'http', port: 80 }] }));
    objs.push(slice('ns', 'a-dup-1', 'a-dup', [{ ip: '10.6.0.1', pod: 'd1' }]));
    objs.push(service('ns', 'z-dup', { clusterIP: '172.30.2.2', externalIPs: ['192.0.2.9'], ports: [{ name: 'http', port: 80 }] }));
    objs.push(slice('ns', 'z-dup-1', 'z-dup', [{ ip: '10.6.0.2', pod: 'd2' }]));
    const other = createNetns();
    try {
      const h = harness(syncedStore(objs), { ns: other, chunk: 7 });
      await h.sync();
      assert.equal(h.proxier.stats.lastVia, 'chunks');
      assert.ok(h.proxier.stats.lastTransactionBytes > 0);
      const listed = other.exec('nft', ['list', 'table', 'ip', 'kpng']);
      for (let i = 0; i < 40; i++) assert.match(listed, new RegExp(`172\\.30\\.1\\.${i} \\. (tcp|udp) \\. 53 comment "ns/s${i}:dns" : goto lb-cluster-(tcp|udp)-${i >= 35 ? 3 : 2}`), `s${i}`);
      assert.match(listed, /192\.0\.2\.9 \. tcp \. 80 comment "ns\/a-dup:http" : goto external-policy-cluster/);
      assert.match(listed, /192\.0\.2\.9 \. tcp \. 80 \. 0 : 10\.6\.0\.1 \. 8080/);
      assert.doesNotMatch(listed, /192\.0\.2\.9 \. tcp \. 80 \. \d+ : 10\.6\.0\.2/);
      assert.match(listed, /set service-cidrs \{[^}]*elements = \{ 172\.30\.0\.0\/16 \}/);
      assert.match(listed, /set nodeport-addresses \{[^}]*elements = \{ 192\.168\.0\.2 \}/);
      assert.match(listed, /chain nat-prerouting \{\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n\t\tjump services/);
      // what a restart finds is exactly what it wants: nothing to change
      h.restart();
      await h.sync();
      assert.equal(h.proxier.stats.lastElementChanges, 0);
    } finally {
      other.remove();
    }
  });

  test('after a cold start in chunks (which computes one Service again to warm up), the first changes apply, every Service', async () => {
    const objs = [node('n1', 'z1', ['192.168.0.2'])];
    for (let i = 0; i < 20; i++) {
      objs.push(service('ns', `s${i}`, { clusterIP: `172.30.1.${i}` }));
      objs.push(slice('ns', `s${i}-1`, `s${i}`, [{ ip: `10.3.0.${i}`, pod: `p${i}` }]));
    }
    const store = syncedStore(objs);
    const other = createNetns();
    const rec = recordingLogger();
    try {
      const h = harness(store, { ns: other, chunk: 6, log: rec.log });
      await h.sync();
      assert.equal(h.proxier.stats.lastVia, 'chunks');
      // each Service's endpoint moves: whichever one the warm-up computed again, its change is not taken for done
      load(store, objs.filter((o) => o.kind === 'EndpointSlice').map((_, i) => slice('ns', `s${i}-1`, `s${i}`, [{ ip: `10.4.0.${i}`, pod: `p${i}` }])));
      await h.sync();
      assert.equal(h.proxier.stats.lastVia, 'transaction');
      // as one incremental transaction: not repaired by reading the table back
      assert.deepEqual(rec.records.filter((r) => r.level >= 40).map((r) => r.msg), []);
      const listed = other.exec('nft', ['list', 'table', 'ip', 'kpng']);
      for (let i = 0; i < 20; i++) {
        assert.match(listed, new RegExp(`: 10\\.4\\.0\\.${i} \\. 8080`), `s${i}'s new endpoint`);
        assert.doesNotMatch(listed, new RegExp(`: 10\\.3\\.0\\.${i} \\. 8080`), `s${i}'s old endpoint`);
      }
      h.restart();
      await h.sync();
      assert.equal(h.proxier.stats.lastElementChanges, 0);
    } finally {
      other.remove();
    }
  });

  test('a cold start whose chunks go over netlink leaves the table a load through nft leaves', async () => {
    const objs = [node('n1', 'z1', ['192.168.0.2']), serviceCIDR('kubernetes', ['172.30.0.0/16'])];
    for (let i = 0; i < 1200; i++) {
      const ip = `172.30.${4 + (i >> 8)}.${i & 255}`;
      objs.push(service('ns', `s${i}`, { clusterIP: ip, type: i % 3 ? 'ClusterIP' : 'NodePort', ports: [{ name: 'http', port: 80 }] }));
      objs.push(slice('ns', `s${i}-1`, `s${i}`, [{ ip: `10.7.${i >> 8}.${i & 255}`, node: 'n1', pod: `p${i}` }, { ip: `10.8.${i >> 8}.${i & 255}`, node: 'n2', pod: `q${i}` }]));
    }
    // a LoadBalancer with source ranges: its firewall-allow elements (intervals) go through nft
    objs.push(service('ns', 'lb', { type: 'LoadBalancer', clusterIP: '172.30.9.1', loadBalancerSourceRanges: ['203.0.113.0/25'], ports: [{ name: 'http', port: 80 }] }, { status: { loadBalancer: { ingress: [{ ip: '198.51.100.9' }] } } }));
    objs.push(slice('ns', 'lb-1', 'lb', [{ ip: '10.9.0.1', node: 'n2', pod: 'l1' }]));
    const viaNetlink = createNetns();
    const viaText = createNetns();
    const listing = (n: TestNetns) => n.exec('nft', ['list', 'table', 'ip', 'kpng']).split('\n').sort().join('\n');
    // nft, counting its runs
    const dir = mkdtempSync(join(tmpdir(), 'kpng-nl-'));
    const counting = (n: TestNetns, name: string) => {
      const path = join(dir, name);
      writeFileSync(path, `#!/bin/sh\necho >> ${path}.runs\nexec ${n.wrapper('nft')} "$@"\n`);
      chmodSync(path, 0o755);
      return { path, runs: () => readFileSync(`${path}.runs`, 'utf8').length };
    };
    const nftA = counting(viaNetlink, 'a');
    const nftB = counting(viaText, 'b');
    try {
      const a = harness(syncedStore(objs), { ns: viaNetlink, chunk: 400, netlink: true, nftPath: nftA.path });
      await a.sync();
      const b = harness(syncedStore(objs), { ns: viaText, chunk: 400, nftPath: nftB.path });
      await b.sync();
      assert.equal(a.proxier.stats.lastVia, 'chunks');
      // the elements of the three chunks of 400 did not go through nft (the last chunk's one Service's did),
      // nor did the questions whether the two families' tables and the localhost table were there
      assert.equal(nftB.runs() - nftA.runs(), 6);
      const want = listing(viaText);
      assert.match(want, /198\.51\.100\.9 \. tcp \. 80 \. 203\.0\.113\.0\/25/);
      assert.match(want, /172\.30\.7\.131 \. tcp \. 80 \. 1 : 10\.8\.3\.131 \. 8080/);
      assert.equal(listing(viaNetlink), want);
      // what a restart finds is exactly what it wants
      a.restart();
      await a.sync();
      assert.equal(a.proxier.stats.lastElementChanges, 0);
      await a.proxier.close();
      await b.proxier.close();
    } finally {
      viaNetlink.remove();
      viaText.remove();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  for (const session of [false, true]) {
    test(`a change that fails on a table changed behind kpng's back is applied after reading it back (${session ? 'a long-lived nft' : 'one nft per transaction'})`, async () => {
      const store = syncedStore(cluster());
      const h = harness(store, { ns, session });
      try {
        await h.sync();
        load(store, [slice('ns', 'web-1', 'web', [{ ip: '10.1.0.6', node: 'n1', pod: 'w6' }])]);
        await h.sync();
        assert.match(ns.exec('nft', ['list', 'map', 'ip', 'kpng', 'cluster-endpoints-tcp']), /172\.30\.0\.10 \. tcp \. 80 \. 0 : 10\.1\.0\.6 \. 8080/);
        const full = h.proxier.stats.fullSyncs;
        // someone deletes an element behind kpng's back: the change's delete of it fails, so kpng reads the table back
        ns.exec('nft', ['delete', 'element', 'ip', 'kpng', 'cluster-endpoints-tcp', '{ 172.30.0.10 . tcp . 80 . 0 }']);
        load(store, [slice('ns', 'web-1', 'web', [{ ip: '10.1.0.7', node: 'n1', pod: 'w7' }])]);
        await h.sync();
        assert.equal(h.proxier.stats.fullSyncs, full + 1);
        assert.equal(h.proxier.stats.failures, 0);
        assert.match(ns.exec('nft', ['list', 'map', 'ip', 'kpng', 'cluster-endpoints-tcp']), /172\.30\.0\.10 \. tcp \. 80 \. 0 : 10\.1\.0\.7 \. 8080/);
        // and the next change is incremental again
        load(store, [slice('ns', 'web-1', 'web', [{ ip: '10.1.0.8', node: 'n1', pod: 'w8' }])]);
        await h.sync();
        assert.equal(h.proxier.stats.fullSyncs, full + 1);
        assert.match(ns.exec('nft', ['list', 'map', 'ip', 'kpng', 'cluster-endpoints-tcp']), /172\.30\.0\.10 \. tcp \. 80 \. 0 : 10\.1\.0\.8 \. 8080/);
      } finally {
        await h.proxier.close();
      }
    });
  }

  test('an nft whose -i never answers: a process per transaction from then on, logged once', async () => {
    const other = createNetns();
    const dir = mkdtempSync(join(tmpdir(), 'kpng-nft-'));
    const nft = join(dir, 'nft');
    writeFileSync(nft, `#!/bin/sh\nif [ "$1" = "-i" ]; then exit 0; fi\nexec ip netns exec ${other.name} nft "$@"\n`);
    chmodSync(nft, 0o755);
    const store = syncedStore(cluster());
    const { log, lines } = recordingLogger('warn');
    const h = harness(store, { ns: other, session: true, nftPath: nft, log });
    try {
      await h.sync();
      load(store, [slice('ns', 'web-1', 'web', [{ ip: '10.1.0.9', node: 'n1', pod: 'w9' }])]);
      await h.sync();
      assert.match(other.exec('nft', ['list', 'map', 'ip', 'kpng', 'cluster-endpoints-tcp']), /172\.30\.0\.10 \. tcp \. 80 \. 0 : 10\.1\.0\.9 \. 8080/);
      assert.equal(lines.filter((l) => /did not answer as expected/.test(l)).length, 1, lines.join(''));
    } finally {
      await h.proxier.close();
      other.remove();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
