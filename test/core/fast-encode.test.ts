// The hand-written Endpoint encoder is byte-identical to protobuf-es.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { toBinary, create } from '@bufbuild/protobuf';
import { EndpointSchema } from '../../src/api/gen/api/localv1/api_pb.js';
import { encodeEndpointFast, encodeEndpointsFast } from '../../src/api/fast-encode.js';

test('encodeEndpointFast (one) and encodeEndpointsFast (a service\'s, in one buffer) equal toBinary on many endpoints', () => {
  const batch: ReturnType<typeof create<typeof EndpointSchema>>[] = [];
  let seed = 42;
  const rnd = (n: number) => ((seed = (seed * 1103515245 + 12345) % 2 ** 31), seed % n);
  const str = () => ['', 'a', 'pod-0123456789', 'é-ü-ñ', 'x'.repeat(200)][rnd(5)];
  for (let i = 0; i < 3000; i++) {
    const e = create(EndpointSchema, {
      Hostname: str(),
      IPs: rnd(4) ? { V4: Array.from({ length: rnd(3) }, () => `10.${rnd(256)}.${rnd(256)}.${rnd(256)}`), V6: Array.from({ length: rnd(2) }, () => `fd00::${rnd(65536).toString(16)}`) } : undefined,
      Local: !!rnd(2),
      PortOverrides: Array.from({ length: rnd(4) }, () => ({ Name: str(), Port: [0, 1, 127, 128, 8080, 65535, 300000, -1][rnd(8)], Protocol: rnd(4) })),
      Scopes: rnd(4) ? { Internal: !!rnd(2), External: !!rnd(2), Cluster: !!rnd(2) } : undefined,
      Terminating: !!rnd(2),
      NodeName: str(),
    });
    assert.deepEqual(Buffer.from(encodeEndpointFast(e)), Buffer.from(toBinary(EndpointSchema, e)), JSON.stringify(e));
    batch.push(e);
  }
  const tail = new Uint8Array([1, 2, 3]);
  const { buf, starts } = encodeEndpointsFast(batch, tail);
  assert.equal(starts.length, batch.length + 1);
  batch.forEach((e, i) => assert.deepEqual(Buffer.from(buf.subarray(starts[i], starts[i + 1])), Buffer.from(toBinary(EndpointSchema, e)), `endpoint ${i}`));
  assert.deepEqual([...buf.subarray(starts.at(-1))], [1, 2, 3]);
});
