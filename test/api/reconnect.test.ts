// kpng local across reconnects, on both transports: the server goes away (or
// the stream is dropped), something changes meanwhile, the client comes
// back by itself, and the backend sees exactly that change: no Reset, no
// resent values, no flush and refill, and no empty Sync when nothing changed.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { watchLocalApi, QuietResyncSink } from '../../src/sinks/local/remote.js';
import { TRANSPORTS, RecordingBackend, apply, listenAddress, quiet, slice, smallCluster, startServer, syncedStore, type TestServer, testResources } from './helpers.js';
import { until, sleep } from '../helpers/until.js';

const { dirs, cleanups } = testResources();


function startClient(address: string, backend: RecordingBackend) {
  const ac = new AbortController();
  const done = watchLocalApi({ address, log: quiet, signal: ac.signal, minBackoffMs: 20, maxBackoffMs: 200 }, 'node-a', [], new QuietResyncSink(backend));
  const stop = async () => (ac.abort(), await done);
  cleanups.push(stop);
  return stop;
}

for (const t of TRANSPORTS) {
  test(`server restart: the backend sees only what changed meanwhile (${t})`, async () => {
    const store = syncedStore(smallCluster());
    let s: TestServer = await startServer(store, listenAddress(t, dirs));
    const address = s.address;
    cleanups.push(() => s.stop());
    const backend = new RecordingBackend();
    startClient(address, backend);
    await until('the first sync', () => backend.syncs === 1);
    const initial = backend.take();
    assert.equal(initial[0], 'reset');
    assert.equal(initial.length, 7);

    // the brain dies; web-b moves to a new IP while it is down; the brain comes back
    await s.stop();
    await sleep(50);
    apply(store, slice('ns', 'web-1', 'web', [{ ip: '10.1.0.1', node: 'node-a', pod: 'web-a' }, { ip: '10.1.0.22', node: 'node-b', pod: 'web-b' }]));
    s = await startServer(store, address);
    await until('the sync after the reconnect', () => backend.syncs === 2, { timeoutMs: 10_000 });
    assert.deepEqual(backend.take(), ['set EndpointsSet ns/web/web-b', 'sync']);

    // again with nothing changed meanwhile: the backend hears nothing at all
    await s.stop();
    s = await startServer(store, address);
    await until('a new stream', () => s.server.stats.diffs === 1, { timeoutMs: 10_000 });
    await sleep(100);
    assert.deepEqual(backend.take(), []);

    // and the stream still works afterwards
    apply(store, slice('ns', 'web-1', 'web', [{ ip: '10.1.0.1', node: 'node-a', pod: 'web-a' }]));
    await until('a normal diff', () => backend.syncs === 3);
    assert.deepEqual(backend.take(), ['delete EndpointsSet ns/web/web-b', 'sync']);
  });

  test(`dropped stream: a service deleted meanwhile is deleted, nothing else (${t})`, async () => {
    const store = syncedStore(smallCluster());
    const s = await startServer(store, listenAddress(t, dirs));
    cleanups.push(() => s.stop());
    const backend = new RecordingBackend();
    startClient(s.address, backend);
    await until('the first sync', () => backend.syncs === 1);
    backend.take();
    s.server.dropStreams();
    store.update((tx) => {
      tx.deleteService('ns', 'db');
      tx.deleteSlice('ns', 'db-1');
    });
    await until('the sync after the reconnect', () => backend.syncs === 2, { timeoutMs: 10_000 });
    const ops = backend.take();
    // endpoints before their service, as kpng orders deletes
    assert.equal(ops.length, 3);
    assert.match(ops[0], /^delete EndpointsSet ns\/db\/[0-9a-f]{16}$/);
    assert.deepEqual(ops.slice(1), ['delete ServicesSet ns/db', 'sync']);
    assert.ok(s.server.stats.streams >= 1);
  });
}
