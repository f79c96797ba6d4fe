// /localv1.Sets/Watch on both transports: the exact op sequence (golden) for
// a small cluster and changes, values equal to the in-process diff, extra
// sets only when asked, and nodes that appear, disappear or were never seen.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { create } from '@bufbuild/protobuf';
import { WatchReqSchema, type WatchReq } from '../../src/api/gen/api/localv1/api_pb.js';
import { LocalSet, decodeEndpoint, decodeLocalNode } from '../../src/api/model.js';
import { localWatchMethod } from '../../src/api/grpc/wire.js';
import { LocalDiff } from '../../src/diff/local-diff.js';
import { ServiceViews } from '../../src/localstate/views.js';
import { TRANSPORTS, TempDirs, RawWatch, apply, remove, diffsOf, listenAddress, node, slice, smallCluster, startServer, svc, syncedStore, type TestServer } from './helpers.js';
import { sleep } from '../helpers/until.js';

const dirs = new TempDirs();
const open: { close(): void }[] = [];
const servers: TestServer[] = [];
after(async () => {
  open.forEach((w) => w.close());
  await Promise.all(servers.map((s) => s.stop()));
  dirs.cleanup();
});

const req = (NodeName: string, Sets: LocalSet[] = []): WatchReq => create(WatchReqSchema, { NodeName, Sets });
const HASH = /^(ns\/[a-z]+)\/[0-9a-f]{16}$/;
/** anonymous endpoint paths end with an opaque hash */
const norm = (d: string[]) => d.map((s) => s.replace(/ (ns\/[a-z]+)\/[0-9a-f]{16}$/, ' $1/<hash>'));

for (const t of TRANSPORTS) {
  test(`golden op sequence for a small cluster and two changes (${t})`, async () => {
    const store = syncedStore(smallCluster());
    const s = await startServer(store, listenAddress(t, dirs));
    servers.push(s);
    const w = new RawWatch(s.address, localWatchMethod, req('node-a'), { autoRequest: true });
    open.push(w);
    await w.waitSyncs(1);
    assert.deepEqual(norm(diffsOf(w.items)[0]), [
      'reset',
      'set ServicesSet ns/db',
      'set ServicesSet ns/web',
      'set EndpointsSet ns/web/web-a',
      'set EndpointsSet ns/web/web-b',
      'set EndpointsSet ns/db/<hash>',
      'sync',
    ]);
    const oldAnon = diffsOf(w.items)[0][5].split(' ')[2];

    // one store update: a pod replaced, an anonymous endpoint moved, a service added
    apply(
      store,
      slice('ns', 'web-1', 'web', [{ ip: '10.1.0.1', node: 'node-a', pod: 'web-a' }, { ip: '10.1.0.3', node: 'node-b', pod: 'web-c' }]),
      slice('ns', 'db-1', 'db', [{ ip: '10.1.0.8', node: 'node-b' }]),
      svc('ns', 'api', '10.96.0.30'),
    );
    await w.waitSyncs(2);
    const d2 = diffsOf(w.items)[1];
    // kpng's order: service Sets, anonymous Deletes, named Sets, named Deletes, anonymous Sets, service Deletes
    assert.deepEqual(norm(d2), [
      'set ServicesSet ns/api',
      'delete EndpointsSet ns/db/<hash>',
      'set EndpointsSet ns/web/web-c',
      'delete EndpointsSet ns/web/web-b',
      'set EndpointsSet ns/db/<hash>',
      'sync',
    ]);
    assert.equal(d2[1].split(' ')[2], oldAnon);
    assert.notEqual(d2[4].split(' ')[2], oldAnon);

    remove(store, svc('ns', 'web', '10.96.0.10'), slice('ns', 'web-1', 'web', []));
    await w.waitSyncs(3);
    assert.deepEqual(diffsOf(w.items)[2], [
      'delete EndpointsSet ns/web/web-c',
      'delete EndpointsSet ns/web/web-a',
      'delete ServicesSet ns/web',
      'sync',
    ]);

    // a change this node does not see in its view sends nothing (no empty Sync)
    apply(store, node('node-b', 'z9'));
    await sleep(100);
    assert.equal(w.syncs, 3);
    assert.ok(!w.error);
  });

  test(`values on the wire are the in-process diff's, byte for byte (${t})`, async () => {
    const store = syncedStore(smallCluster());
    const s = await startServer(store, listenAddress(t, dirs));
    servers.push(s);
    const w = new RawWatch(s.address, localWatchMethod, req('node-b'), { autoRequest: true });
    open.push(w);
    await w.waitSyncs(1);
    const local = new LocalDiff(store, new ServiceViews(store), 'node-b').next();
    assert.equal(w.items.length, local.length);
    w.items.forEach((item, i) => {
      const op = local[i];
      if (op.kind === 'set') {
        assert.equal(item.Op.case, 'Set');
        if (item.Op.case !== 'Set') return;
        assert.equal(item.Op.value.Ref!.Path, op.path);
        assert.deepEqual(new Uint8Array(item.Op.value.Bytes), new Uint8Array(op.bytes));
      } else assert.equal(item.Op.case?.toLowerCase(), op.kind);
    });
    const webB = w.items.find((i) => i.Op.case === 'Set' && i.Op.value.Ref!.Path === 'ns/web/web-b');
    assert.ok(webB && webB.Op.case === 'Set');
    assert.equal(decodeEndpoint(webB.Op.value.Bytes).Local, true);
  });

  test(`extra sets only for a client that asked (WatchReq.Sets) (${t})`, async () => {
    const store = syncedStore(smallCluster());
    const s = await startServer(store, listenAddress(t, dirs));
    servers.push(s);
    const plain = new RawWatch(s.address, localWatchMethod, req('node-a'), { autoRequest: true });
    const asking = new RawWatch(s.address, localWatchMethod, req('node-a', [LocalSet.NodesSet]), { autoRequest: true });
    open.push(plain, asking);
    await plain.waitSyncs(1);
    await asking.waitSyncs(1);
    assert.ok(!diffsOf(plain.items)[0].some((o) => o.includes('NodesSet')));
    assert.deepEqual(diffsOf(asking.items)[0].slice(0, 2), ['reset', 'set NodesSet node-a']);
  });

  test(`a node that appears and disappears; a node never seen gets a valid stream (${t})`, async () => {
    const store = syncedStore([
      node('node-a', 'z1'),
      svc('ns', 'hinted', '10.96.0.40'),
      slice('ns', 'hinted-1', 'hinted', [
        { ip: '10.2.0.1', node: 'node-a', pod: 'h-a', zoneHints: ['z1'] },
        { ip: '10.2.0.2', node: 'node-b', pod: 'h-b', zoneHints: ['z2'] },
      ]),
    ]);
    const s = await startServer(store, listenAddress(t, dirs));
    servers.push(s);
    const w = new RawWatch(s.address, localWatchMethod, req('node-c', [LocalSet.NodesSet]), { autoRequest: true });
    open.push(w);
    await w.waitSyncs(1);
    // unknown node: no zone, so zone hints are ignored and both endpoints are used
    assert.deepEqual(diffsOf(w.items)[0], ['reset', 'set ServicesSet ns/hinted', 'set EndpointsSet ns/hinted/h-a', 'set EndpointsSet ns/hinted/h-b', 'sync']);

    apply(store, node('node-c', 'z2'));
    await w.waitSyncs(2);
    assert.deepEqual(diffsOf(w.items)[1], ['set NodesSet node-c', 'delete EndpointsSet ns/hinted/h-a', 'sync']);
    const set = w.items.find((i) => i.Op.case === 'Set' && i.Op.value.Ref!.Set === LocalSet.NodesSet);
    assert.ok(set && set.Op.case === 'Set');
    assert.equal(decodeLocalNode(set.Op.value.Bytes).Zone, 'z2');

    remove(store, node('node-c', 'z2'));
    await w.waitSyncs(3);
    assert.deepEqual(diffsOf(w.items)[2], ['set EndpointsSet ns/hinted/h-a', 'delete NodesSet node-c', 'sync']);
    assert.ok(!w.error);
  });
}

test('a stream whose node name changes starts over with Reset', async () => {
  const store = syncedStore(smallCluster());
  const s = await startServer(store, listenAddress('tcp', dirs));
  servers.push(s);
  const w = new RawWatch(s.address, localWatchMethod, req('node-a'));
  open.push(w);
  await w.waitSyncs(1);
  (w as unknown as { req: WatchReq }).req = req('node-b');
  w.request();
  await w.waitSyncs(2);
  const d = diffsOf(w.items)[1];
  assert.equal(d[0], 'reset');
  assert.ok(d.includes('set EndpointsSet ns/web/web-b'));
  assert.match(d.find((x) => x.includes('ns/db/'))!.split(' ')[2], HASH);
});
