// Slow consumers, on both transports. A node that does not ask for its next
// diff gets nothing meanwhile, and when it asks it gets one diff: the net
// change, coalesced. A node that stops reading holds the brain at a bounded
// number of bytes written (HTTP/2 flow control + the stream window), and
// gets the rest when it reads again.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { create } from '@bufbuild/protobuf';
import { WatchReqSchema } from '../../src/api/gen/api/localv1/api_pb.js';
import { localWatchMethod } from '../../src/api/grpc/wire.js';
import { LocalDiff } from '../../src/diff/local-diff.js';
import { ServiceViews } from '../../src/localstate/views.js';
import { Store, KINDS } from '../../src/store/store.js';
import { convertObject } from '../../src/sources/objects.js';
import { applyObject } from '../../src/sources/apply.js';
import { TRANSPORTS, RawWatch, apply, diffsOf, listenAddress, opText, slice, smallCluster, startServer, svc, syncedStore, testResources } from './helpers.js';
import { until, sleep } from '../helpers/until.js';

const { dirs, cleanups } = testResources();

const req = create(WatchReqSchema, { NodeName: 'node-a' });

for (const t of TRANSPORTS) {
  test(`a node that does not ask gets nothing, then one coalesced diff (${t})`, async () => {
    const store = syncedStore(smallCluster());
    const s = await startServer(store, listenAddress(t, dirs));
    cleanups.push(() => s.stop());
    const w = new RawWatch(s.address, localWatchMethod, req); // asks only when told
    cleanups.push(() => w.close());
    await w.waitSyncs(1);
    // what the node should get: the in-process diff over the same changes
    const expected = new LocalDiff(store, new ServiceViews(store), 'node-a');
    expected.next();

    const sent = s.server.stats.messages;
    for (let i = 0; i < 500; i++) {
      apply(store, slice('ns', 'web-1', 'web', [{ ip: `10.1.${(i >> 8) & 255}.${i & 255}`, node: 'node-a', pod: 'web-a' }, { ip: '10.1.0.2', node: 'node-b', pod: 'web-b' }]));
      if (i % 50 === 0) apply(store, svc('ns', `s${i}`, `10.96.1.${i % 250}`));
      if (i % 100 === 0) await sleep(1); // let the server run: it must still not send
    }
    await sleep(100);
    assert.equal(s.server.stats.messages, sent, 'nothing is sent before the node asks');
    assert.equal(w.syncs, 1);

    w.request();
    await w.waitSyncs(2);
    await sleep(50);
    assert.equal(diffsOf(w.items).length, 2, 'exactly one diff');
    assert.deepEqual(diffsOf(w.items)[1], expected.next().map(opText));
    assert.equal(diffsOf(w.items)[1].filter((o) => o.includes('ns/web/web-a')).length, 1, 'one Set for 500 changes of web-a');
  });

  test(`a node that stops reading holds the brain at a bounded number of bytes (${t})`, async () => {
    // about 3 MB of node-local state
    const store = new Store();
    store.update((tx) => {
      KINDS.forEach((k) => tx.setSynced(k));
      for (let i = 0; i < 4000; i++) {
        const ns = `ns${i % 20}`;
        const eps = [0, 1, 2].map((j) => ({ ip: `10.${(i >> 8) & 255}.${i & 255}.${j + 1}`, node: j === 0 ? 'node-a' : 'node-b', pod: `p${i}-${j}` }));
        for (const o of [svc(ns, `s${i}`, `10.96.${(i >> 8) & 255}.${i & 255}`), slice(ns, `s${i}-1`, `s${i}`, eps)]) {
          const c = convertObject(o);
          if (c.kind !== 'Ignored') applyObject(tx, c);
        }
      }
    });
    const s = await startServer(store, listenAddress(t, dirs));
    cleanups.push(() => s.stop());
    const w = new RawWatch(s.address, localWatchMethod, req);
    cleanups.push(() => w.close());
    w.pause();
    await until('the server to start writing', () => s.server.stats.bytes > 0);
    await sleep(300);
    const held = s.server.stats.bytes;
    await sleep(200);
    assert.equal(s.server.stats.bytes, held, 'the brain stopped writing');
    assert.ok(held < 1024 * 1024, `bytes written while the node does not read: ${held}`);

    // changes meanwhile are not queued as more writes
    for (let i = 0; i < 200; i++) apply(store, svc('ns0', `s0`, `10.96.0.${i + 1}`));
    await sleep(50);
    assert.equal(s.server.stats.bytes, held);

    w.resume();
    await w.waitSyncs(1, 20_000);
    const total = s.server.stats.bytes;
    assert.ok(total > 3 * held, `the full state (${total} bytes) is much more than what was held (${held})`);
    assert.equal(w.items.length, 1 + 4000 + 12000 + 1);
    // the changes made meanwhile come as the next diff, once asked
    w.request();
    await w.waitSyncs(2);
    assert.deepEqual(diffsOf(w.items)[1], ['set ServicesSet ns0/s0', 'sync']);
  });
}
