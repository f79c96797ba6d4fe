// The userspace backend without packets (--dry-run): which Service addresses
// and NodePorts its table redirects, which it rejects, and that bad or
// unsupported input costs one Service, not the sync.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { pino } from 'pino';
import { syncedStore, service, slice, node, serviceCIDR } from '../helpers/k8s.js';
import { UserspaceProxier } from '../../src/backends/userspace/proxier.js';
import type { KubeProxyConfiguration } from '../../src/backends/shared/config.js';
import { driveProxier, printed, testConfig } from '../helpers/proxier-harness.js';

async function render(objects: Record<string, any>[], over: (c: KubeProxyConfiguration) => void = () => {}): Promise<string> {
  const { out, sink } = printed();
  const config = testConfig((c) => {
    c.clusterCIDRs = ['10.244.0.0/16'];
    over(c);
  });
  const proxier = new UserspaceProxier({ nodeName: 'n1', config, log: pino({ level: 'silent' }), dryRun: true, once: true, healthChecks: false, out: sink });
  const h = driveProxier(syncedStore(objects), proxier);
  await h.sync();
  await h.close();
  return out.join('');
}

const base = [node('n1', undefined, ['192.168.0.2']), serviceCIDR('kubernetes', ['10.96.0.0/16'])];

test('Service IPs and NodePorts are redirected to listeners; a service port without endpoints is rejected instead', async () => {
  const text = await render([
    ...base,
    service(
      'ns',
      'web',
      { type: 'LoadBalancer', clusterIP: '10.96.0.10', externalIPs: ['198.51.100.1'], ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080, nodePort: 30080 }, { name: 'dns', port: 53, protocol: 'UDP', targetPort: 53, nodePort: 30053 }] },
      { status: { loadBalancer: { ingress: [{ ip: '198.51.100.2' }] } } },
    ),
    slice('ns', 'web-1', 'web', [{ ip: '10.244.1.1', node: 'n1' }], [{ name: 'http', port: 8080 }, { name: 'dns', port: 53, protocol: 'UDP' }]),
    service('ns', 'empty', { type: 'NodePort', clusterIP: '10.96.0.11', ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080, nodePort: 30081 }] }),
  ]);
  const elements = (set: string) => [...text.matchAll(new RegExp(`^add element inet kpng-userspace ${set} \\{ (.*) \\}$`, 'gm'))].flatMap((m) => m[1].split(', ')).sort();
  // dry run: no listeners, port 0
  assert.deepEqual(elements('service-ips-v4'), ['10.96.0.10 . tcp . 80 : 0', '10.96.0.10 . udp . 53 : 0', '198.51.100.1 . tcp . 80 : 0', '198.51.100.1 . udp . 53 : 0', '198.51.100.2 . tcp . 80 : 0', '198.51.100.2 . udp . 53 : 0']);
  assert.deepEqual(elements('nodeports-v4'), ['tcp . 30080 : 0', 'udp . 30053 : 0']);
  assert.deepEqual(elements('no-endpoint-services-v4'), ['10.96.0.11 . tcp . 80']);
  assert.deepEqual(elements('no-endpoint-nodeports-v4'), ['tcp . 30081']);
  // NodePorts on every local address by default (no nodeport-addresses set)
  assert.doesNotMatch(text, /nodeport-addresses-v4/);
  assert.match(text, /nat-output meta l4proto \{ tcp, udp \} dnat ip to ip saddr : ip daddr \. meta l4proto \. th dport map @service-ips-v4/);
});

test('terminating endpoints serve when no endpoint is ready (redirected, not rejected)', async () => {
  const text = await render([
    ...base,
    service('ns', 'going', { clusterIP: '10.96.0.12', ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }] }),
    slice('ns', 'going-1', 'going', [{ ip: '10.244.1.5', node: 'n1', ready: false, serving: true, terminating: true }]),
  ]);
  assert.match(text, /service-ips-v4 \{ 10\.96\.0\.12 \. tcp \. 80 : 0 \}/);
  assert.doesNotMatch(text, /add element inet kpng-userspace no-endpoint-services-v4/);
});

test('SCTP is rejected (Node has no SCTP sockets), the other Services still served; nodePortAddresses narrow NodePorts', async () => {
  const text = await render(
    [
      ...base,
      service('ns', 'sctp', { type: 'NodePort', clusterIP: '10.96.0.13', ports: [{ name: 's', port: 9, protocol: 'SCTP', targetPort: 9, nodePort: 30099 }] }),
      slice('ns', 'sctp-1', 'sctp', [{ ip: '10.244.1.6', node: 'n1' }], [{ name: 's', port: 9, protocol: 'SCTP' }]),
      service('ns', 'ok', { type: 'NodePort', clusterIP: '10.96.0.14', ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080, nodePort: 30014 }] }),
      slice('ns', 'ok-1', 'ok', [{ ip: '10.244.1.7', node: 'n1' }]),
    ],
    (c) => (c.nodePortAddresses = ['primary', 'localhost', '192.168.0.0/24']),
  );
  assert.match(text, /no-endpoint-services-v4 \{ 10\.96\.0\.13 \. sctp \. 9 \}/);
  assert.match(text, /no-endpoint-nodeports-v4 \{ sctp \. 30099 \}/);
  assert.match(text, /nodeports-v4 \{ tcp \. 30014 : 0 \}/);
  // the primary IP inside 192.168.0.0/24 goes (an interval set refuses overlaps)
  assert.match(text, /nodeport-addresses-v4 \{ 127\.0\.0\.0\/8, 192\.168\.0\.0\/24 \}/);
  assert.match(text, /nodeport-addresses-v6 \{ ::1\/128 \}/);
});
