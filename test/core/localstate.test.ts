// Node-local semantics, table-driven: which endpoints a node uses for which
// traffic, as upstream kube-proxy decides it (pkg/proxy/topology.go).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { syncedStore, service, slice, node } from '../helpers/k8s.js';
import { computeServiceView, type ServiceView } from '../../src/localstate/service-view.js';

/** "ip:port scopes [local] [terminating]" per endpoint and port, sorted */
function render(v: ServiceView | undefined): string[] | 'absent' {
  if (!v) return 'absent';
  const out: string[] = [];
  for (const e of v.endpoints) {
    const s = e.endpoint.Scopes!;
    const scopes = `${s.Internal ? 'I' : '-'}${s.External ? 'E' : '-'}${s.Cluster ? 'C' : '-'}`;
    for (const p of e.endpoint.PortOverrides) {
      for (const ip of [...e.endpoint.IPs!.V4, ...e.endpoint.IPs!.V6]) {
        out.push(`${ip}:${p.Port}${p.Name ? '/' + p.Name : ''} ${scopes}${e.endpoint.Local ? ' local' : ''}${e.endpoint.Terminating ? ' terminating' : ''}`);
      }
    }
  }
  return out.sort();
}

function view(objects: Record<string, any>[], nodeName: string, key = 'ns/svc', proxyName = ''): ServiceView | undefined {
  const store = syncedStore(objects);
  const n = store.getNode(nodeName)?.node;
  const svc = store.getService(key);
  if (!svc) return undefined;
  return computeServiceView(svc.service, store.slicesOfService(key), { name: nodeName, zone: n?.Topology?.Zone ?? '' }, proxyName);
}

const nodes = [node('a', 'z1'), node('b', 'z2'), node('c', 'z1')];
const np = { type: 'NodePort', ports: [{ name: 'http', port: 80, nodePort: 30080 }] };

interface Case {
  name: string;
  objects: Record<string, any>[];
  node: string;
  want: string[] | 'absent';
  hasEndpoints?: boolean;
  proxyName?: string;
}

const cases: Case[] = [
  {
    name: 'ready endpoints are used; not-ready ones are not',
    objects: [...nodes, service('ns', 'svc'), slice('ns', 'svc-1', 'svc', [{ ip: '10.0.0.1', node: 'a' }, { ip: '10.0.0.2', node: 'b', ready: false, serving: false }])],
    node: 'a',
    want: ['10.0.0.1:8080/http IEC local'],
  },
  {
    name: 'no ready endpoint: serving+terminating ones are the fallback; not serving ones never',
    objects: [
      ...nodes,
      service('ns', 'svc'),
      slice('ns', 'svc-1', 'svc', [
        { ip: '10.0.0.1', node: 'a', ready: false, serving: true, terminating: true },
        { ip: '10.0.0.2', node: 'b', ready: false, serving: false, terminating: true },
        { ip: '10.0.0.3', node: 'b', ready: false, serving: false, terminating: false },
      ]),
    ],
    node: 'b',
    want: ['10.0.0.1:8080/http IEC terminating'],
  },
  {
    name: 'a ready endpoint anywhere wins over terminating ones',
    objects: [
      ...nodes,
      service('ns', 'svc'),
      slice('ns', 'svc-1', 'svc', [{ ip: '10.0.0.1', node: 'a', ready: false, serving: true, terminating: true }, { ip: '10.0.0.2', node: 'b' }]),
    ],
    node: 'a',
    want: ['10.0.0.2:8080/http IEC'],
  },
  {
    name: 'internalTrafficPolicy Local: only local endpoints, remote ones not even sent',
    objects: [...nodes, service('ns', 'svc', { internalTrafficPolicy: 'Local' }), slice('ns', 'svc-1', 'svc', [{ ip: '10.0.0.1', node: 'a' }, { ip: '10.0.0.2', node: 'b' }])],
    node: 'a',
    want: ['10.0.0.1:8080/http I-- local'],
  },
  {
    name: 'internalTrafficPolicy Local without a local endpoint: none, but the port still has endpoints (DROP, not REJECT)',
    objects: [...nodes, service('ns', 'svc', { internalTrafficPolicy: 'Local' }), slice('ns', 'svc-1', 'svc', [{ ip: '10.0.0.2', node: 'b' }])],
    node: 'a',
    want: [],
    hasEndpoints: true,
  },
  {
    name: 'no endpoint anywhere: REJECT',
    objects: [...nodes, service('ns', 'svc', { internalTrafficPolicy: 'Local' })],
    node: 'a',
    want: [],
    hasEndpoints: false,
  },
  {
    name: 'externalTrafficPolicy Local: external scope is local only; cluster scope kept for pod/node short-circuit',
    objects: [...nodes, service('ns', 'svc', { ...np, externalTrafficPolicy: 'Local' }), slice('ns', 'svc-1', 'svc', [{ ip: '10.0.0.1', node: 'a' }, { ip: '10.0.0.2', node: 'b' }])],
    node: 'a',
    want: ['10.0.0.1:8080/http IEC local', '10.0.0.2:8080/http I-C'],
  },
  {
    name: 'both policies Local on an external service: internal and external local, cluster set still for short-circuit',
    objects: [
      ...nodes,
      service('ns', 'svc', { ...np, externalTrafficPolicy: 'Local', internalTrafficPolicy: 'Local' }),
      slice('ns', 'svc-1', 'svc', [{ ip: '10.0.0.1', node: 'a' }, { ip: '10.0.0.2', node: 'b' }]),
    ],
    node: 'a',
    want: ['10.0.0.1:8080/http IEC local', '10.0.0.2:8080/http --C'],
  },
  {
    name: 'externalTrafficPolicy Local, local endpoint terminating: local fallback to it while ready remote ones serve the cluster',
    objects: [
      ...nodes,
      service('ns', 'svc', { ...np, externalTrafficPolicy: 'Local' }),
      slice('ns', 'svc-1', 'svc', [{ ip: '10.0.0.1', node: 'a', ready: false, serving: true, terminating: true }, { ip: '10.0.0.2', node: 'b' }]),
    ],
    node: 'a',
    want: ['10.0.0.1:8080/http -E- local terminating', '10.0.0.2:8080/http I-C'],
  },
  {
    name: 'zone hints honoured when every endpoint has one and the node zone is known',
    objects: [
      ...nodes,
      service('ns', 'svc'),
      slice('ns', 'svc-1', 'svc', [
        { ip: '10.0.0.1', node: 'a', zoneHints: ['z1'] },
        { ip: '10.0.0.2', node: 'b', zoneHints: ['z2'] },
        { ip: '10.0.0.3', node: 'c', zoneHints: ['z1'] },
      ]),
    ],
    node: 'c',
    want: ['10.0.0.1:8080/http IEC', '10.0.0.3:8080/http IEC local'],
  },
  {
    name: 'zone hints ignored when one ready endpoint lacks them',
    objects: [
      ...nodes,
      service('ns', 'svc'),
      slice('ns', 'svc-1', 'svc', [{ ip: '10.0.0.1', node: 'a', zoneHints: ['z1'] }, { ip: '10.0.0.2', node: 'b' }]),
    ],
    node: 'a',
    want: ['10.0.0.1:8080/http IEC local', '10.0.0.2:8080/http IEC'],
  },
  {
    name: 'zone hints ignored when the node zone is unknown',
    objects: [node('x'), service('ns', 'svc'), slice('ns', 'svc-1', 'svc', [{ ip: '10.0.0.1', zoneHints: ['z1'] }, { ip: '10.0.0.2', zoneHints: ['z2'] }])],
    node: 'x',
    want: ['10.0.0.1:8080/http IEC', '10.0.0.2:8080/http IEC'],
  },
  {
    name: 'zone hints ignored when none is for this zone (fall back to all)',
    objects: [node('x', 'z9'), service('ns', 'svc'), slice('ns', 'svc-1', 'svc', [{ ip: '10.0.0.1', zoneHints: ['z1'] }, { ip: '10.0.0.2', zoneHints: ['z2'] }])],
    node: 'x',
    want: ['10.0.0.1:8080/http IEC', '10.0.0.2:8080/http IEC'],
  },
  {
    name: 'not-ready endpoints do not count for the hint safeguard',
    objects: [
      ...nodes,
      service('ns', 'svc'),
      slice('ns', 'svc-1', 'svc', [{ ip: '10.0.0.1', node: 'a', zoneHints: ['z1'] }, { ip: '10.0.0.2', node: 'b', zoneHints: ['z2'] }, { ip: '10.0.0.9', ready: false, serving: false }]),
    ],
    node: 'a',
    want: ['10.0.0.1:8080/http IEC local'],
  },
  {
    name: 'trafficDistribution PreferSameNode: node hints pick this node\'s endpoint',
    objects: [
      ...nodes,
      service('ns', 'svc', { trafficDistribution: 'PreferSameNode' }),
      slice('ns', 'svc-1', 'svc', [
        { ip: '10.0.0.1', node: 'a', zoneHints: ['z1'], nodeHints: ['a'] },
        { ip: '10.0.0.2', node: 'b', zoneHints: ['z2'], nodeHints: ['b'] },
        { ip: '10.0.0.3', node: 'c', zoneHints: ['z1'], nodeHints: ['c'] },
      ]),
    ],
    node: 'a',
    want: ['10.0.0.1:8080/http IEC local'],
  },
  {
    name: 'trafficDistribution PreferSameNode, no endpoint on this node: falls back to same zone',
    objects: [
      node('d', 'z1'),
      ...nodes,
      service('ns', 'svc', { trafficDistribution: 'PreferSameNode' }),
      slice('ns', 'svc-1', 'svc', [
        { ip: '10.0.0.1', node: 'a', zoneHints: ['z1'], nodeHints: ['a'] },
        { ip: '10.0.0.2', node: 'b', zoneHints: ['z2'], nodeHints: ['b'] },
      ]),
    ],
    node: 'd',
    want: ['10.0.0.1:8080/http IEC'],
  },
  {
    name: 'hints do not filter Local-policy endpoints',
    objects: [
      ...nodes,
      service('ns', 'svc', { internalTrafficPolicy: 'Local' }),
      slice('ns', 'svc-1', 'svc', [{ ip: '10.0.0.1', node: 'a', zoneHints: ['z2'] }, { ip: '10.0.0.2', node: 'b', zoneHints: ['z2'] }]),
    ],
    node: 'a',
    want: ['10.0.0.1:8080/http I-- local'],
  },
  {
    name: 'a service labelled for another proxy is left out',
    objects: [...nodes, service('ns', 'svc', {}, { metadata: { labels: { 'service.kubernetes.io/service-proxy-name': 'other' } } }), slice('ns', 'svc-1', 'svc', [{ ip: '10.0.0.1' }])],
    node: 'a',
    want: 'absent',
  },
  {
    name: 'a service labelled with our proxy name is ours',
    objects: [...nodes, service('ns', 'svc', {}, { metadata: { labels: { 'service.kubernetes.io/service-proxy-name': 'kpng' } } }), slice('ns', 'svc-1', 'svc', [{ ip: '10.0.0.1' }])],
    node: 'a',
    proxyName: 'kpng',
    want: ['10.0.0.1:8080/http IEC'],
  },
  {
    name: 'with a proxy name, unlabelled services are left to the default proxy',
    objects: [...nodes, service('ns', 'svc'), slice('ns', 'svc-1', 'svc', [{ ip: '10.0.0.1' }])],
    node: 'a',
    proxyName: 'kpng',
    want: 'absent',
  },
  {
    name: 'headless services are left out',
    objects: [...nodes, service('ns', 'svc', { clusterIP: 'None' }), slice('ns', 'svc-1', 'svc', [{ ip: '10.0.0.1' }])],
    node: 'a',
    want: 'absent',
  },
  {
    name: 'ExternalName services are left out',
    objects: [...nodes, service('ns', 'svc', { type: 'ExternalName', externalName: 'example.com', clusterIP: '' })],
    node: 'a',
    want: 'absent',
  },
  {
    name: 'target port by name: each slice gives its own port for the port name',
    objects: [
      ...nodes,
      service('ns', 'svc', { ports: [{ name: 'http', port: 80, targetPort: 'web' }] }),
      slice('ns', 'svc-1', 'svc', [{ ip: '10.0.0.1' }], [{ name: 'http', port: 8080 }]),
      slice('ns', 'svc-2', 'svc', [{ ip: '10.0.0.2' }], [{ name: 'http', port: 9090 }]),
    ],
    node: 'a',
    want: ['10.0.0.1:8080/http IEC', '10.0.0.2:9090/http IEC'],
  },
  {
    name: 'an endpoint whose slice lacks a service port does not serve it',
    objects: [
      ...nodes,
      service('ns', 'svc', { ports: [{ name: 'http', port: 80 }, { name: 'metrics', port: 9100 }] }),
      slice('ns', 'svc-1', 'svc', [{ ip: '10.0.0.1' }], [{ name: 'http', port: 8080 }, { name: 'metrics', port: 9100 }]),
      slice('ns', 'svc-2', 'svc', [{ ip: '10.0.0.2' }], [{ name: 'http', port: 8080 }]),
    ],
    node: 'a',
    want: ['10.0.0.1:8080/http IEC', '10.0.0.1:9100/metrics IEC', '10.0.0.2:8080/http IEC'],
  },
  {
    name: 'ports match by protocol too',
    objects: [
      ...nodes,
      service('ns', 'svc', { ports: [{ name: 'dns', port: 53, protocol: 'UDP' }] }),
      slice('ns', 'svc-1', 'svc', [{ ip: '10.0.0.1' }], [{ name: 'dns', port: 53, protocol: 'TCP' }]),
    ],
    node: 'a',
    want: [],
  },
  {
    name: 'an unnamed single port matches the unnamed slice port',
    objects: [...nodes, service('ns', 'svc', { ports: [{ port: 80, targetPort: 8080 }] }), slice('ns', 'svc-1', 'svc', [{ ip: '10.0.0.1' }], [{ port: 8080 }])],
    node: 'a',
    want: ['10.0.0.1:8080 IEC'],
  },
  {
    name: 'the same endpoint in two slices is used once',
    objects: [...nodes, service('ns', 'svc'), slice('ns', 'svc-1', 'svc', [{ ip: '10.0.0.1', pod: 'p1' }]), slice('ns', 'svc-2', 'svc', [{ ip: '10.0.0.1', pod: 'p1' }])],
    node: 'a',
    want: ['10.0.0.1:8080/http IEC'],
  },
];

for (const c of cases) {
  test(c.name, () => {
    const v = view(c.objects, c.node, 'ns/svc', c.proxyName);
    assert.deepEqual(render(v), c.want);
    if (c.hasEndpoints !== undefined) assert.equal(v!.service.Ports[0].HasEndpointsV4, c.hasEndpoints);
  });
}

test('a dual-stack pod is one endpoint with both addresses, named by its pod', () => {
  const v = view(
    [
      ...nodes,
      service('ns', 'svc', { clusterIPs: ['10.96.0.1', 'fd00::1'] }),
      slice('ns', 'svc-4', 'svc', [{ ip: '10.0.0.1', pod: 'p1', node: 'a' }]),
      slice('ns', 'svc-6', 'svc', [{ ip: 'fd00::a', pod: 'p1', node: 'a' }]),
    ],
    'a',
  )!;
  assert.equal(v.endpoints.length, 1);
  assert.equal(v.endpoints[0].path, 'ns/svc/p1');
  assert.deepEqual(v.endpoints[0].endpoint.IPs!.V4, ['10.0.0.1']);
  assert.deepEqual(v.endpoints[0].endpoint.IPs!.V6, ['fd00::a']);
  assert.equal(v.service.Ports[0].HasEndpointsV4, true);
  assert.equal(v.service.Ports[0].HasEndpointsV6, true);
});

test('a dual-stack pod used differently per family is split, the second part anonymous', () => {
  const v = view(
    [
      ...nodes,
      service('ns', 'svc'),
      slice('ns', 'svc-4', 'svc', [{ ip: '10.0.0.1', pod: 'p1', node: 'a' }]),
      slice('ns', 'svc-6', 'svc', [{ ip: 'fd00::a', pod: 'p1', node: 'a', ready: false, serving: true, terminating: true }]),
    ],
    'a',
  )!;
  assert.equal(v.endpoints.length, 2);
  assert.deepEqual(v.endpoints.filter((e) => e.named).map((e) => e.path), ['ns/svc/p1']);
  assert.match(v.endpoints.find((e) => !e.named)!.path, /^ns\/svc\/[0-9a-f]{16}$/);
});

test('endpoints without pod name get stable hash paths', () => {
  const objs = [...nodes, service('ns', 'svc'), slice('ns', 'svc-1', 'svc', [{ ip: '10.0.0.1' }, { ip: '10.0.0.2' }])];
  const a = view(objs, 'a')!.endpoints.map((e) => e.path);
  const b = view(objs, 'a')!.endpoints.map((e) => e.path);
  assert.deepEqual(a, b);
  assert.equal(new Set(a).size, 2);
  for (const p of a) assert.match(p, /^ns\/svc\/[0-9a-f]{16}$/);
});

test('a view computed without its encodings (a node agent, to-file --once) is the encoded one: same paths, hash paths included, and same bytes when read', () => {
  const extra: Case[] = [
    { name: 'anonymous', objects: [...nodes, service('ns', 'svc'), slice('ns', 'svc-1', 'svc', [{ ip: '10.0.0.1' }, { ip: '10.0.0.2', node: 'a' }, { ip: '10.0.0.2' }])], node: 'a', want: [] },
    {
      name: 'dual-stack split',
      objects: [
        ...nodes,
        service('ns', 'svc'),
        slice('ns', 'svc-4', 'svc', [{ ip: '10.0.0.1', pod: 'p1', node: 'a' }]),
        slice('ns', 'svc-6', 'svc', [{ ip: 'fd00::a', pod: 'p1', node: 'a', ready: false, serving: true, terminating: true }]),
      ],
      node: 'a',
      want: [],
    },
  ];
  let anonymous = 0;
  for (const c of [...cases, ...extra]) {
    const store = syncedStore(c.objects);
    const svc = store.getService('ns/svc');
    if (!svc) continue;
    const ctx = { name: c.node, zone: store.getNode(c.node)?.node.Topology?.Zone ?? '' };
    const enc = computeServiceView(svc.service, store.slicesOfService('ns/svc'), ctx, c.proxyName ?? '', true);
    const dec = computeServiceView(svc.service, store.slicesOfService('ns/svc'), ctx, c.proxyName ?? '', false);
    if (!enc || !dec) {
      assert.equal(enc, dec, c.name);
      continue;
    }
    const shape = (v: ServiceView) => ({ key: v.key, service: [...v.bytes], endpoints: v.endpoints.map((e) => ({ path: e.path, named: e.named, bytes: [...e.bytes] })) });
    assert.deepEqual(shape(dec), shape(enc), c.name);
    anonymous += enc.endpoints.filter((e) => !e.named).length;
  }
  assert.ok(anonymous >= 3, `anonymous endpoints compared: ${anonymous}`);
});

test('endpoints that map ports the same way share one frozen PortOverrides list, across Services', () => {
  const objs = [
    ...nodes,
    service('ns', 'svc'),
    service('ns', 'other', { clusterIP: '10.96.0.2' }),
    service('ns', 'third', { clusterIP: '10.96.0.3' }),
    slice('ns', 'svc-1', 'svc', [{ ip: '10.0.0.1', node: 'a' }, { ip: '10.0.0.2', node: 'b' }]),
    slice('ns', 'other-1', 'other', [{ ip: '10.0.0.3', node: 'a' }]),
    slice('ns', 'third-1', 'third', [{ ip: '10.0.0.4', node: 'a' }], [{ name: 'http', port: 9090 }]),
  ];
  const [a, b] = view(objs, 'a')!.endpoints.map((e) => e.endpoint);
  const [c] = view(objs, 'a', 'ns/other')!.endpoints.map((e) => e.endpoint);
  const [d] = view(objs, 'a', 'ns/third')!.endpoints.map((e) => e.endpoint);
  assert.equal(a.PortOverrides, b.PortOverrides);
  assert.equal(a.PortOverrides, c.PortOverrides, 'another Service, the same list');
  assert.ok(Object.isFrozen(a.PortOverrides) && Object.isFrozen(a.PortOverrides[0]));
  assert.notEqual(d.PortOverrides, a.PortOverrides);
  assert.deepEqual(a.PortOverrides.map((p) => [p.Name, p.Port]), [['http', 8080]]);
  assert.deepEqual(d.PortOverrides.map((p) => [p.Name, p.Port]), [['http', 9090]]);
});

test("a Service with one port and IPv4 endpoints (computed the short way) has the view the general way computes: 3,000 random Services", () => {
  // a seeded generator: the same Services each run
  let seed = 12345;
  // mulberry32
  const rnd = (n: number) => {
    let t = (seed = (seed + 0x6d2b79f5) | 0);
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return Math.floor((((t ^ (t >>> 14)) >>> 0) / 4294967296) * n);
  };
  const pick = <T>(xs: readonly T[]): T => xs[rnd(xs.length)];
  const nodeNames = ['a', 'b', 'c', ''];
  let short = 0;
  let scanned = 0;
  for (let i = 0; i < 3000; i++) {
    const type = pick(['ClusterIP', 'NodePort', 'LoadBalancer']);
    const port = { name: pick(['http', '', 'dns']), port: 80, protocol: pick(['TCP', 'TCP', 'UDP']), ...(type === 'ClusterIP' ? {} : { nodePort: 30080 }) };
    const spec: Record<string, unknown> = { type, ports: [port] };
    if (rnd(3) === 0) spec.internalTrafficPolicy = 'Local';
    if (type !== 'ClusterIP' && rnd(3) === 0) spec.externalTrafficPolicy = 'Local';
    const objs: Record<string, any>[] = [...nodes, service('ns', 'svc', spec, type === 'LoadBalancer' ? { status: { loadBalancer: { ingress: [{ ip: '198.51.100.1' }] } } } : {})];
    const hinted = rnd(4) === 0;
    for (let s = 0, slices = 1 + rnd(3); s < slices; s++) {
      const eps = Array.from({ length: rnd(6) }, () => {
        const ready = rnd(5) !== 0;
        return {
          // few addresses: some are in two slices, with the same target port or another one
          ip: `10.0.0.${1 + rnd(12)}`,
          node: pick(nodeNames) || undefined,
          ready,
          serving: ready || rnd(2) === 0,
          terminating: !ready && rnd(2) === 0,
          pod: rnd(4) === 0 ? undefined : `p${rnd(6)}`,
          zoneHints: hinted && rnd(6) !== 0 ? [pick(['z1', 'z2'])] : undefined,
          nodeHints: hinted && rnd(6) === 0 ? [pick(['a', 'b'])] : undefined,
        };
      });
      objs.push(slice('ns', `svc-${s}`, 'svc', eps, [{ name: rnd(8) === 0 ? 'other' : port.name, port: rnd(3) === 0 ? 9090 : 8080, protocol: rnd(8) === 0 ? 'SCTP' : port.protocol }]));
    }
    const store = syncedStore(objs);
    const svc = store.getService('ns/svc')!;
    const at = pick(['a', 'b', 'c']);
    const ctx = { name: at, zone: store.getNode(at)?.node.Topology?.Zone ?? '' };
    for (const encoded of [true, false]) {
      const quick = computeServiceView(svc.service, store.slicesOfService('ns/svc'), ctx, '', encoded);
      const general = computeServiceView(svc.service, store.slicesOfService('ns/svc'), ctx, '', encoded, true);
      const shape = (v: ServiceView | undefined) => v && { key: v.key, service: v.service, bytes: [...v.bytes], endpoints: v.endpoints.map((e) => ({ path: e.path, named: e.named, endpoint: e.endpoint, bytes: [...e.bytes] })) };
      assert.deepEqual(shape(quick), shape(general), `Service ${i}: ${JSON.stringify(objs.slice(nodes.length))}`);
      // the same shared frozen port lists
      quick?.endpoints.forEach((e, k) => assert.equal(e.endpoint.PortOverrides, general!.endpoints[k].endpoint.PortOverrides));
    }
    if (new Set(store.slicesOfService('ns/svc').flatMap((sl) => sl.endpoints.map((e) => e.Endpoint?.IPs?.V4[0]))).size === store.slicesOfService('ns/svc').reduce((n, sl) => n + sl.endpoints.length, 0)) short++;
    // the store's slices are read without decoding them (scanned), but for one with an endpoint the scan does not take
    if (store.slicesOfService('ns/svc').every((sl) => sl.scanned?.())) scanned++;
  }
  assert.ok(short > 400, `Services with each address once: ${short}`);
  assert.ok(scanned > 2000, `Services whose slices were scanned: ${scanned}`);
});
