// The store's hand-written slice encoder is byte-identical to protobuf-es's
// toBinary of each EndpointInfo, framed as the store frames them.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { create, toBinary } from '@bufbuild/protobuf';
import { EndpointInfoSchema, type EndpointInfo } from '../../src/api/gen/api/globalv1/api_pb.js';
import { encodeSlice } from '../../src/store/store.js';

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
import { convertObject } from '../../src/sources/objects.js';
import { slice } from '../helpers/k8s.js';

test("encodeSlice equals toBinary's bytes on many endpoints, whatever their fields", () => {
  let seed = 7;
  const rnd = (n: number) => ((seed = (seed * 1103515245 + 12345) % 2 ** 31), seed % n);
  const str = () => ['', 'a', 'pod-0123456789', 'é-ü-ñ', '😀', 'x'.repeat(200), 'y'.repeat(20_000)][rnd(7)];
  const strs = () => Array.from({ length: rnd(3) }, str);
  for (let i = 0; i < 2000; i++) {
    const endpoints: EndpointInfo[] = Array.from({ length: rnd(6) }, () =>
      create(EndpointInfoSchema, {
        Hash: rnd(20) ? 0n : BigInt(rnd(1 << 30)),
        Namespace: str(),
        SourceName: str(),
        ServiceName: str(),
        PodName: str(),
        Endpoint: rnd(5)
          ? {
              Hostname: str(),
              IPs: rnd(4) ? { V4: Array.from({ length: rnd(3) }, () => `10.${rnd(256)}.${rnd(256)}.${rnd(256)}`), V6: Array.from({ length: rnd(2) }, () => `fd00::${rnd(65536).toString(16)}`) } : undefined,
              Local: !!rnd(2),
              PortOverrides: Array.from({ length: rnd(4) }, () => ({ Name: str(), Port: [0, 1, 127, 128, 8080, 65535, 300000, -1][rnd(8)], Protocol: rnd(4) })),
              Scopes: rnd(4) ? { Internal: !!rnd(2), External: !!rnd(2), Cluster: !!rnd(2) } : undefined,
              Terminating: !!rnd(2),
              NodeName: str(),
            }
          : undefined,
        Conditions: rnd(5) ? { Ready: !!rnd(2), Serving: !!rnd(2), Terminating: !!rnd(2) } : undefined,
        Topology: rnd(5) ? { Node: str(), Zone: str() } : undefined,
        Hints: rnd(5) ? { Zones: strs(), Nodes: strs() } : undefined,
      }),
    );
    const name = str();
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
