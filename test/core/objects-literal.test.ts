// convertSlice builds its messages as literals: each must be what protobuf-es's
// create() gives (every field, its default when not set, no field a message leaves unset).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { create, fromBinary, toBinary } from '@bufbuild/protobuf';
import { EndpointInfoSchema } from '../../src/api/gen/api/globalv1/api_pb.js';
import { convertObject } from '../../src/sources/objects.js';
import { slice } from '../helpers/k8s.js';

test('converted slice endpoints are complete messages, as create() and a decode make them', () => {
  const o = slice('ns', 'web-1', 'web', [
    { ip: '10.0.0.1', node: 'n1', zone: 'z1', pod: 'p1', zoneHints: ['z2', 'z1'] },
    { ip: '10.0.0.2', ready: false, serving: true, terminating: true },
    { ip: '10.0.0.3' },
  ], [{ name: 'http', port: 8080 }, { name: 'dns', port: 53, protocol: 'UDP' }]);
  for (const v6 of [false, true]) {
    const obj = v6 ? { ...o, addressType: 'IPv6', endpoints: [{ addresses: ['fd00::1'], hostname: 'h', nodeName: 'n2', hints: { forNodes: [{ name: 'n2' }] } }] } : o;
    const c = convertObject(obj);
    assert.equal(c.kind, 'EndpointSlice');
    if (c.kind !== 'EndpointSlice') return;
    for (const e of c.endpoints) {
      assert.deepStrictEqual(fromBinary(EndpointInfoSchema, toBinary(EndpointInfoSchema, e)), e);
      assert.deepStrictEqual(create(EndpointInfoSchema, structuredClone(e)), e);
    }
  }
});
