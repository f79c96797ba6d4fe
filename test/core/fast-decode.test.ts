// The hand-written EndpointInfo decoder equals protobuf-es's fromBinary.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { toBinary, fromBinary, create } from '@bufbuild/protobuf';
import { EndpointInfoSchema } from '../../src/api/gen/api/globalv1/api_pb.js';
import { decodeEndpointFast, decodeEndpointInfoFast, decodeServiceFastOnly, scanEndpointAt } from '../../src/api/fast-decode.js';
import { EndpointSchema, IPSetSchema, PortNameSchema, ServiceSchema } from '../../src/api/gen/api/localv1/api_pb.js';
import { randomMessages } from '../helpers/random-messages.js';

/** the message without its unset message fields: fromBinary leaves them out, the fast decoder sets them undefined (one object shape) */
function defined(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(defined);
  if (v && typeof v === 'object' && !(v instanceof Uint8Array)) return Object.fromEntries(Object.entries(v).filter(([, x]) => x !== undefined).map(([k, x]) => [k, defined(x)]));
  return v;
}

test('decodeEndpointInfoFast equals fromBinary on many random EndpointInfos (every field, empty and odd values, unicode, int32 negatives, 64-bit hashes)', () => {
  const random = randomMessages(7);
  for (let i = 0; i < 3000; i++) {
    const m = random.endpointInfo();
    const bytes = toBinary(EndpointInfoSchema, m);
    const fast = decodeEndpointInfoFast(bytes);
    assert.deepStrictEqual(defined(fast), defined(fromBinary(EndpointInfoSchema, bytes)), JSON.stringify(m, (_k, v) => (typeof v === 'bigint' ? String(v) : v)));
    assert.deepEqual(Buffer.from(toBinary(EndpointInfoSchema, fast)), Buffer.from(bytes), 'encodes back to the same bytes');
  }
});

test("scanEndpointAt reads what a view reads of an endpoint with one IPv4 address and one port as the decoder does, and takes no other endpoint: many random EndpointInfos", () => {
  const random = randomMessages(11);
  let scanned = 0;
  for (let i = 0; i < 4000; i++) {
    const m = random.endpointInfo();
    // half of them made to the shape the scan takes (one address, one port), some of those with an empty address
    if (i % 2 && m.Endpoint) {
      m.Endpoint.IPs = create(IPSetSchema, { V4: [i % 50 ? `10.0.${i % 256}.${i % 7}` : ''] });
      m.Endpoint.PortOverrides = m.Endpoint.PortOverrides.slice(0, 1);
      if (!m.Endpoint.PortOverrides.length) m.Endpoint.PortOverrides.push(create(PortNameSchema, { Name: 'http', Port: 8080, Protocol: 1 }));
    }
    const bytes = toBinary(EndpointInfoSchema, m);
    // in a larger buffer, as the store's slabs hold it
    const buf = new Uint8Array([7, 7, ...bytes, 7]);
    const s = scanEndpointAt(buf, 2, 2 + bytes.length);
    const d = decodeEndpointInfoFast(bytes);
    const e = d.Endpoint;
    const takes = !!e && e.IPs?.V4.length === 1 && e.IPs.V4[0] !== '' && e.IPs.V6.length === 0 && e.PortOverrides.length === 1;
    const what = JSON.stringify(m, (_k, v) => (typeof v === 'bigint' ? String(v) : v));
    if (!takes) {
      assert.equal(s, undefined, what);
      continue;
    }
    scanned++;
    assert.ok(s, what);
    assert.equal(s.PodName, d.PodName);
    assert.deepStrictEqual(defined(s.Conditions), defined(d.Conditions), what);
    assert.deepStrictEqual(defined(s.Hints), defined(d.Hints), what);
    assert.deepStrictEqual(s.Topology && { Node: s.Topology.Node, Zone: s.Topology.Zone }, d.Topology && { Node: d.Topology.Node, Zone: d.Topology.Zone }, what);
    assert.equal(s.Endpoint.Hostname, e.Hostname);
    assert.equal(s.ip, e.IPs!.V4[0]);
    const p = e.PortOverrides[0];
    assert.deepEqual([s.portName, s.port, s.protocol], [p.Name, p.Port, p.Protocol], what);
  }
  assert.ok(scanned > 1000, `scanned ${scanned}`);
});

test('scanEndpointAt leaves to the decoder an endpoint with an unknown field or a field twice, and shares one frozen topology per node and zone', () => {
  const m = create(EndpointInfoSchema, { PodName: 'p', Endpoint: { IPs: { V4: ['10.0.0.1'] }, PortOverrides: [{ Name: 'http', Port: 80, Protocol: 1 }] }, Topology: { Node: 'n1', Zone: 'z' } });
  const bytes = toBinary(EndpointInfoSchema, m);
  const a = scanEndpointAt(bytes, 0, bytes.length);
  assert.equal(a?.ip, '10.0.0.1');
  const withUnknown = new Uint8Array([...bytes, 0x98, 0x06, 0x01]);
  assert.equal(scanEndpointAt(withUnknown, 0, withUnknown.length), undefined);
  // PodName (field 8) again: fromBinary takes the last, the scan leaves it
  const twice = new Uint8Array([...bytes, 0x42, 0x01, 0x71]);
  assert.equal(scanEndpointAt(twice, 0, twice.length), undefined);
  const b = scanEndpointAt(bytes, 0, bytes.length);
  assert.equal(a!.Topology, b!.Topology);
  assert.ok(Object.isFrozen(a!.Topology));
  const cut = bytes.subarray(0, bytes.length - 2);
  assert.equal(scanEndpointAt(cut, 0, cut.length), undefined);
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

test('conditions and empty hints are shared frozen messages: equal values, one object', () => {
  const enc = (ready: boolean, zones: string[]) =>
    toBinary(EndpointInfoSchema, create(EndpointInfoSchema, { PodName: 'p', Conditions: { Ready: ready, Serving: true }, Hints: { Zones: zones } }));
  const [a, b, c] = [enc(true, []), enc(true, []), enc(false, ['z1'])].map(decodeEndpointInfoFast);
  assert.equal(a.Conditions, b.Conditions);
  assert.equal(a.Hints, b.Hints);
  assert.ok(Object.isFrozen(a.Conditions) && Object.isFrozen(a.Hints) && Object.isFrozen(a.Hints!.Zones));
  assert.notEqual(a.Conditions, c.Conditions);
  assert.deepEqual(c.Conditions, create(EndpointInfoSchema, { Conditions: { Serving: true } }).Conditions);
  assert.deepEqual(c.Hints!.Zones, ['z1']);
  assert.ok(!Object.isFrozen(c.Hints));
});

test("an endpoint's scopes and its empty address family are shared frozen values too", () => {
  const enc = (v4: string[]) => toBinary(EndpointSchema, create(EndpointSchema, { IPs: { V4: v4 }, Scopes: { Internal: true, Cluster: true } }));
  const [a, b] = [enc(['10.0.0.1']), enc(['10.0.0.2'])].map((x) => decodeEndpointFast(x, 0, x.length));
  assert.equal(a.Scopes, b.Scopes);
  assert.equal(a.IPs!.V6, b.IPs!.V6);
  assert.ok(Object.isFrozen(a.Scopes) && Object.isFrozen(a.IPs!.V6));
  assert.deepEqual(a.IPs!.V4, ['10.0.0.1']);
  assert.deepEqual(a, fromBinary(EndpointSchema, enc(['10.0.0.1'])));
});

test("model's decodeEndpoint (what a node agent in split mode decodes: the hand-written decoder, then compact) equals compact(fromBinary) on random endpoints, and what the hand-written decoder does not take still decodes as before", async () => {
  const { decodeEndpoint } = await import('../../src/api/model.js');
  const { compact } = await import('../../src/api/compact.js');
  const random = randomMessages(11);
  for (let i = 0; i < 3000; i++) {
    const bytes = toBinary(EndpointSchema, random.endpoint());
    const got = decodeEndpoint(bytes);
    assert.deepStrictEqual(defined(got), defined(compact(EndpointSchema, [fromBinary(EndpointSchema, bytes)])[0]), `endpoint ${i}`);
    assert.deepEqual(Buffer.from(toBinary(EndpointSchema, got)), Buffer.from(bytes), 'encodes back to the same bytes');
  }
  // ports that repeat: one shared frozen list
  const ports = (ip: string) => toBinary(EndpointSchema, create(EndpointSchema, { IPs: { V4: [ip] }, PortOverrides: [{ Name: 'http', Port: 8080, Protocol: 1 }] }));
  const [a, b] = [ports('10.0.0.1'), ports('10.0.0.2')].map(decodeEndpoint);
  assert.equal(a.PortOverrides, b.PortOverrides);
  assert.ok(Object.isFrozen(a.PortOverrides));
  // an unknown field (99): fromBinary's decoding, copied by compact (which leaves unknown fields out), as before
  const withUnknown = new Uint8Array([...ports('10.0.0.3'), 0x98, 0x06, 0x01]);
  assert.deepStrictEqual(defined(decodeEndpoint(withUnknown)), defined(compact(EndpointSchema, [fromBinary(EndpointSchema, withUnknown)])[0]));
  assert.throws(() => decodeEndpoint(ports('10.0.0.4').subarray(0, 5)));
});

test('decodeServiceFastOnly equals fromBinary on many random Services (every field, maps with odd keys, filters, affinity, int32 negatives), and model.decodeService equals compact(fromBinary) as before', async () => {
  const { decodeService } = await import('../../src/api/model.js');
  const { compact } = await import('../../src/api/compact.js');
  const random = randomMessages(13);
  for (let i = 0; i < 3000; i++) {
    const bytes = toBinary(ServiceSchema, random.service());
    const fast = decodeServiceFastOnly(bytes);
    assert.ok(fast, `service ${i}: taken by the hand-written decoder`);
    const slow = fromBinary(ServiceSchema, bytes);
    assert.deepStrictEqual(defined(fast), defined(slow), `service ${i}`);
    assert.deepEqual(Object.keys(fast.Labels), Object.keys(slow.Labels), 'labels in the same order');
    assert.deepEqual(Buffer.from(toBinary(ServiceSchema, fast)), Buffer.from(bytes), 'encodes back to the same bytes');
    assert.deepStrictEqual(defined(decodeService(bytes)), defined(compact(ServiceSchema, [slow])[0]), `decodeService ${i}`);
  }
  // what it does not take goes to fromBinary: an unknown field (99), a "__proto__" label (an own property there), a message field twice
  const base = toBinary(ServiceSchema, create(ServiceSchema, { Namespace: 'ns', Name: 'a', Ports: [{ Name: 'http', Port: 80, Protocol: 1 }] }));
  const withUnknown = new Uint8Array([...base, 0x98, 0x06, 0x01]);
  assert.equal(decodeServiceFastOnly(withUnknown), undefined);
  assert.deepStrictEqual(defined(decodeService(withUnknown)), defined(compact(ServiceSchema, [fromBinary(ServiceSchema, withUnknown)])[0]));
  const proto = toBinary(ServiceSchema, create(ServiceSchema, { Name: 'a', Labels: { ['__proto__']: 'x', app: 'y' } }));
  assert.equal(decodeServiceFastOnly(proto), undefined);
  assert.equal(Object.getOwnPropertyDescriptor(decodeService(proto).Labels, '__proto__')?.value, 'x');
  const ips = toBinary(ServiceSchema, create(ServiceSchema, { IPs: { ClusterIPs: { V4: ['10.0.0.1'] } } }));
  const twice = new Uint8Array([...ips, ...ips]);
  assert.equal(decodeServiceFastOnly(twice), undefined);
  assert.deepStrictEqual(defined(decodeService(twice)), defined(compact(ServiceSchema, [fromBinary(ServiceSchema, twice)])[0]));
  assert.throws(() => decodeService(base.subarray(0, base.length - 2)));
});

test('a bool whose varint has only bits past the 32nd set is true, as fromBinary reads it', () => {
  // field 5 (MapIP), varint 2^35; field 3 of an endpoint (Local) likewise
  const svc = new Uint8Array([0x28, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01]);
  assert.equal(fromBinary(ServiceSchema, svc).MapIP, true);
  assert.equal(decodeServiceFastOnly(svc)?.MapIP, true);
  const ep = new Uint8Array([0x18, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01]);
  assert.equal(fromBinary(EndpointSchema, ep).Local, true);
  assert.equal(decodeEndpointFast(ep, 0, ep.length).Local, true);
});
