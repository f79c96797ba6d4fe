// The hand-written EndpointInfo decoder equals protobuf-es's fromBinary.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { toBinary, fromBinary, create } from '@bufbuild/protobuf';
import { EndpointInfoSchema } from '../../src/api/gen/api/globalv1/api_pb.js';
import { decodeEndpointInfoFast } from '../../src/api/fast-decode.js';

/** the message without its unset message fields: fromBinary leaves them out, the fast decoder sets them undefined (one object shape) */
function defined(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(defined);
  if (v && typeof v === 'object' && !(v instanceof Uint8Array)) return Object.fromEntries(Object.entries(v).filter(([, x]) => x !== undefined).map(([k, x]) => [k, defined(x)]));
  return v;
}

test('decodeEndpointInfoFast equals fromBinary on many random EndpointInfos (every field, empty and odd values, unicode, int32 negatives, 64-bit hashes)', () => {
  let seed = 7;
  const rnd = (n: number) => ((seed = (seed * 1103515245 + 12345) % 2 ** 31), seed % n);
  const str = () => ['', 'a', 'pod-0123456789', 'é-ü-ñ-中', 'x'.repeat(300)][rnd(5)];
  const strs = (n: number) => Array.from({ length: rnd(n) }, str);
  for (let i = 0; i < 3000; i++) {
    const m = create(EndpointInfoSchema, {
      Hash: [0n, 1n, 127n, 128n, 2n ** 32n - 1n, 2n ** 32n, 2n ** 63n + 5n, 2n ** 64n - 1n][rnd(8)],
      Namespace: str(),
      SourceName: str(),
      ServiceName: str(),
      PodName: str(),
      Endpoint: rnd(5)
        ? {
            Hostname: str(),
            IPs: rnd(4) ? { V4: Array.from({ length: rnd(3) }, () => `10.${rnd(256)}.${rnd(256)}.${rnd(256)}`), V6: Array.from({ length: rnd(2) }, () => `fd00::${rnd(65536).toString(16)}`) } : undefined,
            Local: !!rnd(2),
            PortOverrides: Array.from({ length: rnd(4) }, () => ({ Name: str(), Port: [0, 1, 127, 128, 8080, 65535, 300000, -1, -2147483648, 2147483647][rnd(10)], Protocol: rnd(5) })),
            Scopes: rnd(3) ? { Internal: !!rnd(2), External: !!rnd(2), Cluster: !!rnd(2) } : undefined,
            Terminating: !!rnd(2),
            NodeName: str(),
          }
        : undefined,
      Conditions: rnd(4) ? { Ready: !!rnd(2), Serving: !!rnd(2), Terminating: !!rnd(2) } : undefined,
      Topology: rnd(4) ? { Node: str(), Zone: str() } : undefined,
      Hints: rnd(3) ? { Zones: strs(3), Nodes: strs(3) } : undefined,
    });
    const bytes = toBinary(EndpointInfoSchema, m);
    const fast = decodeEndpointInfoFast(bytes);
    assert.deepStrictEqual(defined(fast), defined(fromBinary(EndpointInfoSchema, bytes)), JSON.stringify(m, (_k, v) => (typeof v === 'bigint' ? String(v) : v)));
    assert.deepEqual(Buffer.from(toBinary(EndpointInfoSchema, fast)), Buffer.from(bytes), 'encodes back to the same bytes');
  }
});

test('what it does not expect goes to fromBinary: an unknown field is kept, a truncated message throws as fromBinary does', () => {
  const m = create(EndpointInfoSchema, { Namespace: 'ns', PodName: 'p', Endpoint: { IPs: { V4: ['10.0.0.1'] } } });
  const bytes = toBinary(EndpointInfoSchema, m);
  // field 99, varint 1, appended
  const withUnknown = new Uint8Array([...bytes, 0x98, 0x06, 0x01]);
  assert.deepStrictEqual(decodeEndpointInfoFast(withUnknown), fromBinary(EndpointInfoSchema, withUnknown));
  assert.ok(decodeEndpointInfoFast(withUnknown).$unknown?.length, 'the unknown field is kept');
  const cut = bytes.subarray(0, bytes.length - 2);
  assert.throws(() => fromBinary(EndpointInfoSchema, cut));
  assert.throws(() => decodeEndpointInfoFast(cut));
});
