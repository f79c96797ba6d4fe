// The hand-written Endpoint encoder is byte-identical to protobuf-es.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { toBinary, create } from '@bufbuild/protobuf';
import { EndpointSchema } from '../../src/api/gen/api/localv1/api_pb.js';
import { encodeEndpointFast, encodeEndpointsFast } from '../../src/api/fast-encode.js';
import { randomMessages } from '../helpers/random-messages.js';

test('encodeEndpointFast (one) and encodeEndpointsFast (a service\'s, in one buffer) equal toBinary on many endpoints', () => {
  const batch: ReturnType<typeof create<typeof EndpointSchema>>[] = [];
  const random = randomMessages(42);
  for (let i = 0; i < 3000; i++) {
    const e = random.endpoint();
    assert.deepEqual(Buffer.from(encodeEndpointFast(e)), Buffer.from(toBinary(EndpointSchema, e)), JSON.stringify(e));
    batch.push(e);
  }
  const tail = new Uint8Array([1, 2, 3]);
  const { buf, starts } = encodeEndpointsFast(batch, tail);
  assert.equal(starts.length, batch.length + 1);
  batch.forEach((e, i) => assert.deepEqual(Buffer.from(buf.subarray(starts[i], starts[i + 1])), Buffer.from(toBinary(EndpointSchema, e)), `endpoint ${i}`));
  assert.deepEqual([...buf.subarray(starts.at(-1))], [1, 2, 3]);
});
