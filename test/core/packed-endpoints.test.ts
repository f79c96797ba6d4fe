// Packed endpoints (kpng local's proxiers keep a Service's endpoints
// encoded): the same endpoints come back, a change never alters a copy held
// back, and a proxier programs exactly what it programs with decoded ones.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { pino } from 'pino';
import { PackedEndpoints } from '../../src/backends/shared/packed-endpoints.js';
import { decodeEndpoint, encodeEndpoint, newEndpoint, type Endpoint } from '../../src/api/model.js';
import { NftProxier } from '../../src/backends/nft/proxier.js';
import { driveProxier, printed, testConfig } from '../helpers/proxier-harness.js';
import { syncedStore, load, service, slice, node } from '../helpers/k8s.js';
import { convertObject } from '../../src/sources/objects.js';
import { deleteObject } from '../../src/sources/apply.js';
import type { Store } from '../../src/store/store.js';

const ep = (ip: string, over: { Local?: boolean; Hostname?: string; Terminating?: boolean; Scopes?: { Internal: boolean; External: boolean; Cluster: boolean } } = {}): Endpoint =>
  decodeEndpoint(
    encodeEndpoint(
      newEndpoint({
        IPs: { V4: ip.includes(':') ? [] : [ip], V6: ip.includes(':') ? [ip] : [] },
        NodeName: 'n2',
        Scopes: { Internal: true, External: true, Cluster: true },
        PortOverrides: [{ Name: 'http', Port: 8080, Protocol: 1 }],
        ...over,
      }),
    ),
  );

const plain = (eps: Iterable<Endpoint>) => [...eps].map((e) => JSON.stringify(e));

test('packed endpoints: set, replace, delete; every value comes back; a change makes a new set', () => {
  const a = ep('10.0.0.1');
  const b = ep('fd00::2', { Local: true, Hostname: 'h', Terminating: true, Scopes: { Internal: false, External: true, Cluster: false } });
  const one = PackedEndpoints.EMPTY.with('a', a);
  const two = one.with('b', b, encodeEndpoint(b));
  assert.deepEqual(plain(one.values()), plain([a]));
  assert.deepEqual(plain(two.values()), plain([a, b]));
  assert.deepEqual([...two.entries()].map(([k]) => k), ['a', 'b']);
  const c = ep('10.0.0.3');
  const replaced = two.with('a', c);
  assert.deepEqual(plain(replaced.values()), plain([c, b]));
  assert.deepEqual(plain(two.values()), plain([a, b]), 'the set it came from is unchanged');
  const gone = replaced.without('a');
  assert.deepEqual(plain(gone.values()), plain([b]));
  assert.equal(gone.without('nothing'), gone);
  assert.equal(gone.without('b').size, 0);
});

function nftDryRun(store: Store, pack: boolean) {
  const { out, sink } = printed();
  const config = testConfig((c) => (c.nftables.minSyncPeriodMs = 0));
  const proxier = new NftProxier({ nodeName: 'n1', config, log: pino({ level: 'silent' }), dryRun: true, once: true, out: sink, healthChecks: false, packEndpoints: pack });
  return driveProxier(store, proxier, { printed: out });
}

test('a proxier with packed endpoints programs what it programs with decoded ones, change after change', async () => {
  const eps = (n: number, from = 1) => Array.from({ length: n }, (_, i) => ({ ip: `10.1.${(from + i) >> 8}.${(from + i) & 255}`, node: i % 3 ? 'n2' : 'n1', pod: `p${from + i}` }));
  const objs = [
    node('n1', 'z1', ['192.168.0.2']),
    service('ns', 'small', { clusterIP: '172.30.0.10', type: 'NodePort', externalTrafficPolicy: 'Local', ports: [{ name: 'http', port: 80, nodePort: 30080 }] }),
    slice('ns', 'small-1', 'small', eps(3), [{ name: 'http', port: 8080 }]),
    service('ns', 'grows', { clusterIP: '172.30.0.11', ports: [{ name: 'http', port: 80 }] }),
    slice('ns', 'grows-1', 'grows', eps(15, 100), [{ name: 'http', port: 8080 }]),
  ];
  const stores = [syncedStore(objs), syncedStore(objs)];
  const runs = [nftDryRun(stores[0], false), nftDryRun(stores[1], true)];
  const remove = (s: Store, o: Record<string, unknown>) =>
    s.update((tx) => {
      const c = convertObject(o);
      if (c.kind !== 'Ignored') deleteObject(tx, c);
    });
  const step = async (change: (s: Store) => void) => {
    const texts: string[] = [];
    for (const [i, r] of runs.entries()) {
      change(stores[i]);
      texts.push(await r.sync());
    }
    assert.equal(texts[1], texts[0]);
    return texts[0];
  };
  const first = await step(() => {});
  assert.match(first, /172\.30\.0\.11 \. tcp \. 80 \. 14 : 10\.1\.0\.114 \. 8080/);
  // past 16 endpoints (a packed set becomes a Map), a second slice, endpoints replaced and removed
  const grown = await step((s) => load(s, [slice('ns', 'grows-1', 'grows', eps(20, 100), [{ name: 'http', port: 8080 }]), slice('ns', 'grows-2', 'grows', eps(2, 300), [{ name: 'http', port: 8080 }])]));
  assert.match(grown, /10\.1\.1\.45 \. 8080/);
  assert.match(await step((s) => load(s, [slice('ns', 'small-1', 'small', [...eps(1), ...eps(1, 50)], [{ name: 'http', port: 8080 }])])), /10\.1\.0\.50/);
  await step((s) => remove(s, slice('ns', 'grows-1', 'grows', [], [])));
  await step((s) => load(s, [slice('ns', 'small-1', 'small', [], [{ name: 'http', port: 8080 }])]));
  for (const r of runs) await r.close();
});
