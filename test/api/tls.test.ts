// TLS and safe defaults, on both transports: with --tls-ca a client
// certificate signed by that CA is required (mTLS); a certificate from
// another CA, none at all, or plaintext are refused. A TCP listener on a
// non-loopback address refuses to start without TLS unless --insecure.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { create } from '@bufbuild/protobuf';
import { WatchReqSchema } from '../../src/api/gen/api/localv1/api_pb.js';
import { localWatchMethod } from '../../src/api/grpc/wire.js';
import { ApiServer } from '../../src/sinks/api/server.js';
import { ServiceViews } from '../../src/localstate/views.js';
import { TRANSPORTS, RawWatch, clientTLS, listenAddress, quiet, serverTLS, smallCluster, startServer, syncedStore, type TestServer, testResources } from './helpers.js';

const { dirs, cleanups } = testResources();

const req = create(WatchReqSchema, { NodeName: 'node-a' });

function watch(s: TestServer, tls: ReturnType<typeof clientTLS> | undefined) {
  const w = new RawWatch(s.address, localWatchMethod, req, { tls });
  cleanups.push(() => w.close());
  return w;
}

for (const t of TRANSPORTS) {
  test(`mTLS: a client certificate from the CA is accepted, others are refused (${t})`, async () => {
    const s = await startServer(syncedStore(smallCluster()), listenAddress(t, dirs), { tls: serverTLS(true) });
    cleanups.push(() => s.stop());

    const good = watch(s, clientTLS('client'));
    await good.waitSyncs(1);
    assert.equal(good.items[0].Op.case, 'Reset');

    for (const [what, tls] of [
      ['a certificate from another CA', clientTLS('other-client')],
      ['no client certificate', clientTLS('none')],
      ['plaintext', undefined],
    ] as const) {
      const bad = watch(s, tls);
      const err = await bad.waitError();
      assert.equal(bad.items.length, 0, `${what}: got ops`);
      assert.ok([14, 13].includes(err.code), `${what}: code ${err.code} ${err.message}`); // UNAVAILABLE (handshake), INTERNAL
    }
    // refused clients do not disturb the others
    const again = watch(s, clientTLS('client'));
    await again.waitSyncs(1);
    assert.equal(s.server.stats.diffs, 2);
  });

  test(`TLS without --tls-ca: server-authenticated only (${t})`, async () => {
    const s = await startServer(syncedStore(smallCluster()), listenAddress(t, dirs), { tls: serverTLS(false) });
    cleanups.push(() => s.stop());
    const w = watch(s, clientTLS('none'));
    await w.waitSyncs(1);
    const plain = watch(s, undefined);
    await plain.waitError();
    assert.equal(plain.items.length, 0);
  });
}

test('a non-loopback TCP listener needs TLS or --insecure', () => {
  const store = syncedStore([]);
  const views = new ServiceViews(store);
  const make = (listen: string, extra = {}) => new ApiServer({ store, views, log: quiet, listen, ...extra });
  for (const listen of ['tcp://0.0.0.0:12090', 'tcp://:12090', 'tcp://[::]:12090', 'tcp://192.0.2.1:12090', '10.0.0.1:12090', 'tcp://brain.example:12090']) {
    assert.throws(() => make(listen), /refusing to serve the API on .* without TLS/, listen);
    // allowed (not started: tests stay off non-loopback addresses)
    assert.doesNotThrow(() => make(listen, { insecure: true }));
    assert.doesNotThrow(() => make(listen, { tls: serverTLS(true) }));
  }
  for (const listen of ['tcp://127.0.0.1:0', 'tcp://[::1]:0', 'tcp://localhost:0', 'unix:///run/kpng/kpng.sock']) assert.doesNotThrow(() => make(listen), listen);
  assert.throws(() => make('tcp://127.0.0.1:0', { localApi: false, globalApi: false }), /both/);
});
