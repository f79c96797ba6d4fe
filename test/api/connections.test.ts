// to-api's connections, on both transports: a connection that does not
// complete the HTTP/2 handshake in time (with TLS: the TLS handshake, then
// the HTTP/2 preface) is closed; at --max-connections new connections are
// refused and counted, and a real node gets in once the idle ones are gone;
// a connection that completed the handshake but opens no call is closed
// after the idle time.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import tls from 'node:tls';
import http2 from 'node:http2';
import { readFileSync } from 'node:fs';
import { registry } from '../../src/runtime/metrics.js';
import { apiMetrics } from '../../src/sinks/api/metrics.js';
import { parseAddress } from '../../src/api/grpc/address.js';
import { defaultMaxConnections, openFileLimit } from '../../src/sinks/api/listener.js';
import { watchLocalApi, QuietResyncSink } from '../../src/sinks/local/remote.js';
import type { LocalOp } from '../../src/diff/ops.js';
import { TRANSPORTS, clientTLS, listenAddress, quiet, serverTLS, smallCluster, startServer, syncedStore, type TestServer, testResources } from './helpers.js';
import { until, sleep } from '../helpers/until.js';

const { dirs, cleanups } = testResources();

async function server(t: (typeof TRANSPORTS)[number], extra: Parameters<typeof startServer>[2]): Promise<TestServer> {
  const s = await startServer(syncedStore(smallCluster()), listenAddress(t, dirs), extra);
  cleanups.push(() => s.stop());
  return s;
}

/** A plain connection to the server's address, and when it was closed (ms after it connected). */
function rawConnection(address: string, connect: (a: ReturnType<typeof parseAddress>) => net.Socket = plainConnect) {
  const sock = connect(parseAddress(address));
  cleanups.push(() => sock.destroy());
  let connectedAt = 0;
  const closed = new Promise<number>((resolve) => {
    sock.on('error', () => {});
    sock.resume(); // read (and drop) what the server sends, so that its close is seen
    sock.once('close', () => resolve(performance.now() - connectedAt));
  });
  const connected = new Promise<void>((resolve) => sock.once(sock instanceof tls.TLSSocket ? 'secureConnect' : 'connect', () => ((connectedAt = performance.now()), resolve())));
  return { sock, connected, closed, isOpen: () => !sock.destroyed };
}

function plainConnect(a: ReturnType<typeof parseAddress>): net.Socket {
  return a.kind === 'unix' ? net.connect(a.path) : net.connect(a.port, a.host);
}

function tlsConnect(a: ReturnType<typeof parseAddress>): net.Socket {
  const c = clientTLS('client');
  return tls.connect({
    ...(a.kind === 'unix' ? { path: a.path } : { host: a.host, port: a.port }),
    servername: 'localhost',
    ca: readFileSync(c.ca!),
    cert: readFileSync(c.cert!),
    key: readFileSync(c.key!),
    ALPNProtocols: ['h2'],
  });
}

/** An HTTP/2 client that does the handshake (preface, SETTINGS) and opens no stream. */
function http2Session(address: string) {
  const a = parseAddress(address);
  const session = http2.connect(a.kind === 'unix' ? 'http://localhost' : `http://127.0.0.1:${a.port}`, a.kind === 'unix' ? { createConnection: () => net.connect(a.path) } : {});
  session.on('error', () => {});
  cleanups.push(() => session.destroy());
  const t0 = performance.now();
  const closed = new Promise<number>((resolve) => session.once('close', () => resolve(performance.now() - t0)));
  return { session, closed };
}

async function rejected(reason: string): Promise<number> {
  return (await apiMetrics.apiConnectionsRejected.get()).values.find((v) => v.labels.reason === reason)?.value ?? 0;
}

async function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([p, new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms)))]);
  } finally {
    clearTimeout(timer);
  }
}

class Backend {
  syncs = 0;
  send(op: LocalOp) {
    if (op.kind === 'sync') this.syncs++;
  }
}

for (const t of TRANSPORTS) {
  test(`a connection that sends nothing is closed after the handshake timeout; one that did the HTTP/2 handshake is not (${t})`, async () => {
    const s = await server(t, { handshakeTimeoutMs: 300 });
    const timedOut0 = await rejected('handshake_timeout');
    const h2 = http2Session(s.address);
    const idle = rawConnection(s.address);
    await idle.connected;
    const ms = await within(idle.closed, 3000, 'the server to close the idle connection');
    assert.ok(ms >= 250 && ms < 1300, `closed after ${Math.round(ms)} ms`);
    assert.equal(await rejected('handshake_timeout'), timedOut0 + 1);
    await sleep(200);
    assert.equal(h2.session.closed, false, 'the HTTP/2 client is still connected');
  });

  test(`at --max-connections new connections are refused and counted; a node gets in once the idle ones are closed (${t})`, async () => {
    const s = await server(t, { maxConnections: 20, handshakeTimeoutMs: 500 });
    const refused0 = await rejected('max_connections');
    const idle = Array.from({ length: 20 }, () => rawConnection(s.address));
    await Promise.all(idle.map((c) => c.connected));
    await until('20 open connections', () => (s.server.connections ?? 20) === 20);
    await sleep(50);
    const extra = rawConnection(s.address);
    await within(extra.closed, 2000, 'the 21st connection to be refused');
    assert.equal(await rejected('max_connections'), refused0 + 1);

    const t0 = performance.now();
    const backend = new Backend();
    const ac = new AbortController();
    const done = watchLocalApi({ address: s.address, log: quiet, signal: ac.signal, minBackoffMs: 50, maxBackoffMs: 200 }, 'node-a', [], new QuietResyncSink(backend));
    cleanups.push(async () => (ac.abort(), await done));
    await until('the node served', () => backend.syncs === 1, { timeoutMs: 5000 });
    const ms = performance.now() - t0;
    // refused while the idle ones hold every slot, served after their timeout plus a retry
    assert.ok(ms < 500 + 2000, `served after ${Math.round(ms)} ms`);
    for (const c of idle) assert.equal(c.isOpen(), false, 'every idle connection closed');
    assert.ok((await rejected('max_connections')) > refused0 + 1, 'the node was refused at first');
    assert.equal(s.server.connections, 1);
  });

  test(`with mTLS: no ClientHello, or TLS without the HTTP/2 preface, is closed in time; a node is served (${t})`, async () => {
    const s = await server(t, { handshakeTimeoutMs: 300, tls: serverTLS(true) });
    const noHello = rawConnection(s.address);
    const noPreface = rawConnection(s.address, tlsConnect);
    await noHello.connected;
    const ms1 = await within(noHello.closed, 3000, 'a connection without a ClientHello to be closed');
    assert.ok(ms1 >= 250 && ms1 < 1300, `no ClientHello: closed after ${Math.round(ms1)} ms`);
    await within(noPreface.connected, 2000, 'the TLS handshake');
    const ms2 = await within(noPreface.closed, 3000, 'a TLS connection without the preface to be closed');
    assert.ok(ms2 >= 250 && ms2 < 1300, `no preface: closed ${Math.round(ms2)} ms after the TLS handshake`);

    const backend = new Backend();
    const ac = new AbortController();
    const done = watchLocalApi({ address: s.address, tls: clientTLS('client'), log: quiet, signal: ac.signal }, 'node-a', [], new QuietResyncSink(backend));
    cleanups.push(async () => (ac.abort(), await done));
    await until('the node served over mTLS', () => backend.syncs === 1, { timeoutMs: 5000 });
    await sleep(500);
    assert.equal(s.server.connections, 1, 'the node stays connected past the handshake timeout');
  });

  test(`a connection that did the HTTP/2 handshake but opens no call is closed after the idle time (${t})`, async () => {
    const s = await server(t, { connectionIdleMs: 300 });
    const h2 = http2Session(s.address);
    const ms = await within(h2.closed, 3000, 'the server to close the connection without calls');
    assert.ok(ms >= 250, `closed after ${Math.round(ms)} ms`);
    assert.equal(s.server.connections, 0);
  });
}

test('the default cap leaves file descriptors to the rest of kpng', () => {
  assert.equal(defaultMaxConnections(undefined), 10_000);
  assert.equal(defaultMaxConnections(1_048_576), 10_000);
  assert.equal(defaultMaxConnections(1024), 1024 - 256);
  assert.equal(defaultMaxConnections(300), 150);
  const limit = openFileLimit();
  assert.ok(limit === undefined || limit > 0);
});

test('the connection metrics are registered', async () => {
  const text = await registry.metrics();
  assert.match(text, /^# TYPE kpng_api_connections gauge$/m);
  assert.match(text, /^# TYPE kpng_api_connections_rejected_total counter$/m);
});
