// kpng's gRPC streaming server on node:http2 (src/api/grpc/h2-server.ts),
// against grpc-js's client and raw HTTP/2: messages split or joined across
// DATA frames, compressed requests, statuses (trailers-only and after
// messages, percent-encoded), unknown methods, HTTP errors, request size,
// keepalive (a peer that stops answering pings is closed), GOAWAY on close,
// and to-api ending a stream whose request it cannot decode.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import http2 from 'node:http2';
import zlib from 'node:zlib';
import * as grpc from '@grpc/grpc-js';
import { create } from '@bufbuild/protobuf';
import { GrpcStatus, grpcFrames, StreamServer, type ServerCall, type StreamServerOptions } from '../../src/api/grpc/h2-server.js';
import { WatchReqSchema } from '../../src/api/gen/api/localv1/api_pb.js';
import { localWatchMethod } from '../../src/api/grpc/wire.js';
import { RawWatch, smallCluster, startServer, syncedStore } from './helpers.js';

const cleanups: (() => unknown)[] = [];
after(async () => {
  for (const c of cleanups.reverse()) await c();
});

/** Echo: every request message back, a trailing status on 'end' (or on the request "fail"). */
function echo(call: ServerCall) {
  call.listen({
    message: (b) => {
      if (b.toString() === 'fail') return call.end(GrpcStatus.INVALID_ARGUMENT, 'asked to fail: ünïcode %');
      call.write(grpcFrames([b, Buffer.from(`#${call.header('x-tag') ?? ''}`)]), () => {});
    },
    end: () => call.end(),
    close: () => {},
  });
}

async function serve(opts: Partial<StreamServerOptions> = {}) {
  const server = new StreamServer(new Map([['/test.Echo/Watch', echo]]), { keepaliveMs: 0, keepaliveTimeoutMs: 1000, idleMs: 60_000, ...opts });
  const listener = net.createServer((s) => server.injectConnection(s));
  await new Promise<void>((r) => listener.listen(0, '127.0.0.1', r));
  const port = (listener.address() as net.AddressInfo).port;
  const stop = async () => {
    await server.close(200);
    await new Promise((r) => listener.close(r));
  };
  cleanups.push(stop);
  return { server, port, stop };
}

const identity = (b: Buffer) => b;

function grpcClient(port: number, options: grpc.ChannelOptions = {}) {
  const Client = grpc.makeGenericClientConstructor(
    { Watch: { path: '/test.Echo/Watch', requestStream: true, responseStream: true, requestSerialize: identity, requestDeserialize: identity, responseSerialize: identity, responseDeserialize: identity } },
    'Echo',
  );
  const c = new Client(`127.0.0.1:${port}`, grpc.credentials.createInsecure(), options) as unknown as grpc.Client & { Watch(md?: grpc.Metadata): grpc.ClientDuplexStream<Buffer, Buffer> };
  cleanups.push(() => c.close());
  return c;
}

function collect(call: grpc.ClientDuplexStream<Buffer, Buffer>) {
  const messages: string[] = [];
  call.on('data', (b: Buffer) => messages.push(b.toString()));
  const status = new Promise<grpc.StatusObject>((resolve) => call.on('status', resolve));
  call.on('error', () => {});
  return { messages, status };
}

/** A raw HTTP/2 call: DATA chunks received, and the response's headers and trailers. */
function rawCall(port: number, headers: http2.OutgoingHttpHeaders) {
  const session = http2.connect(`http://127.0.0.1:${port}`);
  session.on('error', () => {});
  cleanups.push(() => session.destroy());
  const stream = session.request({ ':method': 'POST', ':path': '/test.Echo/Watch', 'content-type': 'application/grpc', te: 'trailers', ...headers }, { endStream: false });
  const chunks: Buffer[] = [];
  const response = new Promise<http2.IncomingHttpHeaders>((r) => stream.once('response', r));
  const trailers = new Promise<http2.IncomingHttpHeaders>((r) => stream.once('trailers', r));
  const closed = new Promise<void>((r) => stream.once('close', r));
  stream.on('data', (d: Buffer) => chunks.push(d));
  stream.on('error', () => {});
  return { session, stream, chunks, response, trailers, closed };
}

test('grpc-js client: messages both ways, metadata, OK status at the end', async () => {
  const { port } = await serve();
  const md = new grpc.Metadata();
  md.set('x-tag', 'a');
  const call = grpcClient(port).Watch(md);
  const got = collect(call);
  call.write(Buffer.from('one'));
  call.write(Buffer.from('two'));
  call.end();
  const status = await got.status;
  assert.equal(status.code, grpc.status.OK);
  assert.deepEqual(got.messages, ['one', '#a', 'two', '#a']);
});

test('an error status after messages, and before any (trailers-only), percent-encoded', async () => {
  const { port } = await serve();
  const c = grpcClient(port);
  const late = c.Watch();
  const got = collect(late);
  late.write(Buffer.from('x'));
  late.write(Buffer.from('fail'));
  const s1 = await got.status;
  assert.equal(s1.code, grpc.status.INVALID_ARGUMENT);
  assert.equal(s1.details, 'asked to fail: ünïcode %');
  assert.deepEqual(got.messages, ['x', '#']);

  const raw = rawCall(port, {});
  raw.stream.write(grpcFrames([Buffer.from('fail')]));
  const h = await raw.response;
  assert.equal(h[':status'], 200);
  assert.equal(h['grpc-status'], String(GrpcStatus.INVALID_ARGUMENT)); // in the headers: trailers-only
  assert.equal(decodeURIComponent(String(h['grpc-message'])), 'asked to fail: ünïcode %');
});

test('raw HTTP/2: requests split across DATA frames and joined in one are each delivered; one write is one chunk', async () => {
  const { port } = await serve();
  const raw = rawCall(port, { 'x-tag': 't' });
  const both = grpcFrames([Buffer.from('first'), Buffer.from('second')]);
  // a byte at a time for the first message, the rest joined with the next
  const cut = 5 + 'first'.length;
  for (let i = 0; i < cut; i++) {
    raw.stream.write(both.subarray(i, i + 1));
    await new Promise((r) => setImmediate(r));
  }
  raw.stream.write(Buffer.concat([both.subarray(cut), grpcFrames([Buffer.from('third')])]));
  raw.stream.end();
  await raw.trailers;
  const all = Buffer.concat(raw.chunks);
  const messages: string[] = [];
  for (let o = 0; o < all.length; ) {
    const n = all.readUInt32BE(o + 1);
    messages.push(all.subarray(o + 5, o + 5 + n).toString());
    o += 5 + n;
  }
  assert.deepEqual(messages, ['first', '#t', 'second', '#t', 'third', '#t']);
  // each answer (two messages) was written at once
  assert.equal(raw.chunks.length <= 3, true, `answers came in ${raw.chunks.length} chunks`);
});

test('compressed requests: gzip and deflate accepted, an unknown encoding is UNIMPLEMENTED', async () => {
  const { port } = await serve();
  for (const [encoding, zip] of [['gzip', zlib.gzipSync], ['deflate', zlib.deflateSync]] as const) {
    const raw = rawCall(port, { 'grpc-encoding': encoding });
    const body = zip(Buffer.from(`hello ${encoding}`));
    const frame = Buffer.alloc(5 + body.length);
    frame[0] = 1;
    frame.writeUInt32BE(body.length, 1);
    body.copy(frame, 5);
    raw.stream.end(frame);
    const t = await raw.trailers;
    assert.equal(t['grpc-status'], '0');
    assert.equal(Buffer.concat(raw.chunks).subarray(5, 5 + 6 + encoding.length).toString(), `hello ${encoding}`);
  }
  const raw = rawCall(port, { 'grpc-encoding': 'snappy' });
  raw.stream.write(Buffer.from([1, 0, 0, 0, 1, 0]));
  const h = await raw.response;
  assert.equal(h['grpc-status'], String(GrpcStatus.UNIMPLEMENTED));
});

test('a request over the size limit ends the call with RESOURCE_EXHAUSTED, before its bytes arrive', async () => {
  const { port } = await serve({ maxMessageBytes: 1024 });
  const raw = rawCall(port, {});
  raw.stream.write(Buffer.from([0, 0, 0x10, 0, 0])); // announces 1 MiB, sends none of it
  const h = await raw.response;
  assert.equal(h['grpc-status'], String(GrpcStatus.RESOURCE_EXHAUSTED));
});

test('an unknown method is UNIMPLEMENTED; not POST is 405; not application/grpc is 415', async () => {
  const { port } = await serve();
  const unknown = rawCall(port, { ':path': '/test.Echo/Nope' });
  assert.equal((await unknown.response)['grpc-status'], String(GrpcStatus.UNIMPLEMENTED));
  const get = rawCall(port, { ':method': 'GET' });
  assert.equal((await get.response)[':status'], 405);
  const json = rawCall(port, { 'content-type': 'application/json' });
  assert.equal((await json.response)[':status'], 415);
});

test('keepalive: a peer that answers pings stays; one that does not is closed', async () => {
  const { port } = await serve({ keepaliveMs: 100, keepaliveTimeoutMs: 100 });
  // node's HTTP/2 client answers pings itself
  const healthy = rawCall(port, {});
  healthy.stream.write(grpcFrames([Buffer.from('hi')]));
  await healthy.response;
  // a peer that did the HTTP/2 handshake and then went silent
  const mute = net.connect(port, '127.0.0.1');
  cleanups.push(() => mute.destroy());
  mute.on('error', () => {});
  mute.resume();
  const muteClosed = new Promise<number>((r) => mute.once('close', () => r(performance.now())));
  await new Promise<void>((r) => mute.once('connect', r));
  const t0 = performance.now();
  const settings = Buffer.from([0, 0, 0, 4, 0, 0, 0, 0, 0]);
  const settingsAck = Buffer.from([0, 0, 0, 4, 1, 0, 0, 0, 0]);
  mute.write(Buffer.concat([Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n'), settings, settingsAck]));
  const closedAt = await Promise.race([muteClosed, new Promise<number>((r) => setTimeout(() => r(-1), 3000))]);
  assert.notEqual(closedAt, -1, 'a peer that never answers a ping was not closed within 3 s');
  assert.ok(closedAt - t0 >= 150, `closed after ${closedAt - t0} ms, before a ping could time out`);
  assert.equal(healthy.session.closed || healthy.session.destroyed, false, 'the healthy peer was closed');
});

test('close: GOAWAY to every connection; a call still open is ended with the connection', async () => {
  const { port, stop } = await serve();
  const raw = rawCall(port, {});
  raw.stream.write(grpcFrames([Buffer.from('hi')]));
  await raw.response;
  const goaway = new Promise<void>((r) => raw.session.once('goaway', () => r()));
  const t0 = performance.now();
  await stop();
  await goaway;
  await raw.closed;
  assert.ok(performance.now() - t0 < 2000);
});

test('a big request in many small DATA frames is delivered whole, once', async () => {
  const { port } = await serve();
  const raw = rawCall(port, {});
  const big = Buffer.alloc(200 * 1024, 7);
  const framed = grpcFrames([big]);
  for (let o = 0; o < framed.length; o += 1024) raw.stream.write(framed.subarray(o, o + 1024));
  raw.stream.end();
  await raw.trailers;
  const all = Buffer.concat(raw.chunks);
  assert.equal(all.readUInt32BE(1), big.length);
  assert.ok(all.subarray(5, 5 + big.length).equals(big));
  assert.equal(all.length, 5 + big.length + 5 + 1, 'the message and its "#" answer, nothing else');
});

test('to-api: an undecodable WatchReq ends that stream with INVALID_ARGUMENT; the next node is served', async () => {
  const s = await startServer(syncedStore(smallCluster()), 'tcp://127.0.0.1:0');
  cleanups.push(() => s.stop());
  const port = Number(s.address.split(':').pop());
  const bad = rawCall(port, { ':path': '/localv1.Sets/Watch' });
  bad.stream.write(grpcFrames([Buffer.from([0x0a, 0x7f, 0x01])])); // NodeName: 127 bytes announced, 1 given
  const t = await Promise.race([bad.trailers, bad.response]);
  assert.equal(t['grpc-status'], String(GrpcStatus.INVALID_ARGUMENT));
  const good = new RawWatch(s.address, localWatchMethod, create(WatchReqSchema, { NodeName: 'node-a' }));
  cleanups.push(() => good.close());
  await good.waitSyncs(1);
  assert.ok(good.items.length > 2, 'a full state');
});
