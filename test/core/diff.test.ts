// The node-local diff stream: kpng's op order, Reset/Sync, and the no-op rule.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { syncedStore, service, slice, node, serviceCIDR, load, watch, opText } from '../helpers/k8s.js';
import { Store, KINDS } from '../../src/store/store.js';
import { LocalSet, type Endpoint, type Service } from '../../src/api/model.js';
import { FullStateSink, type FullState } from '../../src/diff/fullstate.js';
import { DecoderSink } from '../../src/diff/decoder.js';
import { FilterResetSink } from '../../src/diff/filter-reset.js';
import type { LocalOp } from '../../src/diff/ops.js';
import { LocalDiff } from '../../src/diff/local-diff.js';
import { ServiceViews } from '../../src/localstate/views.js';

const base = () => [
  node('a', 'z1'),
  node('b', 'z2'),
  service('ns', 'web', { clusterIP: '10.96.0.1' }),
  slice('ns', 'web-1', 'web', [{ ip: '10.0.0.1', node: 'a', pod: 'web-1' }, { ip: '10.0.0.2', node: 'b', pod: 'web-2' }]),
  service('ns', 'db', { clusterIP: '10.96.0.2', ports: [{ name: 'sql', port: 5432 }] }),
  slice('ns', 'db-1', 'db', [{ ip: '10.0.1.1', node: 'b' }], [{ name: 'sql', port: 5432 }]),
];

test('the first diff is Reset, the full state, Sync', () => {
  const w = watch(syncedStore(base()), 'a');
  const ops = w.nextText();
  assert.equal(ops[0], 'reset');
  assert.equal(ops.at(-1), 'sync');
  assert.deepEqual(ops.slice(1, 3), ['set ServicesSet ns/db', 'set ServicesSet ns/web']);
  assert.deepEqual(ops.slice(3, 5), ['set EndpointsSet ns/web/web-1', 'set EndpointsSet ns/web/web-2']);
  assert.match(ops[5], /^set EndpointsSet ns\/db\/[0-9a-f]{16}$/);
  assert.equal(ops.length, 7);
});

test('an empty cluster still gets Reset and Sync, so a backend can program its base', () => {
  const w = watch(syncedStore(), 'a');
  assert.deepEqual(w.nextText(), ['reset', 'sync']);
  assert.deepEqual(w.nextText(), []);
});

test('nothing is emitted before every kind has synced', () => {
  const store = new Store();
  load(store, base());
  const w = watch(store, 'a');
  assert.deepEqual(w.nextText(), []);
  store.update((tx) => KINDS.forEach((k) => tx.setSynced(k)));
  assert.equal(w.nextText()[0], 'reset');
});

test("kpng's order: service sets, anonymous deletes, named sets, named deletes, anonymous sets, service deletes", () => {
  const store = syncedStore(base());
  const w = watch(store, 'a');
  w.next();
  load(store, [
    service('ns', 'new', { clusterIP: '10.96.0.3' }),
    slice('ns', 'new-1', 'new', [{ ip: '10.0.2.1', pod: 'new-1' }]),
    // web: web-2 goes away, web-3 appears; db's anonymous endpoint changes IP
    slice('ns', 'web-1', 'web', [{ ip: '10.0.0.1', node: 'a', pod: 'web-1' }, { ip: '10.0.0.3', node: 'b', pod: 'web-3' }]),
    slice('ns', 'db-1', 'db', [{ ip: '10.0.1.2', node: 'b' }], [{ name: 'sql', port: 5432 }]),
  ]);
  store.update((tx) => tx.deleteService('ns', 'gone'));
  const ops = w.nextText();
  const kinds = ops.map((o) =>
    o.startsWith('set ServicesSet') ? 'svc-set' : o.startsWith('delete ServicesSet') ? 'svc-del' : o.startsWith('set EndpointsSet ns/db/') ? 'anon-set' : o.startsWith('delete EndpointsSet ns/db/') ? 'anon-del' : o.startsWith('set Endpoints') ? 'named-set' : o.startsWith('delete Endpoints') ? 'named-del' : o,
  );
  assert.deepEqual(kinds, ['svc-set', 'anon-del', 'named-set', 'named-set', 'named-del', 'anon-set', 'sync']);
  assert.deepEqual(ops.filter((o) => o.includes('named') || o.startsWith('set EndpointsSet ns/n') || o.startsWith('set EndpointsSet ns/w') || o.startsWith('delete EndpointsSet ns/w')), [
    'set EndpointsSet ns/new/new-1',
    'set EndpointsSet ns/web/web-3',
    'delete EndpointsSet ns/web/web-2',
  ]);
});

test('a deleted service: its endpoints go first, then the service', () => {
  const store = syncedStore(base());
  const w = watch(store, 'a');
  w.next();
  store.update((tx) => {
    tx.deleteService('ns', 'web');
    tx.deleteSlice('ns', 'web-1');
  });
  assert.deepEqual(w.nextText(), ['delete EndpointsSet ns/web/web-2', 'delete EndpointsSet ns/web/web-1', 'delete ServicesSet ns/web', 'sync']);
});

test('re-applying the same objects emits nothing, and does not move the revision', () => {
  const store = syncedStore(base());
  const w = watch(store, 'a');
  w.next();
  const rev = store.rev;
  load(store, base());
  assert.equal(store.rev, rev);
  assert.deepEqual(w.nextText(), []);
});

test("a change to another node's local endpoints emits nothing for this node", () => {
  const objs = [
    node('a', 'z1'),
    node('b', 'z2'),
    service('ns', 'local', { clusterIP: '10.96.0.5', internalTrafficPolicy: 'Local' }),
    slice('ns', 'local-1', 'local', [{ ip: '10.0.5.1', node: 'a', pod: 'l-a' }, { ip: '10.0.5.2', node: 'b', pod: 'l-b' }]),
  ];
  const store = syncedStore(objs);
  const a = watch(store, 'a');
  const b = watch(store, 'b');
  a.next();
  b.next();
  const rev = store.rev;
  load(store, [slice('ns', 'local-1', 'local', [{ ip: '10.0.5.1', node: 'a', pod: 'l-a' }, { ip: '10.0.5.3', node: 'b', pod: 'l-b2' }])]);
  assert.ok(store.rev > rev, 'the global state did change');
  assert.deepEqual(a.nextText(), [], 'node a does not see node b\'s local endpoints');
  assert.deepEqual(b.nextText(), ['set EndpointsSet ns/local/l-b2', 'delete EndpointsSet ns/local/l-b', 'sync']);
});

test('a status-only change of a Service (not used by a proxy) emits nothing', () => {
  const store = syncedStore(base());
  const w = watch(store, 'a');
  w.next();
  load(store, [service('ns', 'web', { clusterIP: '10.96.0.1' }, { metadata: { annotations: { x: 'y' }, resourceVersion: '99' } })]);
  assert.deepEqual(w.nextText(), []);
});

test('the node and ServiceCIDRs come first when asked for, and a zone change recomputes topology', () => {
  const store = syncedStore([...base(), serviceCIDR('kubernetes', ['10.96.0.0/16'])]);
  const w = watch(store, 'a', [LocalSet.NodesSet, LocalSet.ServiceCIDRsSet]);
  const ops = w.nextText();
  assert.deepEqual(ops.slice(0, 3), ['reset', 'set NodesSet a', 'set ServiceCIDRsSet kubernetes']);
  load(store, [
    slice('ns', 'web-1', 'web', [
      { ip: '10.0.0.1', node: 'a', pod: 'web-1', zoneHints: ['z1'] },
      { ip: '10.0.0.2', node: 'b', pod: 'web-2', zoneHints: ['z2'] },
    ]),
  ]);
  assert.deepEqual(w.nextText(), ['delete EndpointsSet ns/web/web-2', 'sync']);
  load(store, [node('a', 'z2')]);
  assert.deepEqual(w.nextText(), ['set NodesSet a', 'set EndpointsSet ns/web/web-2', 'delete EndpointsSet ns/web/web-1', 'sync']);
});

test('the full-state consumer gets the whole state at each Sync', async () => {
  const store = syncedStore(base());
  const w = watch(store, 'a');
  const states: FullState[] = [];
  const sink = new FullStateSink((s) => void states.push(s));
  for (const op of w.next()) await sink.send(op);
  load(store, [slice('ns', 'db-1', 'db', [], [{ name: 'sql', port: 5432 }])]);
  for (const op of w.next()) await sink.send(op);
  assert.equal(states.length, 2);
  assert.deepEqual(states[0].services.map((s) => [s.service.Name, s.endpoints.length]), [['db', 1], ['web', 2]]);
  assert.deepEqual(states[1].services.map((s) => [s.service.Name, s.endpoints.length]), [['db', 0], ['web', 2]]);
});

test('the decoder consumer gets incremental callbacks', async () => {
  const store = syncedStore(base());
  const w = watch(store, 'a');
  const calls: string[] = [];
  const sink = new DecoderSink({
    reset: () => void calls.push('reset'),
    setService: (s: Service) => void calls.push(`setService ${s.Namespace}/${s.Name}`),
    deleteService: (ns, n) => void calls.push(`deleteService ${ns}/${n}`),
    setEndpoint: (ns, s, k, e: Endpoint) => void calls.push(`setEndpoint ${ns}/${s} ${k} ${e.IPs!.V4[0]}`),
    deleteEndpoint: (ns, s, k) => void calls.push(`deleteEndpoint ${ns}/${s} ${k}`),
    sync: () => void calls.push('sync'),
  });
  for (const op of w.next()) await sink.send(op);
  calls.length = 0;
  store.update((tx) => tx.deleteSlice('ns', 'web-1'));
  for (const op of w.next()) await sink.send(op);
  assert.deepEqual(calls, ['setService ns/web', 'deleteEndpoint ns/web web-2', 'deleteEndpoint ns/web web-1', 'sync']);
});

test('filter-reset turns a resend after a reconnect into only what changed', async () => {
  const store = syncedStore(base());
  const seen: LocalOp[] = [];
  const sink = new FilterResetSink({ send: (op) => void seen.push(op) });
  const w1 = watch(store, 'a');
  for (const op of w1.next()) await sink.send(op);
  const firstCount = seen.length;
  // the connection drops; meanwhile web-2 goes away; a new stream resends all
  load(store, [slice('ns', 'web-1', 'web', [{ ip: '10.0.0.1', node: 'a', pod: 'web-1' }])]);
  const w2 = watch(store, 'a');
  for (const op of w2.next()) await sink.send(op);
  assert.deepEqual(seen.slice(firstCount).map(opText), ['delete EndpointsSet ns/web/web-2', 'sync']);
  assert.equal(seen.filter((o) => o.kind === 'reset').length, 1);
});

test('work is proportional to the change: one changed service is one view computed', () => {
  const objs = [node('a', 'z1')];
  for (let i = 0; i < 200; i++) {
    objs.push(service('ns', `s${i}`, { clusterIP: `10.96.1.${i}` }), slice('ns', `s${i}-1`, `s${i}`, [{ ip: `10.1.0.${i}`, pod: `p${i}` }]));
  }
  const store = syncedStore(objs);
  const w = watch(store, 'a');
  w.next();
  const views = (w.diff as any).views;
  const before = views.computed;
  load(store, [slice('ns', 's7-1', 's7', [{ ip: '10.2.0.7', pod: 'p7b' }])]);
  assert.deepEqual(w.nextText(), ['set EndpointsSet ns/s7/p7b', 'delete EndpointsSet ns/s7/p7', 'sync']);
  assert.equal(views.computed - before, 1);
});

test('one change fanned out: nodes that make the same transition share one frozen op list, equal to what each computes alone', () => {
  const nodes = ['a', 'b', 'c', 'd'];
  const objs = [node('a', 'z1'), node('b', 'z1'), node('c', 'z2'), node('d', 'z2')];
  const eps = (i: number, gen: number) => nodes.slice(0, 2 + (i % 3)).map((n, j) => ({ ip: `10.${gen % 200}.${i}.${j + 1}`, node: n, pod: `p${i}-${j}-${gen}` }));
  const spec = (i: number) => ({ clusterIP: `10.96.0.${i + 1}`, ...(i % 4 === 1 ? { internalTrafficPolicy: 'Local' } : {}), ...(i % 4 === 2 ? { type: 'NodePort', externalTrafficPolicy: 'Local' } : {}) });
  for (let i = 0; i < 8; i++) objs.push(service('ns', `s${i}`, spec(i)), slice('ns', `s${i}-1`, `s${i}`, eps(i, 0)));
  const store = syncedStore(objs);
  // the nodes of a brain share its views; the reference nodes each have their own (nothing to share)
  const views = new ServiceViews(store);
  const shared = nodes.map((n) => new LocalDiff(store, views, n));
  const alone = nodes.map((n) => watch(store, n));
  shared.forEach((d) => d.next());
  alone.forEach((w) => w.next());
  let sharedLists = 0;
  for (let gen = 1; gen <= 40; gen++) {
    const i = (gen * 5) % 8;
    // an endpoint moves, or the service's policy flips, one service per change
    if (gen % 7 === 0) load(store, [service('ns', `s${i}`, { ...spec(i), internalTrafficPolicy: gen % 2 ? 'Local' : 'Cluster' })]);
    else load(store, [slice('ns', `s${i}-1`, `s${i}`, eps(i, gen))]);
    const got = shared.map((d) => d.next());
    nodes.forEach((n, k) => assert.deepEqual(got[k].map(opText), alone[k].nextText(), `node ${n}, change ${gen}`));
    for (let k = 1; k < got.length; k++) {
      if (got[k].length && got.slice(0, k).includes(got[k])) (sharedLists++, assert.ok(Object.isFrozen(got[k])));
    }
  }
  assert.ok(sharedLists >= 8, `op lists shared between nodes: ${sharedLists}`);
});

test('view ids past 65,535: what a node was sent stays known (its array of ids widens from 2 bytes to 4)', () => {
  // one view per Service without endpoints: 70k Services, 70k view ids
  const n = 70_000;
  const objs = [node('a', 'z1'), ...Array.from({ length: n }, (_, i) => service('ns', `s${i}`, { clusterIP: `10.${96 + (i >> 16)}.${(i >> 8) & 255}.${i & 255}` }))];
  const store = syncedStore(objs);
  const views = new ServiceViews(store);
  const first = new LocalDiff(store, views, 'a');
  const a = first.next();
  assert.equal(a.filter((op) => op.kind === 'set').length, n);
  // a second node sends the same views: the same ids, past 65,535 for the last ones
  const second = new LocalDiff(store, views, 'b');
  assert.equal(second.next().filter((op) => op.kind === 'set').length, n);
  // nothing changed: nothing to send (an id cut to 16 bits would name another view)
  assert.deepEqual(first.next(), []);
  assert.deepEqual(second.next(), []);
  // the last Service's port changes: its view is sent again, nothing else
  load(store, [service('ns', `s${n - 1}`, { clusterIP: `10.97.17.111`, ports: [{ name: 'http', port: 8080 }] })]);
  for (const d of [first, second]) assert.deepEqual(d.next().map(opText), ['set ServicesSet ns/s69999', 'sync']);
  first.close();
  second.close();
  views.close();
});

test("a node agent's views are made while the store lists (viewsWhileListing): the first diff is the same, each view made once", async () => {
  const immediate = () => new Promise<void>((r) => setImmediate(r));
  const services = 60;
  const objects = (i: number) => [
    service('ns', `s${i}`, { clusterIP: `10.96.1.${i}` }),
    slice('ns', `s${i}-a`, `s${i}`, [{ ip: `10.1.${i}.1`, node: 'a', pod: `p${i}-1`, zone: 'z1' }, { ip: `10.1.${i}.2`, node: 'b', pod: `p${i}-2`, zone: 'z2' }]),
  ];
  const listing = new Store();
  const views = new ServiceViews(listing);
  const diff = new LocalDiff(listing, views, 'a', { viewsWhileListing: true });
  // the Services come before this node is known: no view is made for a zone not known yet
  load(listing, objects(0));
  await immediate();
  await immediate();
  assert.equal(views.computed, 0);
  load(listing, [node('a', 'z1'), node('b', 'z2')]);
  for (let i = 1; i < services; i++) {
    load(listing, objects(i));
    if (i % 7 === 0) await immediate();
  }
  // a Service whose view was made gets a second slice before the lists end; one without a slice yet gets none
  for (let i = 0; i < 20; i++) await immediate();
  const made = views.computed;
  assert.ok(made >= services - 5, `views made while listing: ${made}`);
  load(listing, [slice('ns', 's3-b', 's3', [{ ip: '10.2.3.1', node: 'a', pod: 'p3-3', zone: 'z1' }]), service('ns', 'late', { clusterIP: '10.96.2.1' })]);
  await immediate();
  listing.update((tx) => KINDS.forEach((k) => tx.setSynced(k)));
  const ops = diff.next();
  // made again by the first diff: s3 (its new slice), late (no slice when listed)
  assert.equal(views.computed, made + 2);

  // the same cluster loaded at once, no views made ahead
  const whole = syncedStore([node('a', 'z1'), node('b', 'z2'), ...Array.from({ length: services }, (_, i) => objects(i)).flat(), slice('ns', 's3-b', 's3', [{ ip: '10.2.3.1', node: 'a', pod: 'p3-3', zone: 'z1' }]), service('ns', 'late', { clusterIP: '10.96.2.1' })]);
  const plain = new LocalDiff(whole, new ServiceViews(whole), 'a').next();
  const text = (o: LocalOp) => `${opText(o)} ${o.kind === 'set' ? Buffer.from(o.bytes).toString('hex') : ''}`;
  assert.deepEqual(ops.map(text), plain.map(text));
  assert.equal(ops.length, 2 + services + 1 + services * 2 + 1);
  diff.close();
});
