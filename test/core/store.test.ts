// The store's revision moves only on real change; listeners hear what changed.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { syncedStore, load, service, slice, node } from '../helpers/k8s.js';
import { Store, KINDS, encodeSlice, decodeSliceEndpoints } from '../../src/store/store.js';
import { convertObject } from '../../src/sources/objects.js';
import { toBinary } from '@bufbuild/protobuf';
import { ServiceSchema } from '../../src/api/gen/api/localv1/api_pb.js';

const convertOne = (o: Record<string, unknown>) => {
  const c = convertObject(o);
  if (c.kind !== 'Service') throw new Error('not a Service');
  return c.service;
};

test('writing what is stored changes nothing; a real change moves the revision once per update', () => {
  const store = syncedStore([service('ns', 'a'), slice('ns', 'a-1', 'a', [{ ip: '10.0.0.1' }]), node('n')]);
  const rev = store.rev;
  const changes: string[][] = [];
  store.subscribe((c) => changes.push([...c.services]));
  load(store, [service('ns', 'a'), slice('ns', 'a-1', 'a', [{ ip: '10.0.0.1' }]), node('n')]);
  assert.equal(store.rev, rev);
  assert.equal(changes.length, 0);
  load(store, [slice('ns', 'a-1', 'a', [{ ip: '10.0.0.2' }]), service('ns', 'b')]);
  assert.equal(store.rev, rev + 1);
  assert.deepEqual(changes, [['ns/a', 'ns/b']]);
});

test('events count every write; revisions count changes', () => {
  const store = new Store();
  for (let i = 0; i < 10; i++) load(store, [service('ns', 'a')]);
  assert.equal(store.events, 10);
  assert.equal(store.rev, 1);
});

test('a slice moving to another service touches both', () => {
  const store = syncedStore([service('ns', 'a'), service('ns', 'b'), slice('ns', 's', 'a', [{ ip: '10.0.0.1' }])]);
  let touched: string[] = [];
  store.subscribe((c) => (touched = [...c.services].sort()));
  load(store, [slice('ns', 's', 'b', [{ ip: '10.0.0.1' }])]);
  assert.deepEqual(touched, ['ns/a', 'ns/b']);
  assert.equal(store.slicesOfService('ns/a').length, 0);
  assert.equal(store.slicesOfService('ns/b').length, 1);
});

test('synced only when every kind has synced', () => {
  const store = new Store();
  let became = 0;
  store.subscribe((c) => (became += c.becameSynced ? 1 : 0));
  for (const k of KINDS.slice(0, -1)) store.update((tx) => tx.setSynced(k));
  assert.equal(store.allSynced, false);
  store.update((tx) => tx.setSynced(KINDS.at(-1)!));
  assert.equal(store.allSynced, true);
  assert.equal(became, 1);
});

test('a batch that throws changes nothing: no write stays, no revision, nobody woken (issue 12)', () => {
  const store = syncedStore([service('ns', 'a'), slice('ns', 'a-1', 'a', [{ ip: '10.0.0.1' }]), node('n')]);
  const rev = store.rev;
  const events = store.events;
  const before = {
    a: store.getService('ns/a'),
    version: store.serviceVersion('ns/a'),
    slices: store.slicesOfService('ns/a'),
    node: store.getNode('n'),
  };
  let woken = 0;
  store.subscribe(() => woken++);
  const boom = new Error('boom');
  assert.throws(
    () =>
      store.update((tx) => {
        load(store, []); // (a nested update is its own batch)
        const c = convertOne(service('ns', 'b'));
        tx.setService(c);
        tx.deleteService('ns', 'a');
        tx.deleteSlice('ns', 'a-1');
        tx.setSlice('ns', 'b-1', 'b', []);
        tx.deleteNode('n');
        throw boom;
      }),
    (e) => e === boom,
  );
  assert.equal(store.rev, rev);
  assert.equal(store.events, events);
  assert.equal(woken, 0);
  assert.equal(store.getService('ns/a'), before.a);
  assert.equal(store.getService('ns/b'), undefined);
  assert.equal(store.serviceVersion('ns/a'), before.version);
  assert.equal(store.serviceVersion('ns/b'), 0);
  assert.deepEqual(store.slicesOfService('ns/a'), before.slices);
  assert.deepEqual(store.slicesOfService('ns/b'), []);
  assert.equal(store.getNode('n'), before.node);
  // and the store works on
  load(store, [service('ns', 'b')]);
  assert.equal(store.rev, rev + 1);
  assert.equal(woken, 1);
});

test('the bookkeeping of deleted Services stays bounded', () => {
  const store = syncedStore([service('ns', 'keep')]);
  for (let i = 0; i < 20_000; i++) {
    load(store, [service('ns', `s${i}`), slice('ns', `s${i}-1`, `s${i}`, [{ ip: '10.0.0.1' }])]);
    store.update((tx) => {
      tx.deleteService('ns', `s${i}`);
      tx.deleteSlice('ns', `s${i}-1`);
    });
  }
  assert.equal(store.versionCount, 1);
  // a Service gone with its slice still there keeps its version (the slice is still followed)
  load(store, [service('ns', 'x'), slice('ns', 'x-1', 'x', [{ ip: '10.0.0.1' }])]);
  store.update((tx) => tx.deleteService('ns', 'x'));
  assert.ok(store.serviceVersion('ns/x') > 0);
});

test('a slice kept as bytes (a node agent) or decoded too (a brain) reads back the same endpoints, written either way; the same bytes again change nothing', () => {
  const conv = (o: Record<string, unknown>) => {
    const c = convertObject(o);
    if (c.kind !== 'EndpointSlice') throw new Error('not a slice');
    return c;
  };
  const s1 = conv(slice('ns', 'a-1', 'a', [{ ip: '10.0.0.1', node: 'n1', pod: 'p1' }, { ip: '10.0.0.2', node: 'n2', pod: 'p2' }]));
  for (const keepDecodedSlices of [false, true]) {
    const byObjects = new Store({ keepDecodedSlices });
    const byBytes = new Store({ keepDecodedSlices });
    byObjects.update((tx) => tx.setSlice('ns', 'a-1', 'a', s1.endpoints));
    byBytes.update((tx) => tx.setSliceBytes('ns', 'a-1', 'a', encodeSlice('a', s1.endpoints)));
    for (const st of [byObjects, byBytes]) {
      const got = st.getSlice('ns/a-1')!;
      assert.equal(got.serviceName, 'a');
      assert.deepEqual(got.endpoints.map((e) => [e.PodName, e.Endpoint?.IPs?.V4, e.Endpoint?.IPs?.V6, e.Topology?.Node]), [
        ['p1', ['10.0.0.1'], [], 'n1'],
        ['p2', ['10.0.0.2'], [], 'n2'],
      ]);
      // many slices read in turn (past any cache of decoded ones) still read right
      assert.deepEqual(st.getSlice('ns/a-1')!.endpoints, got.endpoints);
    }
    const rev = byObjects.rev;
    byObjects.update((tx) => tx.setSliceBytes('ns', 'a-1', 'a', encodeSlice('a', s1.endpoints)));
    assert.equal(byObjects.rev, rev, 'the same bytes are no change');
  }
});

test("slices' slabs under churn: every read right, bytes read earlier intact, memory bounded by what is stored", () => {
  const conv = (o: Record<string, unknown>) => {
    const c = convertObject(o);
    if (c.kind !== 'EndpointSlice') throw new Error('not a slice');
    return c.endpoints;
  };
  // a few endpoint lists of different sizes, one large enough for a slab of its own
  const lists = [1, 2, 5, 9, 40, 1500].map((n) => conv(slice('ns', 'x', 'svc', Array.from({ length: n }, (_, i) => ({ ip: `10.${n % 250}.${i >> 8}.${i & 255}`, node: `n${i % 7}`, pod: `p${i}` })))));
  let seed = 12345;
  const rnd = (n: number) => ((seed = (seed * 1103515245 + 12345) >>> 0) >>> 8) % n;
  for (const keepDecodedSlices of [false, true]) {
    const store = new Store({ keepDecodedSlices });
    /** slice name -> [service, list index] as written */
    const want = new Map<string, [string, number]>();
    const held: { copy: Uint8Array; view: Uint8Array }[] = [];
    // the endpoints name their slice, as a source's do (the store leaves those names out of what it keeps)
    const named = (name: string, svc: string, li: number) => lists[li].map((e) => ({ ...e, SourceName: name, ServiceName: svc }));
    const expected = (name: string) => {
      const [svc, li] = want.get(name)!;
      return encodeSlice(svc, named(name, svc, li));
    };
    let maxHeldOverLive = 0;
    for (let round = 0; round < 3000; round++) {
      store.update((tx) => {
        for (let k = 0; k < 8; k++) {
          const name = `s${rnd(300)}`;
          const op = rnd(10);
          if (op < 2) {
            tx.deleteSlice('ns', name);
            want.delete(name);
          } else {
            // the big list rarely: it would be most of the bytes
            const li = rnd(50) === 0 ? 5 : rnd(5);
            const svc = `svc${rnd(20)}`;
            if (op < 6) tx.setSlice('ns', name, svc, named(name, svc, li));
            else tx.setSliceBytes('ns', name, svc, encodeSlice(svc, named(name, svc, li)));
            want.set(name, [svc, li]);
          }
        }
      });
      if (round % 50 === 0) {
        // a caller keeping what it read: the view must never change under it
        const name = [...want.keys()][rnd(want.size)];
        if (name) {
          const got = store.getSlice(`ns/${name}`)!;
          const view = got.bytes;
          held.push({ copy: view.slice(), view });
          // and a view of the slab itself (what the record reads from): compaction must not write over it
          const packed = (got as unknown as { packed: Uint8Array }).packed;
          held.push({ copy: packed.slice(), view: packed });
        }
      }
      const { live, held: h } = store.sliceBytes;
      maxHeldOverLive = Math.max(maxHeldOverLive, h - live - live * 0.6);
    }
    assert.equal([...store.allSlices()].length, want.size);
    let total = 0;
    for (const [name, [svc]] of want) {
      const got = store.getSlice(`ns/${name}`)!;
      const bytes = expected(name);
      total += bytes.length;
      assert.deepEqual(got.bytes, bytes, name);
      assert.equal(got.serviceName, svc);
      assert.equal(got.name, name);
      assert.deepEqual(got.endpoints, decodeSliceEndpoints(bytes));
      assert.ok(store.slicesOfService(`ns/${svc}`).includes(got));
    }
    // packed: the names each endpoint repeats left out
    assert.ok(store.sliceBytes.live > 0 && store.sliceBytes.live < total, 'live bytes are what is stored');
    for (const { copy, view } of held) assert.deepEqual(view, copy, 'bytes read earlier are intact');
    // held bytes stay within the compaction's bound (1.6x live and a slab or two)
    assert.ok(maxHeldOverLive <= 2 * 256 * 1024, `held exceeded live by ${maxHeldOverLive}`);
    // everything deleted: nothing held but the current slab
    store.update((tx) => {
      for (const name of want.keys()) tx.deleteSlice('ns', name);
    });
    assert.equal(store.sliceBytes.live, 0);
    assert.ok(store.sliceBytes.held <= 256 * 1024);
  }
});

test('a batch that throws gives back the slab space of what it wrote, and what it replaced or deleted reads as before', () => {
  const store = syncedStore([service('ns', 'a'), slice('ns', 'a-1', 'a', [{ ip: '10.0.0.1' }]), slice('ns', 'a-2', 'a', [{ ip: '10.0.0.2' }])]);
  const before = store.slicesOfService('ns/a').map((s) => s.bytes.slice());
  const bytes = { ...store.sliceBytes };
  assert.throws(() =>
    store.update((tx) => {
      tx.setSlice('ns', 'a-1', 'a', []);
      tx.deleteSlice('ns', 'a-2');
      tx.setSlice('ns', 'a-3', 'a', []);
      throw new Error('boom');
    }),
  );
  assert.deepEqual(
    store.slicesOfService('ns/a').map((s) => s.bytes),
    before,
  );
  assert.equal(store.sliceBytes.live, bytes.live);
  // the same again changes nothing
  const rev = store.rev;
  load(store, [slice('ns', 'a-1', 'a', [{ ip: '10.0.0.1' }]), slice('ns', 'a-2', 'a', [{ ip: '10.0.0.2' }])]);
  assert.equal(store.rev, rev);
});

test("a Service's bytes are its canonical encoding, read as often as asked; the same Service again changes nothing", () => {
  const store = syncedStore([service('ns', 'a')]);
  const s = store.getService('ns/a')!;
  assert.deepEqual(s.bytes, toBinary(ServiceSchema, s.service));
  assert.deepEqual(s.bytes, s.bytes);
  const rev = store.rev;
  load(store, [service('ns', 'a')]);
  assert.equal(store.rev, rev);
  assert.equal(store.getService('ns/a'), s);
});

test('Services with the same ports share one frozen list; their bytes are still their own', () => {
  const ports = [{ name: 'http', port: 80, targetPort: 8080 }, { name: 'dns', port: 53, protocol: 'UDP' }];
  const store = syncedStore([
    service('ns', 'a', { ports, clusterIP: '10.96.0.1' }),
    service('ns', 'b', { ports, clusterIP: '10.96.0.2' }),
    service('ns', 'c', { ports: [{ name: 'http', port: 81 }], clusterIP: '10.96.0.3' }),
  ]);
  const [a, b, c] = ['ns/a', 'ns/b', 'ns/c'].map((k) => store.getService(k)!);
  assert.equal(a.service.Ports, b.service.Ports);
  assert.notEqual(a.service.Ports, c.service.Ports);
  assert.ok(Object.isFrozen(a.service.Ports) && Object.isFrozen(a.service.Ports[0]));
  for (const s of [a, b, c]) assert.deepEqual(s.bytes, toBinary(ServiceSchema, s.service));
  assert.deepEqual(a.service.Ports.map((p) => [p.Name, p.Port, p.TargetPort]), [['http', 80, 8080], ['dns', 53, 53]]);
});

test("a Service written as its encoding (a parser thread's) is stored as the Service written as an object; the same again changes nothing; what the fast decoder does not take is still stored", () => {
  const svc = convertOne(service('ns', 'a', { type: 'NodePort', clusterIP: '10.96.0.1', ports: [{ name: 'http', port: 80, targetPort: 8080, nodePort: 30080 }], externalIPs: ['192.0.2.1'] }));
  const byObject = syncedStore([]);
  byObject.update((tx) => tx.setService(svc));
  const byBytes = syncedStore([]);
  byBytes.update((tx) => tx.setServiceBytes(toBinary(ServiceSchema, svc)));
  assert.deepEqual(byBytes.getService('ns/a')!.service, byObject.getService('ns/a')!.service);
  assert.deepEqual(byBytes.getService('ns/a')!.bytes, byObject.getService('ns/a')!.bytes);
  // the same, as bytes or as an object: no change
  const rev = byBytes.rev;
  byBytes.update((tx) => tx.setServiceBytes(toBinary(ServiceSchema, svc)));
  byBytes.update((tx) => tx.setService(svc));
  assert.equal(byBytes.rev, rev);
  // a field kpng does not know (number 99, a varint): fromBinary takes it, and the bytes are kept as they came
  const unknown = Buffer.concat([toBinary(ServiceSchema, { ...svc, Name: 'b' }), Buffer.from([0x98, 0x06, 0x01])]);
  byBytes.update((tx) => tx.setServiceBytes(unknown));
  assert.equal(byBytes.getService('ns/b')!.service.Name, 'b');
  assert.deepEqual(Buffer.from(byBytes.getService('ns/b')!.bytes), unknown);
  assert.equal(byBytes.rev, rev + 1);
});
