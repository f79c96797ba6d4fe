// What lets one brain serve many nodes, without the network: views shared
// by every node that sees a service the same way (computed once per class,
// their common parts shared, values kept encoded), what each node was sent
// kept by slot, and slots reused once a deleted service is let go of.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { toBinary } from '@bufbuild/protobuf';
import { EndpointSchema, ServiceSchema } from '../../src/api/gen/api/localv1/api_pb.js';
import { ServiceViews } from '../../src/localstate/views.js';
import { computeServiceView } from '../../src/localstate/service-view.js';
import { LocalDiff } from '../../src/diff/local-diff.js';
import { LocalSet } from '../../src/api/model.js';
import { encodeSetOp } from '../../src/api/opitem.js';
import { FullStateSink, type FullState } from '../../src/diff/fullstate.js';
import type { Store } from '../../src/store/store.js';
import { apply, node, remove, slice, svc, syncedStore } from './helpers.js';

const N = (i: number) => `node-${i}`;

function cluster(services: number, nodes: number, from = 0) {
  const objs: Record<string, any>[] = [];
  for (let i = from; i < from + services; i++) {
    objs.push(svc('ns', `s${i}`, `10.96.${(i >> 8) & 255}.${i & 255}`));
    objs.push(slice('ns', `s${i}-1`, `s${i}`, [{ ip: `10.1.${(i >> 8) & 255}.${i & 255}`, node: N(i % nodes), pod: `p${i}` }, { ip: `10.2.${(i >> 8) & 255}.${i & 255}`, pod: `q${i}` }]));
  }
  return objs;
}

/** the state a node holds after applying every diff so far */
class Follower {
  state?: FullState;
  private readonly sink = new FullStateSink((s) => void (this.state = s));
  constructor(readonly diff: LocalDiff) {}
  step() {
    for (const op of this.diff.next()) this.sink.send(op);
  }
}

const render = (s: FullState | undefined) =>
  JSON.stringify(s?.services.map((x) => [toBinary(ServiceSchema, x.service), x.endpoints.map((e) => toBinary(EndpointSchema, e))].map(String)));

function fresh(store: Store, name: string): string {
  const f = new Follower(new LocalDiff(store, new ServiceViews(store), name));
  f.step();
  f.diff.close();
  return render(f.state);
}

test('churn: every node follows exactly, and slots of deleted services are reused', () => {
  const nodes = 20;
  const store = syncedStore([...Array.from({ length: nodes }, (_, i) => node(N(i))), ...cluster(100, nodes)]);
  const views = new ServiceViews(store);
  const followers = Array.from({ length: nodes }, (_, i) => new Follower(new LocalDiff(store, views, N(i))));
  followers.forEach((f) => f.step());
  assert.equal(views.slotCount, 100);
  for (let round = 1; round <= 5; round++) {
    // half the services go, as many new ones come
    const gone = cluster(50, nodes, (round - 1) * 50);
    remove(store, ...gone.filter((o) => o.kind === 'Service'), ...gone.filter((o) => o.kind === 'EndpointSlice'));
    apply(store, ...cluster(50, nodes, 50 + round * 50));
    followers.forEach((f) => f.step());
    assert.equal(views.slotCount, 100, `round ${round}: slots of deleted services are freed once nobody holds them`);
    assert.equal(views.entryCount, 100, `round ${round}: views of deleted services are let go of`);
  }
  for (const i of [0, 7, 19]) assert.equal(render(followers[i].state), fresh(store, N(i)), `node ${i}`);

  // a node that goes away lets go of its slots too
  const store2 = syncedStore(cluster(10, 2));
  const views2 = new ServiceViews(store2);
  const d = new LocalDiff(store2, views2, N(0));
  d.next();
  remove(store2, ...cluster(10, 2).filter((o) => o.kind === 'Service'));
  remove(store2, ...cluster(10, 2).filter((o) => o.kind === 'EndpointSlice'));
  assert.equal(views2.slotCount, 10, 'held until the node has seen the deletes');
  d.close();
  assert.equal(views2.slotCount, 0);
});

test('one endpoint change costs one view per node class, not one per node', () => {
  const store = syncedStore([...Array.from({ length: 100 }, (_, i) => node(N(i))), ...cluster(50, 100)]);
  const views = new ServiceViews(store);
  const diffs = Array.from({ length: 100 }, (_, i) => new LocalDiff(store, views, N(i)));
  diffs.forEach((d) => d.next());
  const before = views.computed;
  // s3's endpoints: p3 on node-3, q3 on no node
  apply(store, slice('ns', 's3-1', 's3', [{ ip: '10.9.0.3', node: N(3), pod: 'p3' }, { ip: '10.2.0.3', pod: 'q3' }]));
  const sizes = diffs.map((d) => d.next().length);
  assert.equal(views.computed - before, 2, 'the shared view and node-3\'s');
  assert.ok(sizes.every((n) => n === 2), 'every node: the endpoint and Sync');
  diffs.forEach((d) => d.close());
});

test('views share their common parts and keep values encoded until read', () => {
  const store = syncedStore([node('node-a'), node('node-z'), ...cluster(1, 1).map((o) => JSON.parse(JSON.stringify(o).replaceAll('node-0', 'node-a')))]);
  const views = new ServiceViews(store, "", { keepDecoded: false }); // as to-api runs it
  const a = views.view('ns/s0', { name: 'node-a', zone: '' })!;
  const z = views.view('ns/s0', { name: 'node-z', zone: '' })!;
  assert.notEqual(a, z);
  assert.ok(a.frame && a.frame === z.frame, 'one Service encoding (its OpItem) for both');
  assert.deepEqual(a.frame, encodeSetOp(LocalSet.ServicesSet, 'ns/s0', a.bytes), 'the OpItem that sends it');
  const [ap, aq] = a.endpoints;
  const [zp, zq] = z.endpoints;
  assert.equal(aq, zq, 'the endpoint that is the same for both is one object');
  assert.notDeepEqual(ap.bytes, zp.bytes, 'the local one differs');
  assert.deepEqual(ap.frame, encodeSetOp(LocalSet.EndpointsSet, ap.path, ap.bytes));
  assert.equal(ap.frame!.buffer, a.frame.buffer, 'the values new in one computation share one buffer');
  assert.equal(ap.endpoint.Local, true);
  assert.equal(zp.endpoint.Local, false);
  // decoded values are the computed ones
  const direct = computeServiceView(store.getService('ns/s0')!.service, store.slicesOfService('ns/s0'), { name: 'node-a', zone: '' })!;
  assert.deepEqual(toBinary(ServiceSchema, a.service), direct.bytes);
  assert.deepEqual(toBinary(EndpointSchema, ap.endpoint), direct.endpoints[0].bytes);
  assert.equal(a.service, a.service, 'decoded once');
});
