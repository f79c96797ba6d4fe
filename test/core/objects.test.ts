// Kubernetes objects to the model: what is kept, and bad input named by field.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { convertObject, flattenObjects } from '../../src/sources/objects.js';
import { service, slice, node, invalidField } from '../helpers/k8s.js';
import { canonicalIP, parseCIDR, cidrContains } from '../../src/api/ip.js';

const invalid = invalidField;

test('bad input is refused with the field that is wrong', () => {
  assert.equal(invalid(service('ns', 's', { clusterIP: '10.96.0.300' })), 'spec.clusterIPs[0]');
  assert.equal(invalid(service('ns', 's', { ports: [{ name: 'a', port: 70000 }] })), 'spec.ports[0].port');
  assert.equal(invalid(service('ns', 's', { ports: [{ name: 'a', port: '80' }] })), 'spec.ports[0].port');
  assert.equal(invalid(service('ns', 's', { ports: [{ name: 'a', port: 80, protocol: 'ICMP' }] })), 'spec.ports[0].protocol');
  assert.equal(invalid(service('ns', 's', { externalIPs: ['nope'] })), 'spec.externalIPs[0]');
  assert.equal(invalid(service('ns', 's', { loadBalancerSourceRanges: ['10.0.0.0/33'] })), 'spec.loadBalancerSourceRanges[0]');
  assert.equal(invalid({ kind: 'Service', metadata: { namespace: 'ns' }, spec: {} }), 'metadata.name');
  assert.equal(invalid({ kind: 'Service', metadata: { name: 's' }, spec: 'x' }), 'spec');
  assert.equal(invalid({ ...service('ns', 's'), spec: { ...service('ns', 's').spec, ports: { a: 1 } } }), 'spec.ports');
  assert.equal(invalid(slice('ns', 's-1', 's', [{ ip: '10.0.0.999' }])), 'endpoints[0].addresses[0]');
  assert.equal(invalid(slice('ns', 's-1', 's', [{ ip: 'fd00::1' }], undefined, { addressType: 'IPv4' })), 'endpoints[0].addresses[0]');
  assert.equal(invalid({ ...slice('ns', 's-1', 's', [{ ip: '10.0.0.1' }]), ports: [{ name: 'a', port: -1 }] }), 'ports[0].port');
  assert.equal(invalid(node('n', undefined, ['1.2.3'])), 'status.addresses[0].address');
  assert.equal(invalid({ kind: 'ServiceCIDR', metadata: { name: 'x' }, spec: { cidrs: ['10.96.0.0'] } }), 'spec.cidrs[0]');
});

test('what a proxy does not use is ignored, not refused', () => {
  assert.equal(convertObject({ kind: 'ConfigMap', metadata: { name: 'x' } }).kind, 'Ignored');
  const noLabel = slice('ns', 's-1', 's', [{ ip: '10.0.0.1' }]);
  delete noLabel.metadata.labels['kubernetes.io/service-name'];
  assert.equal(convertObject(noLabel).kind, 'Ignored');
  assert.equal(convertObject(slice('ns', 's-1', 's', [{ ip: '10.0.0.1' }], undefined, { labels: { 'service.kubernetes.io/headless': '' } })).kind, 'Ignored');
  assert.equal(convertObject({ ...slice('ns', 's-1', 's', []), addressType: 'FQDN' }).kind, 'Ignored');
});

test('a Service keeps what a proxy needs, in canonical form', () => {
  const c = convertObject(
    service(
      'ns',
      's',
      {
        type: 'LoadBalancer',
        clusterIPs: ['10.96.0.1', 'fd00:0:0::0:1'],
        externalIPs: ['192.0.2.1'],
        loadBalancerSourceRanges: [' 203.0.113.0/25'],
        externalTrafficPolicy: 'Local',
        sessionAffinity: 'ClientIP',
        ports: [{ name: 'http', port: 80, targetPort: 'web', nodePort: 30080 }],
      },
      {
        metadata: { labels: { app: 'x', 'service.kubernetes.io/service-proxy-name': 'kpng' }, resourceVersion: '5' },
        status: { loadBalancer: { ingress: [{ ip: '198.51.100.1' }, { ip: '198.51.100.2', ipMode: 'Proxy' }, { hostname: 'lb.example' }] } },
      },
    ),
  );
  assert.equal(c.kind, 'Service');
  if (c.kind !== 'Service') return;
  const s = c.service;
  assert.deepEqual(s.IPs!.ClusterIPs!.V4, ['10.96.0.1']);
  assert.deepEqual(s.IPs!.ClusterIPs!.V6, ['fd00::1']);
  assert.deepEqual(s.IPs!.LoadBalancerIPs!.V4, ['198.51.100.1']);
  assert.deepEqual(s.IPs!.ProxyLoadBalancerIPs!.V4, ['198.51.100.2']);
  assert.deepEqual(s.IPFilters[0].SourceRanges, ['203.0.113.0/25']);
  assert.equal(s.ExternalTrafficToLocal, true);
  assert.equal(s.SessionAffinity.case === 'ClientIP' && s.SessionAffinity.value.TimeoutSeconds, 10800);
  assert.equal(s.Ports[0].TargetPortName, 'web');
  assert.deepEqual(s.Labels, { 'service.kubernetes.io/service-proxy-name': 'kpng' });
});

test('a Node gives its primary IPs (InternalIP first, one per family), zone, pod CIDRs and deletion', () => {
  const c = convertObject({
    kind: 'Node',
    metadata: { name: 'n1', labels: { 'topology.kubernetes.io/zone': 'z1' }, deletionTimestamp: '2026-01-01T00:00:00Z' },
    spec: { podCIDRs: ['10.244.1.0/24', 'fd00:244:1::/64'] },
    status: {
      addresses: [
        { type: 'Hostname', address: 'n1' },
        { type: 'ExternalIP', address: '203.0.113.5' },
        { type: 'InternalIP', address: '192.168.0.2' },
        { type: 'InternalIP', address: '192.168.0.3' },
        { type: 'InternalIP', address: '2001:db8::2' },
      ],
    },
  });
  assert.equal(c.kind, 'Node');
  if (c.kind !== 'Node') return;
  assert.deepEqual(c.node.IPs!.V4, ['192.168.0.2']);
  assert.deepEqual(c.node.IPs!.V6, ['2001:db8::2']);
  assert.equal(c.node.Topology!.Zone, 'z1');
  assert.deepEqual(c.node.PodCIDRs, ['10.244.1.0/24', 'fd00:244:1::/64']);
  assert.equal(c.node.Deleting, true);
});

test('Lists are flattened, typed lists lend their kind to items', () => {
  const items = flattenObjects({ kind: 'ServiceList', items: [{ metadata: { name: 'a' } }, { kind: 'List', items: [{ kind: 'Node', metadata: { name: 'n' } }] }] });
  assert.deepEqual(items.map((i: any) => i.kind), ['Service', 'Node']);
});

test('IP helpers: canonical forms and CIDRs', () => {
  assert.equal(canonicalIP('2001:DB8:0:0:0:0:0:1'), '2001:db8::1');
  assert.equal(canonicalIP('::ffff:10.0.0.1'), '10.0.0.1');
  assert.equal(canonicalIP('2001:db8:0:1:0:0:0:0'), '2001:db8:0:1::');
  assert.equal(canonicalIP('1:0:0:1:0:0:0:1'), '1:0:0:1::1');
  assert.equal(canonicalIP('1:0:0:1:0:0:1:1'), '1::1:0:0:1:1');
  assert.equal(canonicalIP('300.1.1.1'), undefined);
  assert.deepEqual(parseCIDR(' 10.1.2.3/16'), { ip: '10.1.0.0', prefix: 16, family: 4 });
  assert.equal(parseCIDR('fd00::1/64')!.ip, 'fd00::');
  assert.ok(cidrContains(parseCIDR('10.0.0.0/8')!, '10.180.0.1'));
  assert.ok(!cidrContains(parseCIDR('10.0.0.0/8')!, '11.0.0.1'));
  assert.ok(!cidrContains(parseCIDR('10.0.0.0/8')!, 'fd00::1'));
});
