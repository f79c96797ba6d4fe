// /globalv1.Sets/Watch on both transports: kpng's paths, values and op
// order (golden), ServiceCIDRs only on request, and `kpng api` (ApiSource)
// chaining a second store that follows the first one, also across a
// reconnect, with only real changes reaching it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fromBinary } from '@bufbuild/protobuf';
import * as G from '../../src/api/gen/api/globalv1/api_pb.js';
import type { OpItem } from '../../src/api/gen/api/localv1/api_pb.js';
import { LocalSet } from '../../src/api/model.js';
import { globalWatchMethod, GLOBAL_SETS_HEADER } from '../../src/api/grpc/wire.js';
import { Store, type StoreChange } from '../../src/store/store.js';
import { ServiceViews } from '../../src/localstate/views.js';
import { LocalDiff } from '../../src/diff/local-diff.js';
import { ApiSource } from '../../src/sources/api/index.js';
import { TRANSPORTS, RawWatch, apply, remove, diffsOf, listenAddress, node, slice, smallCluster, startServer, svc, syncedStore, quiet, type TestServer, testResources } from './helpers.js';
import { until } from '../helpers/until.js';

const { dirs, cleanups } = testResources();

const H = /\|[0-9a-f]{1,16}$/;
const norm = (d: string[]) => d.map((s) => s.replace(H, '|<h>'));
const sets = (items: OpItem[]) => items.filter((i) => i.Op.case === 'Set').map((i) => (i.Op.case === 'Set' ? i.Op.value : undefined)!);

for (const t of TRANSPORTS) {
  test(`golden global stream: kpng paths, values with Hash, op order (${t})`, async () => {
    const store = syncedStore(smallCluster());
    const s = await startServer(store, listenAddress(t, dirs));
    cleanups.push(() => s.stop());
    const w = new RawWatch(s.address, globalWatchMethod, {} as G.GlobalWatchReq, { autoRequest: true });
    cleanups.push(() => w.close());
    await w.waitSyncs(1);
    assert.deepEqual(norm(diffsOf(w.items)[0]), [
      'reset',
      'set GlobalNodeInfos |node-a||',
      'set GlobalNodeInfos |node-b||',
      'set GlobalServiceInfos ns|db||',
      'set GlobalServiceInfos ns|web||',
      'set GlobalEndpointInfos ns|db|db-1|<h>',
      'set GlobalEndpointInfos ns|web|web-1|<h>',
      'set GlobalEndpointInfos ns|web|web-1|<h>',
      'set GlobalEndpointInfos ns||db-1|<h>',
      'set GlobalEndpointInfos ns||web-1|<h>',
      'set GlobalEndpointInfos ns||web-1|<h>',
      'sync',
    ]);
    // values: Infos with a Hash; each endpoint twice with the same bytes, its path keyed by its hash
    const byPath = new Map(sets(w.items).map((v) => [v.Ref!.Path, v.Bytes]));
    const nodeInfo = fromBinary(G.NodeInfoSchema, byPath.get('|node-a||')!);
    assert.equal(nodeInfo.Node?.Name, 'node-a');
    assert.equal(nodeInfo.Node?.Topology?.Zone, 'z1');
    assert.notEqual(nodeInfo.Hash, 0n);
    const svcInfo = fromBinary(G.ServiceInfoSchema, byPath.get('ns|web||')!);
    assert.equal(svcInfo.Service?.IPs?.ClusterIPs?.V4[0], '10.96.0.10');
    assert.notEqual(svcInfo.Hash, 0n);
    for (const [path, bytes] of byPath) {
      if (!path.startsWith('ns||')) continue;
      const [ns, , sl, key] = path.split('|');
      const info = fromBinary(G.EndpointInfoSchema, bytes);
      assert.equal(info.Hash.toString(16), key);
      assert.equal(info.Namespace, ns);
      assert.equal(info.SourceName, sl);
      assert.deepEqual(byPath.get(`${ns}|${info.ServiceName}|${sl}|${key}`), bytes);
    }
    const podNames = [...byPath].filter(([p]) => p.startsWith('ns||web-1|')).map(([, b]) => fromBinary(G.EndpointInfoSchema, b).PodName).sort();
    assert.deepEqual(podNames, ['web-a', 'web-b']);

    // a change: an endpoint, a service (with its slice) and a node go
    const webB = [...byPath.keys()].find((p) => p.startsWith('ns||web-1|') && fromBinary(G.EndpointInfoSchema, byPath.get(p)!).PodName === 'web-b')!;
    const hb = webB.split('|')[3];
    const hdb = [...byPath.keys()].find((p) => p.startsWith('ns||db-1|'))!.split('|')[3];
    store.update((tx) => {
      tx.deleteNode('node-b');
      tx.deleteService('ns', 'db');
      tx.deleteSlice('ns', 'db-1');
    });
    apply(store, slice('ns', 'web-1', 'web', [{ ip: '10.1.0.1', node: 'node-a', pod: 'web-a' }]));
    await w.waitSyncs(2);
    // both updates (made in one tick) coalesce into one diff: endpoint Deletes
    // (descending paths), then service Deletes, then node Deletes
    assert.deepEqual(diffsOf(w.items)[1], [
      `delete GlobalEndpointInfos ns||web-1|${hb}`,
      `delete GlobalEndpointInfos ns||db-1|${hdb}`,
      `delete GlobalEndpointInfos ns|web|web-1|${hb}`,
      `delete GlobalEndpointInfos ns|db|db-1|${hdb}`,
      'delete GlobalServiceInfos ns|db||',
      'delete GlobalNodeInfos |node-b||',
      'sync',
    ]);

    // Sets in one diff: nodes, then services, then endpoints (ascending paths)
    apply(store, node('node-c'), svc('ns', 'api', '10.96.0.30'), slice('ns', 'api-1', 'api', [{ ip: '10.1.0.7', pod: 'api-x' }]));
    await w.waitSyncs(3);
    assert.deepEqual(norm(diffsOf(w.items)[2]), [
      'set GlobalNodeInfos |node-c||',
      'set GlobalServiceInfos ns|api||',
      'set GlobalEndpointInfos ns|api|api-1|<h>',
      'set GlobalEndpointInfos ns||api-1|<h>',
      'sync',
    ]);
  });
}

test('ServiceCIDRs go only to a global watcher that asked for them', async () => {
  const store = syncedStore([...smallCluster(), { apiVersion: 'networking.k8s.io/v1', kind: 'ServiceCIDR', metadata: { name: 'kubernetes' }, spec: { cidrs: ['10.96.0.0/16'] } }]);
  const s = await startServer(store, listenAddress('unix', dirs));
  cleanups.push(() => s.stop());
  const plain = new RawWatch(s.address, globalWatchMethod, {} as G.GlobalWatchReq);
  const asking = new RawWatch(s.address, globalWatchMethod, {} as G.GlobalWatchReq, { metadata: { [GLOBAL_SETS_HEADER]: 'GlobalServiceCIDRInfos' } });
  cleanups.push(() => plain.close(), () => asking.close());
  await plain.waitSyncs(1);
  await asking.waitSyncs(1);
  assert.ok(!diffsOf(plain.items)[0].some((x) => x.includes('CIDR')));
  const d = diffsOf(asking.items)[0];
  assert.deepEqual(d.slice(0, 4), ['reset', 'set GlobalNodeInfos |node-a||', 'set GlobalNodeInfos |node-b||', 'set GlobalServiceCIDRInfos |kubernetes||']);
  const v = sets(asking.items).find((x) => x.Ref!.Set === LocalSet.GlobalServiceCIDRInfos)!;
  assert.deepEqual(fromBinary(G.ServiceCIDRInfoSchema, v.Bytes).ServiceCIDR?.CIDRs, ['10.96.0.0/16']);
});

/** every node's view, as paths and value bytes */
function nodeViews(store: Store, nodes: string[]): Record<string, string[]> {
  const views = new ServiceViews(store);
  const out: Record<string, string[]> = {};
  for (const n of nodes) {
    const d = new LocalDiff(store, views, n, { sets: [LocalSet.NodesSet, LocalSet.ServiceCIDRsSet] });
    out[n] = d.next().map((op) => (op.kind === 'set' ? `${op.path}=${Buffer.from(op.bytes).toString('hex')}` : op.kind));
    d.close();
  }
  return out;
}

for (const t of TRANSPORTS) {
  test(`kpng api: a chained store follows the brain, across a reconnect, with only real changes (${t})`, async () => {
    const upstream = syncedStore([
      ...smallCluster(),
      { apiVersion: 'networking.k8s.io/v1', kind: 'ServiceCIDR', metadata: { name: 'kubernetes' }, spec: { cidrs: ['10.96.0.0/16'] } },
    ]);
    const listen = listenAddress(t, dirs);
    let s: TestServer = await startServer(upstream, listen);
    const address = s.address; // the port, for tcp
    cleanups.push(() => s.stop());

    const chained = new Store();
    const changes: StoreChange[] = [];
    chained.subscribe((c) => changes.push(c));
    const src = new ApiSource(chained, quiet, { address, minBackoffMs: 20, maxBackoffMs: 100 });
    src.start();
    cleanups.push(() => src.stop());
    await until('the chained store to sync', () => chained.allSynced);
    const nodes = ['node-a', 'node-b', 'node-x'];
    assert.deepEqual(nodeViews(chained, nodes), nodeViews(upstream, nodes));
    assert.equal(changes.length, 1, 'the first diff is applied in one update');

    apply(upstream, svc('ns', 'api', '10.96.0.30'), slice('ns', 'api-1', 'api', [{ ip: '10.1.0.5', node: 'node-a', pod: 'api-a' }]));
    await until('the new service', () => !!chained.getService('ns/api'));
    await until('its slice', () => chained.slicesOfService('ns/api').length === 1);
    assert.deepEqual(nodeViews(chained, nodes), nodeViews(upstream, nodes));

    // the brain goes away; meanwhile an endpoint changes and a service goes; the brain comes back
    await s.stop();
    apply(upstream, slice('ns', 'api-1', 'api', [{ ip: '10.1.0.6', node: 'node-b', pod: 'api-b' }]));
    remove(upstream, svc('ns', 'db', '10.96.0.20'), slice('ns', 'db-1', 'db', []));
    const before = changes.length;
    s = await startServer(upstream, address);
    await until('the change after the reconnect', () => chained.slicesOfService('ns/api')[0]?.endpoints[0]?.PodName === 'api-b', { timeoutMs: 10_000 });
    assert.deepEqual(nodeViews(chained, nodes), nodeViews(upstream, nodes));
    assert.equal(chained.getService('ns/db'), undefined);
    // the full resend became one store change touching only what changed
    const after = changes.slice(before);
    assert.equal(after.length, 1);
    assert.deepEqual([...after[0].slices].sort(), ['ns/api-1', 'ns/db-1']);
    assert.deepEqual([...after[0].services].sort(), ['ns/api', 'ns/db']);
    assert.equal(after[0].nodes.size, 0);
    assert.equal(after[0].serviceCIDRs, false);

    remove(upstream, svc('ns', 'web', '10.96.0.10'), slice('ns', 'web-1', 'web', []));
    await until('the deleted service', () => !chained.getService('ns/web') && chained.slicesOfService('ns/web').length === 0);
    assert.equal(chained.allSynced, true);
    assert.deepEqual(nodeViews(chained, nodes), nodeViews(upstream, nodes));
  });
}
