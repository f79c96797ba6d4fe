// Stored messages are compact copies: the same encoding, every field inside
// one object, shared parts still shared, and nothing to mutate by accident.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { create, equals, toBinary } from '@bufbuild/protobuf';
import * as L from '../../src/api/gen/api/localv1/api_pb.js';
import * as G from '../../src/api/gen/api/globalv1/api_pb.js';
import { anyUnknownFields, compact, compactOne, sharedPortNames, sharedPorts } from '../../src/api/compact.js';
import { randomMessages } from '../helpers/random-messages.js';
import { decodeEndpoint, encodeEndpoint, newEndpoint } from '../../src/api/model.js';

const service = () =>
  create(L.ServiceSchema, {
    Namespace: 'ns',
    Name: 'web',
    Type: 'ClusterIP',
    Labels: { app: 'web' },
    IPs: { ClusterIPs: { V4: ['10.96.0.1'], V6: ['fd00::1'] } },
    Ports: [{ Name: 'http', Protocol: L.Protocol.TCP, Port: 80, TargetPort: 8080 }],
    SessionAffinity: { case: 'ClientIP', value: { TimeoutSeconds: 300 } },
  });

test('a compact copy is the same message, with the same encoding', () => {
  const svc = service();
  const [copy] = compact(L.ServiceSchema, [svc]);
  assert.notEqual(copy, svc);
  assert.ok(equals(L.ServiceSchema, copy, svc));
  assert.deepEqual(toBinary(L.ServiceSchema, copy), toBinary(L.ServiceSchema, svc));
  assert.equal(copy.SessionAffinity.case, 'ClientIP');
  assert.equal(copy.SessionAffinity.value?.TimeoutSeconds, 300);
  assert.deepEqual(Object.keys(copy), Object.keys(svc), 'every field, in order');
});

test('parts the messages share stay shared; empty lists are one frozen value', () => {
  const ports = [create(L.PortNameSchema, { Name: 'http', Port: 8080, Protocol: L.Protocol.TCP })];
  const eps = ['10.0.0.1', '10.0.0.2'].map((ip) => {
    const e = create(G.EndpointInfoSchema, { Namespace: 'ns', ServiceName: 'web', Endpoint: { IPs: { V4: [ip] } } });
    e.Endpoint!.PortOverrides = ports;
    return e;
  });
  const copies = compact(G.EndpointInfoSchema, eps);
  assert.equal(copies.length, 2);
  assert.equal(copies[0].Endpoint!.PortOverrides, copies[1].Endpoint!.PortOverrides, 'one ports list for both');
  assert.notEqual(copies[0].Endpoint!.PortOverrides, ports, 'a copy of it');
  assert.deepEqual(copies.map((c) => c.Endpoint!.IPs!.V4), [['10.0.0.1'], ['10.0.0.2']]);
  assert.equal(copies[0].Hints, undefined, 'an unset message stays unset');
  const v6 = copies[0].Endpoint!.IPs!.V6;
  assert.equal(v6, copies[1].Endpoint!.IPs!.V6);
  assert.ok(Object.isFrozen(v6));
  assert.throws(() => (v6 as string[]).push('fd00::1'), TypeError);
  eps.forEach((e, i) => assert.deepEqual(toBinary(G.EndpointInfoSchema, copies[i]), toBinary(G.EndpointInfoSchema, e)));
});

test('nested messages left at their defaults are one shared frozen value per type, and encode the same', () => {
  const a = create(L.ServiceSchema, { Name: 'a', IPs: { ClusterIPs: { V4: ['10.96.0.1'] }, ExternalIPs: {}, LoadBalancerIPs: {} } });
  const b = create(L.ServiceSchema, { Name: 'b', IPs: { ClusterIPs: { V4: ['10.96.0.2'] }, ExternalIPs: {}, LoadBalancerIPs: { V4: ['192.0.2.1'] } } });
  const [ca] = compact(L.ServiceSchema, [a]);
  const [cb] = compact(L.ServiceSchema, [b]);
  assert.equal(ca.IPs!.ExternalIPs, cb.IPs!.ExternalIPs, 'empty IPSets are shared');
  assert.ok(Object.isFrozen(ca.IPs!.ExternalIPs));
  assert.notEqual(ca.IPs!.ClusterIPs, cb.IPs!.ClusterIPs);
  assert.deepEqual(cb.IPs!.LoadBalancerIPs!.V4, ['192.0.2.1'], 'a set one is its own');
  assert.equal(ca.SessionAffinity, cb.SessionAffinity, 'a oneof with no case is shared');
  assert.equal(ca.IPs!.ProxyLoadBalancerIPs, undefined, 'an unset message stays unset');
  for (const [c, m] of [[ca, a], [cb, b]] as const) assert.deepEqual(toBinary(L.ServiceSchema, c), toBinary(L.ServiceSchema, m));
});

test('nested messages of flags only are one shared frozen value per content, and encode the same', () => {
  const ep = (ip: string, internal: boolean) => create(L.EndpointSchema, { IPs: { V4: [ip] }, Scopes: { Internal: internal, External: true, Cluster: true } });
  const eps = [ep('10.0.0.1', true), ep('10.0.0.2', true), ep('10.0.0.3', false)];
  const copies = eps.map((e) => compact(L.EndpointSchema, [e])[0]);
  assert.equal(copies[0].Scopes, copies[1].Scopes, 'the same flags: one object');
  assert.ok(Object.isFrozen(copies[0].Scopes));
  assert.notEqual(copies[0].Scopes, copies[2].Scopes);
  assert.deepEqual({ ...copies[2].Scopes }, { $typeName: 'localv1.EndpointScopes', Internal: false, External: true, Cluster: true });
  assert.notEqual(copies[0].IPs, copies[1].IPs, 'a message with more than flags is its own');
  eps.forEach((e, i) => assert.deepEqual(toBinary(L.EndpointSchema, copies[i]), toBinary(L.EndpointSchema, e)));
});

test('sharedPorts: Services with the same ports share one frozen list; anyUnknownFields finds what compact leaves out', () => {
  const a = compact(L.ServiceSchema, [service()])[0];
  const b = compact(L.ServiceSchema, [service()])[0];
  assert.notEqual(a.Ports, b.Ports);
  const pa = sharedPorts(a.Ports);
  assert.equal(sharedPorts(b.Ports), pa);
  assert.ok(Object.isFrozen(pa) && Object.isFrozen(pa[0]));
  const other = compact(L.ServiceSchema, [create(L.ServiceSchema, { Ports: [{ Name: 'http', Protocol: L.Protocol.TCP, Port: 81, TargetPort: 8080 }] })])[0];
  assert.notEqual(sharedPorts(other.Ports), pa);
  assert.equal(anyUnknownFields(service()), false);
  const withUnknown = service();
  withUnknown.Ports[0].$unknown = [{ no: 99, wireType: 0, data: new Uint8Array([1]) }];
  assert.equal(anyUnknownFields(withUnknown), true);
});

test('sharedPorts: two random port lists share one list exactly when their values are equal (names with separators and digits in them too)', () => {
  let seed = 5;
  const rnd = (n: number) => ((seed = (seed * 1103515245 + 12345) % 2 ** 31), seed % n);
  const names = ['', 'a', 'a/1', '1', '1/a', 'a;', ';', 'http', '0/0'];
  const port = () => ({
    Name: names[rnd(names.length)],
    Protocol: rnd(3),
    Port: [0, 1, 10, 11, 80][rnd(5)],
    NodePort: [0, 1, 10][rnd(3)],
    TargetPort: [0, 1, 101][rnd(3)],
    TargetPortName: names[rnd(names.length)],
    HasEndpointsV4: !!rnd(2),
    HasEndpointsV6: !!rnd(2),
  });
  const seen = new Map<string, readonly L.PortMapping[]>();
  // (fewer lists than the pool holds before it starts over: 4096)
  for (let i = 0; i < 2000; i++) {
    const svc = compact(L.ServiceSchema, [create(L.ServiceSchema, { Ports: Array.from({ length: 1 + rnd(2) }, port) })])[0];
    const values = JSON.stringify(svc.Ports.map((p) => Object.values(p)));
    const shared = sharedPorts(svc.Ports);
    assert.deepEqual(shared, svc.Ports);
    const had = seen.get(values);
    if (had) assert.equal(shared, had, `list ${i}: the list of the same values`);
    else {
      for (const other of seen.values()) assert.notEqual(shared, other, `list ${i}: not another values' list`);
      seen.set(values, shared);
    }
  }
  assert.ok(seen.size > 100);
});

test('decoded endpoints with the same PortOverrides share one frozen list; other lists are their own; values and encodings unchanged', () => {
  const ep = (ip: string, port: number) => newEndpoint({ IPs: { V4: [ip] }, PortOverrides: [{ Name: 'http', Port: port, Protocol: L.Protocol.TCP }], NodeName: 'n1' });
  const sent = [ep('10.0.0.1', 8080), ep('10.0.0.2', 8080), ep('10.0.0.3', 9090)];
  const [a, b, c] = sent.map((e) => decodeEndpoint(encodeEndpoint(e)));
  assert.equal(a.PortOverrides, b.PortOverrides, 'one list for the same content');
  assert.ok(Object.isFrozen(a.PortOverrides) && Object.isFrozen(a.PortOverrides[0]));
  assert.throws(() => a.PortOverrides.push(create(L.PortNameSchema, { Name: 'x' })), TypeError);
  assert.throws(() => (a.PortOverrides[0].Port = 1), TypeError);
  assert.notEqual(c.PortOverrides, a.PortOverrides, 'another port: a list of its own');
  assert.deepEqual(c.PortOverrides.map((p) => [p.Name, p.Port, p.Protocol]), [['http', 9090, L.Protocol.TCP]]);
  assert.notEqual(a.IPs, b.IPs);
  [a, b, c].forEach((d, i) => {
    assert.ok(equals(L.EndpointSchema, d, sent[i]));
    assert.deepEqual(encodeEndpoint(d), encodeEndpoint(sent[i]));
  });
  // names that could run together in a key are told apart; empty lists stay the shared empty one
  const names = (...ns: string[]) => ns.map((Name) => create(L.PortNameSchema, { Name, Port: 1 }));
  const x = sharedPortNames(compact(L.EndpointSchema, [newEndpoint({ PortOverrides: names('a1', 'b') })])[0].PortOverrides);
  const y = sharedPortNames(compact(L.EndpointSchema, [newEndpoint({ PortOverrides: names('a', '1b') })])[0].PortOverrides);
  assert.notEqual(x, y);
  assert.deepEqual(y.map((p) => p.Name), ['a', '1b']);
  assert.equal(decodeEndpoint(encodeEndpoint(newEndpoint({ NodeName: 'n' }))).PortOverrides.length, 0);
});

test('compactOne (one message, no memo) makes what compact makes: the same fields in the same order, the same shared frozen parts, the same encoding', () => {
  const random = randomMessages(17);
  /** the same shape: equal values, and a shared (frozen) part where compact's has one */
  const same = (a: unknown, b: unknown, at: string): void => {
    if (typeof b !== 'object' || b === null || b instanceof Uint8Array) return assert.deepEqual(a, b, at);
    assert.equal(Object.isFrozen(a), Object.isFrozen(b), `${at}: frozen`);
    if (Object.isFrozen(b) && !Array.isArray(b)) assert.equal(a, b, `${at}: the shared frozen value`);
    if (Array.isArray(b) && b.length === 0) assert.equal(a, b, `${at}: the shared empty list`);
    assert.deepEqual(Object.keys(a as object), Object.keys(b), `${at}: fields in order`);
    for (const k of Object.keys(b)) same((a as Record<string, unknown>)[k], (b as Record<string, unknown>)[k], `${at}.${k}`);
  };
  for (let i = 0; i < 1500; i++) {
    const svc = random.service();
    const one = compactOne(L.ServiceSchema, svc);
    same(one, compact(L.ServiceSchema, [svc])[0], `service ${i}`);
    assert.notEqual(one, svc);
    assert.deepEqual(toBinary(L.ServiceSchema, one), toBinary(L.ServiceSchema, svc));
    const ep = random.endpoint();
    const epOne = compactOne(L.EndpointSchema, ep);
    same(epOne, compact(L.EndpointSchema, [ep])[0], `endpoint ${i}`);
    assert.deepEqual(toBinary(L.EndpointSchema, epOne), toBinary(L.EndpointSchema, ep));
  }
  // a part that appears twice in the message is copied twice: the same values
  const v4 = ['10.96.0.1'];
  const svc = create(L.ServiceSchema, { Name: 'twice', IPs: { ClusterIPs: { V4: v4 }, ExternalIPs: { V4: v4 } } });
  const one = compactOne(L.ServiceSchema, svc);
  assert.deepEqual(one.IPs!.ClusterIPs!.V4, v4);
  assert.deepEqual(one.IPs!.ExternalIPs!.V4, v4);
  assert.deepEqual(toBinary(L.ServiceSchema, one), toBinary(L.ServiceSchema, svc));
});
