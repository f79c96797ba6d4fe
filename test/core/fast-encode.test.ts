// The hand-written Endpoint encoder is byte-identical to protobuf-es.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { toBinary, create } from '@bufbuild/protobuf';
import { EndpointSchema, ServiceSchema } from '../../src/api/gen/api/localv1/api_pb.js';
import { encodeEndpointFast, encodeEndpointsFast } from '../../src/api/fast-encode.js';
import { randomMessages } from '../helpers/random-messages.js';

test('encodeEndpointFast (one) and encodeEndpointsFast (a service\'s, in one buffer, the service after them) equal toBinary on many endpoints', () => {
  const batch: ReturnType<typeof create<typeof EndpointSchema>>[] = [];
  const random = randomMessages(42);
  for (let i = 0; i < 3000; i++) {
    const e = random.endpoint();
    assert.deepEqual(Buffer.from(encodeEndpointFast(e)), Buffer.from(toBinary(EndpointSchema, e)), JSON.stringify(e));
    batch.push(e);
  }
  const service = random.service();
  const { buf, starts } = encodeEndpointsFast(batch, service);
  assert.equal(starts.length, batch.length + 1);
  batch.forEach((e, i) => assert.deepEqual(Buffer.from(buf.subarray(starts[i], starts[i + 1])), Buffer.from(toBinary(EndpointSchema, e)), `endpoint ${i}`));
  assert.deepEqual(Buffer.from(buf.subarray(starts.at(-1))), Buffer.from(toBinary(ServiceSchema, service)));
  // without a service, the buffer ends with the last endpoint
  const alone = encodeEndpointsFast(batch.slice(0, 3));
  assert.equal(alone.buf.length, alone.starts[3]);
});
