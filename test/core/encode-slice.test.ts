// The store's hand-written slice encoder is byte-identical to protobuf-es's
// toBinary of each EndpointInfo, framed as the store frames them.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { toBinary } from '@bufbuild/protobuf';
import { EndpointInfoSchema, type EndpointInfo } from '../../src/api/gen/api/globalv1/api_pb.js';
import { encodeSlice } from '../../src/store/store.js';
import { convertObject } from '../../src/sources/objects.js';
import { slice } from '../helpers/k8s.js';
import { randomMessages } from '../helpers/random-messages.js';

/** the reference: each endpoint by toBinary, after its length (4 bytes, big-endian), after the service name and a NUL */
function referenceEncodeSlice(serviceName: string, endpoints: readonly EndpointInfo[]): Uint8Array {
  const parts: Uint8Array[] = [Buffer.from(serviceName + '\0')];
  for (const e of endpoints) {
    const b = toBinary(EndpointInfoSchema, e);
    const len = Buffer.alloc(4);
    len.writeUInt32BE(b.length);
    parts.push(len, b);
  }
  return Buffer.concat(parts);
}

test("encodeSlice equals toBinary's bytes on many endpoints, whatever their fields", () => {
  const random = randomMessages(7);
  const big = 'y'.repeat(20_000); // a length of three varint bytes
  for (let i = 0; i < 2000; i++) {
    const endpoints: EndpointInfo[] = Array.from({ length: random.rnd(6) }, () => random.endpointInfo());
    // mostly without a Hash, which the hand-written path leaves to toBinary
    for (const e of endpoints) if (random.rnd(20)) e.Hash = 0n;
    if (i % 50 === 0 && endpoints.length) endpoints[0].PodName = big;
    const name = random.str();
    assert.deepEqual(Buffer.from(encodeSlice(name, endpoints)), Buffer.from(referenceEncodeSlice(name, endpoints)), `slice ${i}`);
  }
});

test("encodeSlice equals toBinary's bytes on converted slices", () => {
  const o = slice('ns', 'web-1', 'web', [
    { ip: '10.0.0.1', node: 'n1', zone: 'z1', pod: 'p1', zoneHints: ['z1', 'z2'] },
    { ip: '10.0.0.2', ready: false, serving: true, terminating: true },
    { ip: '10.0.0.3', node: 'n2' },
  ], [{ name: 'http', port: 8080 }, { name: 'dns', port: 53, protocol: 'UDP' }]);
  const c = convertObject(o);
  assert.equal(c.kind, 'EndpointSlice');
  if (c.kind !== 'EndpointSlice') return;
  assert.deepEqual(Buffer.from(encodeSlice(c.serviceName, c.endpoints)), Buffer.from(referenceEncodeSlice(c.serviceName, c.endpoints)));
  // the result is a buffer of its own
  const b = encodeSlice(c.serviceName, c.endpoints);
  assert.equal(b.byteOffset, 0);
  assert.equal(b.buffer.byteLength, b.length);
});
