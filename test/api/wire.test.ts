// The hand-made OpItem encoding is protobuf's, and addresses parse as documented.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { create, toBinary } from '@bufbuild/protobuf';
import * as L from '../../src/api/gen/api/localv1/api_pb.js';
import { LocalSet } from '../../src/api/model.js';
import { encodeDeleteOp, encodeResumeOp, encodeSetOp, RESET_FRAME, setOpFrame, SYNC_FRAME, LOCAL_WATCH_PATH, GLOBAL_WATCH_PATH } from '../../src/api/grpc/wire.js';
import { isLoopback, parseAddress, formatAddress, grpcTarget } from '../../src/api/grpc/address.js';

const ref = (set: number, path: string) => create(L.RefSchema, { Set: set, Path: path });

test('method paths are kpng\'s', () => {
  assert.equal(LOCAL_WATCH_PATH, '/localv1.Sets/Watch');
  assert.equal(GLOBAL_WATCH_PATH, '/globalv1.Sets/Watch');
});

test('Set, Delete, Sync and Reset encode exactly as toBinary(OpItem)', () => {
  const paths = ['', 'ns/svc', 'ns/svc/pod-1', 'ns|svc|slice|1f2e3d', 'é/ü/' + 'x'.repeat(300)];
  const values = [new Uint8Array(0), new Uint8Array([1, 2, 3]), new Uint8Array(200).fill(7), new Uint8Array(20000).fill(9)];
  for (const set of [LocalSet.ServicesSet, LocalSet.EndpointsSet, LocalSet.GlobalEndpointInfos, LocalSet.UnknownSet, 300]) {
    for (const path of paths) {
      for (const bytes of values) {
        const want = toBinary(L.OpItemSchema, create(L.OpItemSchema, { Op: { case: 'Set', value: create(L.ValueSchema, { Ref: ref(set, path), Bytes: bytes }) } }));
        assert.deepEqual(new Uint8Array(encodeSetOp(set, path, bytes)), want, `set ${set} ${path.slice(0, 20)} ${bytes.length}`);
      }
      const want = toBinary(L.OpItemSchema, create(L.OpItemSchema, { Op: { case: 'Delete', value: ref(set, path) } }));
      assert.deepEqual(new Uint8Array(encodeDeleteOp(set, path)), want);
    }
  }
  const empty = create(L.EmptyOpSchema);
  assert.deepEqual(new Uint8Array(SYNC_FRAME), toBinary(L.OpItemSchema, create(L.OpItemSchema, { Op: { case: 'Sync', value: empty } })));
  assert.deepEqual(new Uint8Array(RESET_FRAME), toBinary(L.OpItemSchema, create(L.OpItemSchema, { Op: { case: 'Reset', value: empty } })));
});

test('Resume (kpng-ts) encodes exactly as toBinary(OpItem)', () => {
  for (const [buckets, count] of [[[], 16], [[0], 16], [[3, 200, 70000], 1 << 16], [[], 0]] as [number[], number][]) {
    const want = toBinary(L.OpItemSchema, create(L.OpItemSchema, { Op: { case: 'Resume', value: create(L.ResumeOpSchema, { Buckets: buckets, BucketCount: count }) } }));
    assert.deepEqual(new Uint8Array(encodeResumeOp(buckets, count)), want, `${buckets} ${count}`);
  }
});

test('a value fanned out to many nodes is encoded once', () => {
  const bytes = new Uint8Array([1, 2, 3]);
  const a = setOpFrame(LocalSet.EndpointsSet, 'ns/svc/p', bytes);
  assert.equal(setOpFrame(LocalSet.EndpointsSet, 'ns/svc/p', bytes), a);
  // the same bytes under another path is another op
  assert.notEqual(setOpFrame(LocalSet.EndpointsSet, 'ns/svc/q', bytes), a);
});

test('addresses: unix sockets, tcp, bare host:port, loopback detection', () => {
  assert.deepEqual(parseAddress('unix:///run/kpng/kpng.sock'), { kind: 'unix', path: '/run/kpng/kpng.sock' });
  assert.deepEqual(parseAddress('unix:/run/kpng.sock'), { kind: 'unix', path: '/run/kpng.sock' });
  assert.throws(() => parseAddress('unix://relative.sock'), /absolute path/);
  assert.deepEqual(parseAddress('tcp://127.0.0.1:12090'), { kind: 'tcp', host: '127.0.0.1', port: 12090 });
  assert.deepEqual(parseAddress('127.0.0.1:12090'), { kind: 'tcp', host: '127.0.0.1', port: 12090 });
  assert.deepEqual(parseAddress('tcp://[::1]:0'), { kind: 'tcp', host: '::1', port: 0 });
  assert.deepEqual(parseAddress('tcp://:12090'), { kind: 'tcp', host: '', port: 12090 });
  assert.throws(() => parseAddress('tcp://host'), /not an API address/);
  assert.throws(() => parseAddress('tcp://h:70000'), /out of range/);
  assert.equal(formatAddress(parseAddress('tcp://[::1]:5')), 'tcp://[::1]:5');
  assert.equal(grpcTarget(parseAddress('tcp://:5'), true), '0.0.0.0:5');
  assert.equal(grpcTarget(parseAddress('tcp://[::1]:5')), '[::1]:5');
  for (const a of ['unix:///x.sock', 'tcp://127.0.0.1:1', 'tcp://127.1.2.3:1', 'tcp://[::1]:1', 'tcp://localhost:1']) assert.ok(isLoopback(parseAddress(a)), a);
  for (const a of ['tcp://:1', 'tcp://0.0.0.0:1', 'tcp://[::]:1', 'tcp://10.0.0.1:1', 'tcp://brain.example:1', 'tcp://[2001:db8::1]:1']) assert.ok(!isLoopback(parseAddress(a)), a);
});
