// convertSlice builds its messages as literals: each must be what protobuf-es's
// create() gives (every field, its default when not set, no field a message leaves unset).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { create, fromBinary, toBinary } from '@bufbuild/protobuf';
import { EndpointInfoSchema } from '../../src/api/gen/api/globalv1/api_pb.js';
import { ServiceSchema } from '../../src/api/gen/api/localv1/api_pb.js';
import { convertObject } from '../../src/sources/objects.js';
import { service, slice } from '../helpers/k8s.js';

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

test('converted Services are complete messages, as create() and a decode make them', () => {
  const objects = [
    service('ns', 'plain'),
    service('ns', 'lb', {
      type: 'LoadBalancer',
      clusterIP: '10.96.0.2',
      externalIPs: ['192.0.2.1'],
      loadBalancerSourceRanges: ['10.0.0.0/8'],
      externalTrafficPolicy: 'Local',
      internalTrafficPolicy: 'Local',
      healthCheckNodePort: 30001,
      sessionAffinity: 'ClientIP',
      sessionAffinityConfig: { clientIP: { timeoutSeconds: 60 } },
      trafficDistribution: 'PreferClose',
      ports: [
        { name: 'http', port: 80, targetPort: 'web', nodePort: 30080 },
        { name: 'dns', port: 53, protocol: 'UDP', targetPort: 5353 },
      ],
    }, { metadata: { labels: { 'service.kubernetes.io/topology-mode': 'Auto', app: 'x' }, annotations: { 'kpng.io/ipvs-scheduler': 'wrr' } }, status: { loadBalancer: { ingress: [{ ip: '198.51.100.1' }, { ip: '198.51.100.2', ipMode: 'Proxy' }] } } }),
    service('ns', 'headless', { clusterIP: 'None' }),
    service('ns', 'dual', { clusterIP: '10.96.0.3', clusterIPs: ['10.96.0.3', 'fd00::3'] }),
  ];
  for (const o of objects) {
    const c = convertObject(o);
    assert.equal(c.kind, 'Service');
    if (c.kind !== 'Service') continue;
    const svc = c.service;
    assert.deepStrictEqual(fromBinary(ServiceSchema, toBinary(ServiceSchema, svc)), svc);
    assert.deepStrictEqual(create(ServiceSchema, structuredClone(svc)), svc);
  }
});
