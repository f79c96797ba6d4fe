// The hand-written Service encoder is byte-identical to protobuf-es's
// toBinary(ServiceSchema), and fromBinary gives the message back.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { create, equals, fromBinary, toBinary } from '@bufbuild/protobuf';
import { ServiceSchema, type Protocol, type Service } from '../../src/api/gen/api/localv1/api_pb.js';
import { encodeServiceFast, encodeEndpointsFast } from '../../src/api/fast-encode.js';
import { encodeService, decodeService } from '../../src/api/model.js';
import { convertObject } from '../../src/sources/objects.js';
import { service } from '../helpers/k8s.js';
import { randomMessages } from '../helpers/random-messages.js';

/** the same bytes as toBinary, and (unless a string is not valid UTF-16) fromBinary gives back an equal message */
function same(s: Service, what: string | (() => string), roundTrips = true): void {
  const fast = Buffer.from(encodeServiceFast(s));
  const ref = Buffer.from(toBinary(ServiceSchema, s));
  const name = () => (typeof what === 'string' ? what : what());
  if (!fast.equals(ref)) assert.deepEqual(fast, ref, name());
  if (roundTrips && !equals(ServiceSchema, fromBinary(ServiceSchema, fast), s)) assert.fail(`${name()}: does not decode back to an equal message`);
}

test('encodeServiceFast equals toBinary on many random Services (every field, both IP families, every oneof case, maps of many keys)', () => {
  const random = randomMessages(11);
  for (let i = 0; i < 5000; i++) {
    const s = random.service();
    same(s, () => `service ${i}: ${JSON.stringify(s).slice(0, 2000)}`);
    // as service-view builds them: a literal spread of a message
    if (i % 10 === 0) same({ ...s, Ports: s.Ports.map((p) => ({ ...p })) }, `spread ${i}`);
  }
});

test('encodeServiceFast equals toBinary on hand-picked Services', () => {
  const cases: [string, Service, boolean?][] = [
    ['empty', create(ServiceSchema)],
    ['empty strings and zero ports, messages set but empty', create(ServiceSchema, { IPs: { ClusterIPs: {}, ExternalIPs: {}, LoadBalancerIPs: {}, ProxyLoadBalancerIPs: {} }, Ports: [{}, { Port: 0, Name: '' }], IPFilters: [{}, { TargetIPs: {} }] })],
    ['ClientIP affinity with timeout 0 (an empty message, still written)', create(ServiceSchema, { SessionAffinity: { case: 'ClientIP', value: {} } })],
    ['ClientIP affinity', create(ServiceSchema, { SessionAffinity: { case: 'ClientIP', value: { TimeoutSeconds: 10800 } } })],
    ['map entries with empty key and value', create(ServiceSchema, { Labels: { '': '' }, Annotations: { a: '', '': 'b' } })],
    ['integer-like keys (JavaScript orders them first)', create(ServiceSchema, { Labels: { b: '1', '10': '2', a: '3', '2': '4', '-1': '5', '01': '6', '4294967295': '7' } })],
    ['a map of 1000 keys', create(ServiceSchema, { Labels: Object.fromEntries(Array.from({ length: 1000 }, (_, i) => [`key-${(i * 7919) % 1000}`, `value-${i}`])) })],
    ['an annotation of 3-byte length (a nested length that grows twice)', create(ServiceSchema, { Annotations: { 'kubectl.kubernetes.io/last-applied-configuration': '{"x":"' + 'y'.repeat(100_000) + '"}' } })],
    ['a length of exactly 127 and 128', create(ServiceSchema, { Labels: { a: 'x'.repeat(123), b: 'x'.repeat(124) } })],
    ['unicode, astral and a lone surrogate', create(ServiceSchema, { Name: 'é-ü-ñ-中-😀', Labels: { '😀': '中' }, Ports: [{ Name: '\ud800' }] }), false],
    ['negative and extreme int32s, unknown enum value', create(ServiceSchema, { HealthCheckNodePort: -2147483648, Ports: [{ Port: -1, NodePort: 2147483647, TargetPort: -5, Protocol: 99 as Protocol }, { Protocol: -3 as Protocol }] })],
    ['dual stack', create(ServiceSchema, { Namespace: 'ns', Name: 'web', Type: 'LoadBalancer', IPs: { ClusterIPs: { V4: ['10.96.0.1'], V6: ['fd00::1'] }, ExternalIPs: { V6: ['2001:db8::1'] }, LoadBalancerIPs: { V4: ['1.2.3.4'] }, ProxyLoadBalancerIPs: { V6: ['2001:db8::2'] }, Headless: true } })],
  ];
  for (const [what, s, roundTrips] of cases) same(s, what, roundTrips);
});

test('unknown fields, at the top and nested, are written back last as toBinary does', () => {
  const s = create(ServiceSchema, { Name: 'web', IPs: { ClusterIPs: { V4: ['10.0.0.1'] } }, Ports: [{ Port: 80 }], IPFilters: [{ SourceRanges: ['0.0.0.0/0'] }], SessionAffinity: { case: 'ClientIP', value: { TimeoutSeconds: 5 } } });
  const base = toBinary(ServiceSchema, s);
  // field 99 varint 1; field 100 length-delimited "ab"; field 2^29-1 fixed32
  const unknown = [0x98, 0x06, 0x01, 0xa2, 0x06, 0x02, 0x61, 0x62, 0xfd, 0xff, 0xff, 0xff, 0x0f, 1, 2, 3, 4];
  const decoded = fromBinary(ServiceSchema, new Uint8Array([...base, ...unknown]));
  decoded.IPs!.$unknown = [{ no: 50, wireType: 0, data: new Uint8Array([5]) }];
  decoded.IPs!.ClusterIPs!.$unknown = [{ no: 7, wireType: 2, data: new Uint8Array([1, 0x41]) }];
  decoded.Ports[0].$unknown = [{ no: 20, wireType: 0, data: new Uint8Array([0x80, 0x01]) }];
  decoded.IPFilters[0].$unknown = [{ no: 9, wireType: 5, data: new Uint8Array([1, 2, 3, 4]) }];
  if (decoded.SessionAffinity.case === 'ClientIP') decoded.SessionAffinity.value.$unknown = [{ no: 2, wireType: 0, data: new Uint8Array([1]) }];
  assert.equal(decoded.$unknown?.length, 3);
  same(decoded, 'unknown fields');
});

test('a number that is not an int32 throws as toBinary does', () => {
  for (const bad of [create(ServiceSchema, { HealthCheckNodePort: 2 ** 31 }), create(ServiceSchema, { Ports: [{ Port: 1.5 }] }), create(ServiceSchema, { SessionAffinity: { case: 'ClientIP', value: { TimeoutSeconds: NaN } } })]) {
    assert.throws(() => toBinary(ServiceSchema, bad));
    assert.throws(() => encodeServiceFast(bad), /invalid int32/);
  }
});

test('encodeService (model) and the store path: converted Services encode as toBinary', () => {
  const o = service('ns', 'web', { type: 'NodePort', ports: [{ name: 'http', port: 80, nodePort: 30080 }, { name: 'dns', port: 53, protocol: 'UDP', targetPort: 'dns' }], sessionAffinity: 'ClientIP', clusterIPs: ['10.96.0.1', 'fd00::1'], ipFamilies: ['IPv4', 'IPv6'] }, { metadata: { labels: { app: 'web', '1': 'one' }, annotations: { note: 'x' } } });
  const c = convertObject(o);
  assert.equal(c.kind, 'Service');
  if (c.kind !== 'Service') return;
  same(c.service, 'converted');
  assert.deepEqual(Buffer.from(encodeService(c.service)), Buffer.from(toBinary(ServiceSchema, c.service)));
  assert.ok(equals(ServiceSchema, decodeService(encodeService(c.service)), c.service));
  // its own buffer, of its size; and after endpoints in encodeEndpointsFast
  const b = encodeServiceFast(c.service);
  assert.equal(b.byteOffset, 0);
  assert.equal(b.buffer.byteLength, b.length);
  const { buf, starts } = encodeEndpointsFast([], c.service);
  assert.deepEqual(starts, [0]);
  assert.deepEqual(Buffer.from(buf), Buffer.from(b));
});
