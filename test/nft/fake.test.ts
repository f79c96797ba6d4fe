// The nftables proxier against the in-memory nft (no root, no kernel):
// adoption, rebuilding after a failure, the chunked cold load, the life of
// affinity chains, a Service the dataplane refuses, and drift repair.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { driveProxier, testConfig } from '../helpers/proxier-harness.js';
import { recordingLogger } from '../helpers/logs.js';
import { syncedStore, load, service, slice, node, serviceCIDR } from '../helpers/k8s.js';
import { ManualClock } from '../helpers/clock.js';
import { NftProxier } from '../../src/backends/nft/proxier.js';
import { FakeNft } from '../../src/backends/shared/nftables/fake.js';
import type { KubeProxyConfiguration } from '../../src/backends/shared/config.js';
import type { Store } from '../../src/store/store.js';
import type { SyncResult } from '../../src/backends/shared/runner.js';

/** a proxier on a FakeNft, fed by a store through the real diff stream */
function harness(store: Store, nft: FakeNft, o: { chunk?: number; once?: boolean; clock?: ManualClock; syncPeriodMs?: number; configure?: (c: KubeProxyConfiguration) => void } = {}) {
  const config = testConfig((c) => {
    o.configure?.(c);
    c.nftables.minSyncPeriodMs = 0;
    if (o.syncPeriodMs) c.nftables.syncPeriodMs = o.syncPeriodMs;
  });
  const { log, lines } = recordingLogger('info');
  const results: SyncResult[] = [];
  const proxier = new NftProxier({ nodeName: 'n1', config, log, nft, once: o.once ?? true, healthChecks: false, freshLoadChunk: o.chunk, clock: o.clock, report: (r) => results.push(r), conntrack: false });
  return Object.assign(driveProxier(store, proxier), { lines, results });
}

const cluster = () => [
  node('n1', 'z1', ['192.168.0.2']),
  serviceCIDR('kubernetes', ['172.30.0.0/16']),
  service('ns', 'web', { clusterIP: '172.30.0.10' }),
  slice('ns', 'web-1', 'web', [{ ip: '10.1.0.1', node: 'n1', pod: 'w1' }, { ip: '10.2.0.1', node: 'n2', pod: 'w2' }]),
  service('ns', 'dns', { clusterIP: '172.30.0.53', ports: [{ name: 'dns', port: 53, protocol: 'UDP' }], sessionAffinity: 'ClientIP', sessionAffinityConfig: { clientIP: { timeoutSeconds: 60 } } }),
  slice('ns', 'dns-1', 'dns', [{ ip: '10.2.0.3', node: 'n2', pod: 'd1' }], [{ name: 'dns', port: 53, protocol: 'UDP' }]),
];

test('a restart adopts the table: one read, no change', async () => {
  const store = syncedStore(cluster());
  const nft = new FakeNft();
  const a = harness(store, nft);
  await a.sync();
  await a.close();
  const dump = nft.dump();
  const applied = nft.transactions;
  const b = harness(store, nft);
  await b.sync();
  assert.equal(b.proxier.stats.lastElementChanges, 0);
  assert.equal(nft.dump(), dump);
  assert.ok(nft.transactions - applied <= 1, 'at most the declarations again');
  await b.close();
});

test('after a failure that no Service explains, the table is built again', async () => {
  const store = syncedStore(cluster());
  const nft = new FakeNft();
  const clock = new ManualClock();
  const h = harness(store, nft, { once: false, clock });
  await h.sync();
  // someone redefines one of kpng's maps with another type: nothing kpng declares fits any more
  nft.tamper('a map redefined', (t) => {
    const m = t.get('ip kpng')!.sets.get('service-ips')!;
    m.body = 'type ipv4_addr : verdict ;';
    m.elements.clear();
  });
  load(store, [slice('ns', 'web-1', 'web', [{ ip: '10.1.0.5', node: 'n1', pod: 'w5' }])]);
  await h.sync();
  assert.equal(h.results.at(-1)!.ok, false);
  // the retry (full) deletes and declares the table again, in one transaction
  const retried = h.proxier.sync();
  await clock.advance(60_000);
  await retried;
  assert.equal(h.results.at(-1)!.ok, true);
  assert.match(nft.history.at(-1)!, /^add table ip kpng\ndelete table ip kpng\nadd table ip kpng/);
  assert.match(nft.dump(), /map service-ips \{ type ipv4_addr \. inet_proto \. inet_service : verdict ; \}\n\t\t172\.30\.0\.10 \. tcp \. 80/);
  assert.match(nft.dump(), /172\.30\.0\.10 \. tcp \. 80 \. 0 : 10\.1\.0\.5 \. 8080/);
  await h.close();
});

test('a cold start loads in chunks and ends where a single transaction would', async () => {
  const objs = [node('n1', 'z1', ['192.168.0.2']), serviceCIDR('kubernetes', ['172.30.0.0/16'])];
  for (let i = 0; i < 20; i++) {
    objs.push(service('ns', `s${i}`, { clusterIP: `172.30.1.${i}` }));
    objs.push(slice('ns', `s${i}-1`, `s${i}`, Array.from({ length: 1 + (i % 4) }, (_, j) => ({ ip: `10.3.${j}.${i}`, pod: `p${i}-${j}` }))));
  }
  const chunked = new FakeNft();
  const a = harness(syncedStore(objs), chunked, { chunk: 3 });
  await a.sync();
  assert.equal(a.proxier.stats.lastVia, 'chunks');
  assert.ok(chunked.transactions >= 20 / 3, String(chunked.transactions));
  // the base chains come last: before them, nothing hooks a packet
  assert.match(chunked.history.at(-1)!, /add chain ip kpng nat-prerouting \{ type nat hook prerouting/);
  assert.doesNotMatch(chunked.history.slice(0, -1).join(''), /hook prerouting/);
  const whole = new FakeNft();
  const b = harness(syncedStore(objs), whole, { chunk: 1000 });
  await b.sync();
  assert.equal(b.proxier.stats.lastVia, 'transaction');
  assert.equal(chunked.dump(), whole.dump());
  await a.close();
  await b.close();
});

test('affinity: a chain per endpoint list, a chain and a set per endpoint; gone with the endpoint, all gone with the Service', async () => {
  const store = syncedStore(cluster());
  const nft = new FakeNft();
  const h = harness(store, nft);
  const affinity = () => [...nft.dump().matchAll(/^\t(?:chain|set) (affinity-\S+)/gm)].map((m) => m[1]).sort();
  await h.sync();
  const first = affinity();
  assert.equal(first.length, 3, first.join(' '));
  load(store, [slice('ns', 'dns-1', 'dns', [{ ip: '10.2.0.3', node: 'n2', pod: 'd1' }, { ip: '10.2.0.4', node: 'n2', pod: 'd2' }], [{ name: 'dns', port: 53, protocol: 'UDP' }])]);
  await h.sync();
  assert.equal(affinity().length, 5);
  load(store, [slice('ns', 'dns-1', 'dns', [{ ip: '10.2.0.4', node: 'n2', pod: 'd2' }], [{ name: 'dns', port: 53, protocol: 'UDP' }])]);
  await h.sync();
  const third = affinity();
  assert.equal(third.length, 3);
  assert.notDeepEqual(third, first);
  store.update((tx) => {
    tx.deleteService('ns', 'dns');
    tx.deleteSlice('ns', 'dns-1');
  });
  await h.sync();
  assert.deepEqual(affinity(), []);
  await h.close();
});

test('a Service the dataplane refuses is left out with one log line; the others are applied; it comes back when it changes', async () => {
  const store = syncedStore(cluster());
  const nft = new FakeNft();
  const h = harness(store, nft);
  await h.sync();
  // the dataplane refuses anything about one cluster IP
  nft.failWhen = (tx) => (/172\.30\.0\.99/.test(tx.render()) ? 'Could not process rule: Invalid argument' : undefined);
  load(store, [service('ns', 'bad', { clusterIP: '172.30.0.99' }), slice('ns', 'bad-1', 'bad', [{ ip: '10.1.0.9', node: 'n1', pod: 'b1' }]), slice('ns', 'web-1', 'web', [{ ip: '10.1.0.2', node: 'n1', pod: 'w2' }])]);
  await h.sync();
  const r = h.results.at(-1)!;
  assert.equal(r.ok, true);
  assert.equal(r.partial, true);
  assert.deepEqual(r.skipped, ['ns/bad']);
  assert.match(nft.dump(), /172\.30\.0\.10 \. tcp \. 80 \. 0 : 10\.1\.0\.2 \. 8080/);
  assert.doesNotMatch(nft.dump(), /172\.30\.0\.99/);
  assert.equal(h.lines.filter((l) => /skipping Service ns\/bad/.test(l)).length, 1);
  // the next changes go through, the refused one stays out without a new search
  load(store, [slice('ns', 'web-1', 'web', [{ ip: '10.1.0.3', node: 'n1', pod: 'w3' }])]);
  const before = nft.transactions;
  await h.sync();
  assert.equal(nft.transactions, before + 1);
  assert.equal(h.results.at(-1)!.partial, true);
  // fixed: it is applied
  nft.failWhen = undefined;
  load(store, [service('ns', 'bad', { clusterIP: '172.30.0.98' })]);
  await h.sync();
  assert.equal(h.results.at(-1)!.partial, false);
  assert.match(nft.dump(), /172\.30\.0\.98 \. tcp \. 80/);
  await h.close();
});

test('a refused change to a Service keeps its last good version', async () => {
  const store = syncedStore(cluster());
  const nft = new FakeNft();
  const h = harness(store, nft);
  await h.sync();
  nft.failWhen = (tx) => (/10\.6\.6\.6/.test(tx.render()) ? 'Could not process rule: Invalid argument' : undefined);
  load(store, [slice('ns', 'web-1', 'web', [{ ip: '10.6.6.6', node: 'n1', pod: 'w6' }])]);
  await h.sync();
  assert.deepEqual(h.results.at(-1)!.skipped, ['ns/web']);
  // the endpoints it had are still programmed
  assert.match(nft.dump(), /172\.30\.0\.10 \. tcp \. 80 \. 0 : 10\.1\.0\.1 \. 8080/);
  assert.match(nft.dump(), /172\.30\.0\.10 \. tcp \. 80 \. 1 : 10\.2\.0\.1 \. 8080/);
  await h.close();
});

test('the periodic check repairs what someone else changed, and counts it', async () => {
  const store = syncedStore(cluster());
  const nft = new FakeNft();
  const clock = new ManualClock();
  const h = harness(store, nft, { once: false, clock, syncPeriodMs: 5000 });
  const synced = h.sync();
  await clock.advance(0);
  await synced;
  const good = nft.dump();
  // nothing changed: the checks do nothing
  await clock.advance(20_000);
  assert.equal(h.proxier.stats.repairs, 0);
  nft.tamper('an element deleted, a chain flushed', (t) => {
    const k = t.get('ip kpng')!;
    k.sets.get('service-ips')!.elements.delete('172.30.0.10 . tcp . 80');
    k.chains.get('services')!.rules = [];
  });
  assert.notEqual(nft.dump(), good);
  await clock.advance(5000);
  assert.equal(h.proxier.stats.repairs, 1);
  assert.equal(nft.dump(), good);
  assert.equal(h.results.at(-1)!.repaired, true);
  await h.close();
});

test('detectLocalMode NodeCIDR: nothing to warn of for a node with its pod CIDRs (single-stack), one line for a node without', async () => {
  const warnings = async (podCIDRs: string[] | undefined) => {
    const store = syncedStore([node('n1', 'z1', ['192.168.0.2'], podCIDRs ? { spec: { podCIDRs } } : {}), ...cluster().slice(1)]);
    const h = harness(store, new FakeNft(), { configure: (c) => (c.detectLocalMode = 'NodeCIDR') });
    await h.sync();
    await h.close();
    return h.lines.filter((l) => /pod CIDR|pod traffic/.test(l));
  };
  // an IPv4 node (both families programmed): its IPv6 side has no pods to tell apart
  assert.deepEqual(await warnings(['10.1.0.0/24']), []);
  assert.deepEqual(await warnings(['10.1.0.0/24', 'fd00:1::/64']), []);
  const none = await warnings(undefined);
  assert.equal(none.length, 1, none.join(''));
  assert.match(none[0], /the node has no pod CIDR yet/);
});

test('a change of endpoints touches elements only; a change of the node makes the chains that depend on it again', async () => {
  const withPodCIDR = (cidr: string) => node('n1', 'z1', ['192.168.0.2'], { spec: { podCIDRs: [cidr] } });
  const store = syncedStore([withPodCIDR('10.1.0.0/24'), ...cluster().slice(1)]);
  const nft = new FakeNft();
  const h = harness(store, nft, { configure: (c) => (c.detectLocalMode = 'NodeCIDR') });
  await h.sync();
  assert.match(nft.dump(), /ip saddr != 10\.1\.0\.0\/24/);
  // as many endpoints as before: the same lb chain
  load(store, [slice('ns', 'web-1', 'web', [{ ip: '10.1.0.7', node: 'n1', pod: 'w7' }, { ip: '10.2.0.1', node: 'n2', pod: 'w2' }])]);
  await h.sync();
  const change = nft.history.at(-1)!;
  assert.match(change, /10\.1\.0\.7/);
  assert.doesNotMatch(change, /chain|rule/, 'an endpoint change re-renders no chain');
  // the pod CIDR moves: the rules that tell pods apart follow it
  load(store, [withPodCIDR('10.1.1.0/24')]);
  await h.sync();
  assert.match(nft.history.at(-1)!, /flush chain ip kpng services/);
  assert.match(nft.dump(), /ip saddr != 10\.1\.1\.0\/24/);
  assert.doesNotMatch(nft.dump(), /10\.1\.0\.0\/24/);
  await h.close();
});
