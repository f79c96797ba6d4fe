// The eBPF proxier against in-memory maps (no root, no kernel; the lab proves
// the packets, test/lab/ebpf.test.ts): the entries a Service makes, one
// endpoint change, adoption after a restart, full maps, the layout check.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { driveProxier, testConfig } from '../helpers/proxier-harness.js';
import { recordingLogger } from '../helpers/logs.js';
import { syncedStore, load, service, slice, node } from '../helpers/k8s.js';
import { LocalSet } from '../../src/api/model.js';
import { create } from '@bufbuild/protobuf';
import { EndpointSchema, IPSetSchema } from '../../src/api/gen/api/localv1/api_pb.js';
import { EbpfProxier } from '../../src/backends/ebpf/proxier.js';
import { MemoryMaps } from '../../src/backends/ebpf/maps.js';
import { LAYOUTS, decode, encode, layoutProblems } from '../../src/backends/ebpf/layout.js';
import { cgroup2Root, onBpffs } from '../../src/backends/ebpf/datapath.js';
import { defaultConfig } from '../../src/backends/shared/config.js';
import { registry } from '../../src/runtime/metrics.js';
import type { Store } from '../../src/store/store.js';

function harness(store: Store, maps: MemoryMaps) {
  const config = testConfig((c) => (c.nftables.minSyncPeriodMs = 0));
  const { log, lines } = recordingLogger();
  const proxier = new EbpfProxier({ nodeName: 'n1', config, log, maps: () => maps, once: true, healthChecks: false, conntrack: false });
  return Object.assign(driveProxier(store, proxier, { sets: [LocalSet.NodesSet] }), { lines });
}

const ep = (ip: string, nodeName = 'n2') => ({ ip, node: nodeName, pod: `p-${ip}` });

const cluster = () => [
  node('n1', 'z1', ['192.168.0.2', 'fd00::2']),
  service('ns', 'web', { type: 'NodePort', clusterIP: '172.30.0.10', ports: [{ name: 'http', port: 80, nodePort: 30080 }], externalIPs: ['203.0.113.7'] }),
  slice('ns', 'web-1', 'web', [ep('10.1.0.1'), ep('10.1.0.2')], [{ name: 'http', port: 8080 }]),
  service('ns', 'dns', { clusterIP: '172.30.0.53', ipFamilies: ['IPv4', 'IPv6'], ipFamilyPolicy: 'PreferDualStack', clusterIPs: ['172.30.0.53', 'fd00:30::53'], ports: [{ name: 'dns', port: 53, protocol: 'UDP' }], sessionAffinity: 'ClientIP', sessionAffinityConfig: { clientIP: { timeoutSeconds: 60 } } }),
  slice('ns', 'dns-1', 'dns', [ep('10.2.0.3')], [{ name: 'dns', port: 53, protocol: 'UDP' }]),
  slice('ns', 'dns-2', 'dns', [ep('fd00:10::3')], [{ name: 'dns', port: 53, protocol: 'UDP' }], { addressType: 'IPv6' }),
  service('ns', 'empty', { clusterIP: '172.30.0.99', ports: [{ name: 'http', port: 80 }] }),
];

test('a Service is one entry per address and port, pointing at its endpoint list; no endpoints refuses', async () => {
  const maps = new MemoryMaps();
  const h = harness(syncedStore(cluster()), maps);
  await h.sync();
  const web = ['10.1.0.1:8080', '10.1.0.2:8080'];
  assert.deepEqual(maps.resolve({ ip: '172.30.0.10', port: 80, proto: 'tcp' })?.endpoints, web);
  assert.deepEqual(maps.resolve({ ip: '203.0.113.7', port: 80, proto: 'tcp' })?.endpoints, web);
  assert.deepEqual(maps.resolve({ ip: '192.168.0.2', port: 30080, proto: 'tcp' })?.endpoints, web);
  assert.deepEqual(maps.resolve({ ip: '127.0.0.1', port: 30080, proto: 'tcp' })?.endpoints, web);
  assert.equal(maps.resolve({ ip: '172.30.0.10', port: 80, proto: 'udp' }), undefined);
  assert.deepEqual(maps.resolve({ ip: '172.30.0.53', port: 53, proto: 'udp' }), { refuse: false, endpoints: ['10.2.0.3:53'], affinitySecs: 60 });
  assert.deepEqual(maps.resolve({ ip: 'fd00:30::53', port: 53, proto: 'udp' }), { refuse: false, endpoints: ['[fd00:10::3]:53'.replace(/^\[(.*)\]/, '$1')], affinitySecs: 60 });
  assert.deepEqual(maps.resolve({ ip: '172.30.0.99', port: 80, proto: 'tcp' }), { refuse: true, endpoints: [], affinitySecs: 0 });
  await h.close();
});

test('one endpoint change is one or two map writes; a deleted Service leaves nothing', async () => {
  const store = syncedStore(cluster());
  const maps = new MemoryMaps();
  const h = harness(store, maps);
  await h.sync();
  const before = maps.ops;
  load(store, [slice('ns', 'web-1', 'web', [ep('10.1.0.1'), ep('10.1.0.2'), ep('10.1.0.9')], [{ name: 'http', port: 8080 }])]);
  await h.sync();
  // the new endpoint in both lists (cluster IP: internal; the others: cluster-wide), the counts of the 4 addresses
  assert.equal(maps.ops - before, 2 + 4);
  assert.deepEqual(maps.resolve({ ip: '172.30.0.10', port: 80, proto: 'tcp' })?.endpoints, ['10.1.0.1:8080', '10.1.0.2:8080', '10.1.0.9:8080']);
  store.update((tx) => (tx.deleteService('ns', 'web'), tx.deleteSlice('ns', 'web-1')));
  await h.sync();
  assert.deepEqual([...maps.services.keys()].filter((k) => k.includes(':80') || / 80$| 30080$/.test(k)).sort(), ['tcp 172.30.0.99 80']);
  assert.ok(![...maps.endpoints.values()].some((e) => e.port === 8080), 'no endpoint of the deleted Service is left');
  await h.close();
});

test('a restart adopts the maps: nothing is written when nothing changed, ids are kept', async () => {
  const store = syncedStore(cluster());
  const maps = new MemoryMaps();
  const a = harness(store, maps);
  await a.sync();
  await a.close();
  const snapshot = JSON.stringify([...maps.services].sort()) + JSON.stringify([...maps.endpoints].sort());
  const ops = maps.ops;
  const b = harness(store, maps);
  await b.sync();
  assert.equal(maps.ops, ops, 'a restart with no change writes nothing');
  assert.equal(JSON.stringify([...maps.services].sort()) + JSON.stringify([...maps.endpoints].sort()), snapshot);
  await b.close();
});

test('a restart removes what no Service wants any more, and only that', async () => {
  const store = syncedStore(cluster());
  const maps = new MemoryMaps();
  const a = harness(store, maps);
  await a.sync();
  await a.close();
  // a stray entry (a Service deleted while kpng was down)
  maps.services.set('tcp 172.30.9.9 80', { key: { ip: '172.30.9.9', port: 80, proto: 'tcp' }, value: { id: 999, count: 1, flags: 0, affinitySecs: 0 } });
  maps.endpoints.set('999/0', { ip: '10.9.9.9', port: 80 });
  const b = harness(store, maps);
  await b.sync();
  assert.equal(maps.resolve({ ip: '172.30.9.9', port: 80, proto: 'tcp' }), undefined);
  assert.ok(![...maps.endpoints.keys()].some((k) => k.startsWith('999/')));
  assert.deepEqual(maps.resolve({ ip: '172.30.0.10', port: 80, proto: 'tcp' })?.endpoints, ['10.1.0.1:8080', '10.1.0.2:8080']);
  await b.close();
});

test('bad input never fails a sync: an endpoint that is not an address is left out, the rest is programmed', async () => {
  const maps = new MemoryMaps();
  const h = harness(syncedStore(cluster()), maps);
  await h.sync();
  const ep = create(EndpointSchema, { IPs: create(IPSetSchema, { V4: ['10.1.0.300'] }), Local: false, PortOverrides: [{ Name: 'http', Port: 8080 }], Scopes: { Internal: true, External: true, Cluster: true } });
  h.proxier.setEndpoint('ns', 'web', 'bogus', ep);
  const r = await h.proxier.sync();
  assert.equal(r.ok, true, r.error);
  assert.deepEqual(maps.resolve({ ip: '172.30.0.10', port: 80, proto: 'tcp' })?.endpoints, ['10.1.0.1:8080', '10.1.0.2:8080']);
  assert.match(h.lines.join(''), /10\.1\.0\.300.*not a usable address/);
  await h.close();
});

test('a full map is a clear error before it overflows; the Services that fit are programmed', async () => {
  const maps = new MemoryMaps({ services: 3, endpoints: 100 });
  const h = harness(syncedStore(cluster()), maps);
  await h.sync();
  assert.ok(maps.services.size <= 3);
  assert.ok(h.proxier.skipped.size > 0, 'the Services that do not fit are left out');
  assert.match(h.lines.join(''), /kpng_services is full \(3 entries\): raise --max-service-ports/);
  await h.close();
});

test('a map full at an incremental sync: the Services that fit are programmed, the one that does not is left out with why, and counted', async () => {
  const maps = new MemoryMaps({ services: 3, endpoints: 100 });
  const store = syncedStore([node('n1', 'z1', ['192.168.0.2']), service('ns', 'first', { clusterIP: '172.30.0.1' }), slice('ns', 'first-1', 'first', [ep('10.1.0.1')])]);
  const h = harness(store, maps);
  await h.sync();
  const before = Number(/kpng_ebpf_map_full_total\{map="services"\} (\d+)/.exec(await registry.getSingleMetricAsString('kpng_ebpf_map_full_total'))?.[1] ?? 0);
  // three more Services, one address each: one too many
  load(store, ['a', 'b', 'c'].flatMap((n, i) => [service('ns', n, { clusterIP: `172.30.0.${10 + i}` }), slice('ns', `${n}-1`, n, [ep(`10.1.1.${i + 1}`)])]));
  await h.sync();
  assert.equal(maps.services.size, 3);
  assert.equal(h.proxier.skipped.size, 1, 'one Service left out, the others programmed');
  const [left] = h.proxier.skipped.keys();
  assert.ok(h.lines.some((l) => l.includes(`skipping Service ${left}`) && l.includes('kpng_services is full (3 entries)')), h.lines.join(''));
  for (const [n, i] of [['first', 1], ['a', 10], ['b', 11], ['c', 12]] as const) {
    if (`ns/${n}` !== left) assert.ok(maps.resolve({ ip: `172.30.0.${i}`, port: 80, proto: 'tcp' }), `ns/${n} is programmed`);
  }
  const after = Number(/kpng_ebpf_map_full_total\{map="services"\} (\d+)/.exec(await registry.getSingleMetricAsString('kpng_ebpf_map_full_total'))?.[1] ?? 0);
  assert.ok(after > before, 'kpng_ebpf_map_full_total counts the refused sync');
  await h.close();
});

test('a Service of 1,000 endpoints: one endpoint removed or added is a few writes, not a rewrite of the list', async () => {
  const maps = new MemoryMaps();
  const eps = (n: number, without = -1) => Array.from({ length: n }, (_, i) => i).filter((i) => i !== without).map((i) => ep(`10.1.${i >> 8}.${i & 255}`));
  const store = syncedStore([node('n1', 'z1', ['192.168.0.2']), service('ns', 'big', { clusterIP: '172.30.0.10' }), slice('ns', 'big-1', 'big', eps(1000), [{ name: 'http', port: 8080 }])]);
  const h = harness(store, maps);
  await h.sync();
  const resolved = () => maps.resolve({ ip: '172.30.0.10', port: 80, proto: 'tcp' })!.endpoints.slice().sort();
  const want = (list: { ip: string }[]) => list.map((e) => `${e.ip}:8080`).sort();
  assert.deepEqual(resolved(), want(eps(1000)));
  // one from the middle goes: the last one takes its index (2 writes), and the count
  load(store, [slice('ns', 'big-1', 'big', eps(1000, 3), [{ name: 'http', port: 8080 }])]);
  await h.sync();
  assert.ok(h.proxier.stats.lastWrites <= 3, `${h.proxier.stats.lastWrites} writes`);
  assert.deepEqual(resolved(), want(eps(1000, 3)));
  // one comes (its address sorts among the others): its index at the end, and the count
  load(store, [slice('ns', 'big-1', 'big', eps(1001, 3), [{ name: 'http', port: 8080 }])]);
  await h.sync();
  assert.ok(h.proxier.stats.lastWrites <= 2, `${h.proxier.stats.lastWrites} writes`);
  assert.deepEqual(resolved(), want(eps(1001, 3)));
  await h.close();
});

test('layouts: encoders round-trip and the BTF check names what differs', () => {
  const k = encode.svcKey({ ip: 'fd00::1', port: 443, proto: 'udp' });
  assert.deepEqual(decode.svcKey(k), { ip: 'fd00::1', port: 443, proto: 'udp' });
  assert.deepEqual(decode.epValue(encode.epValue({ ip: '10.0.0.1', port: 8080 })), { ip: '10.0.0.1', port: 8080 });
  const ok = { size: 20, members: new Map(Object.entries(LAYOUTS.kpng_svc_key.fields)) };
  assert.deepEqual(layoutProblems('kpng_svc_key', ok), []);
  const moved = { size: 24, members: new Map([...ok.members, ['port', 18], ['extra', 20]]) };
  assert.deepEqual(layoutProblems('kpng_svc_key', moved), [
    'struct kpng_svc_key: 24 bytes in the object, 20 in layout.ts',
    'struct kpng_svc_key.port: offset 18 in the object, 16 in layout.ts',
    'struct kpng_svc_key.extra: in the object, not in layout.ts',
  ]);
  assert.deepEqual(layoutProblems('kpng_svc_key', undefined), ['struct kpng_svc_key: not in the object\'s BTF']);
});

test('the cgroup v2 root and bpffs are found in /proc/mounts', () => {
  const mounts = 'cgroup /sys/fs/cgroup/cpu cgroup rw 0 0\ncgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\nbpf /sys/fs/bpf bpf rw 0 0\n';
  assert.equal(cgroup2Root(mounts), '/sys/fs/cgroup/unified');
  assert.equal(cgroup2Root('cgroup /x cgroup rw 0 0\n'), undefined);
  assert.equal(onBpffs('/sys/fs/bpf/kpng', mounts), true);
  assert.equal(onBpffs('/sys/fs/bpfx/kpng', mounts), false);
});
