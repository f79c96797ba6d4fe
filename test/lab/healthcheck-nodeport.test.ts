// healthCheckNodePort, as a cloud load balancer sees it (issue 12): for a
// LoadBalancer Service with externalTrafficPolicy Local, the node answers
// 200 with kube-proxy's JSON body and its count of local endpoints while it
// has one, 503 when it has none, and follows the endpoints as they come and
// go. Asked from outside the node, for every backend.
import { it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { node, service, slice } from '../helpers/k8s.js';
import { KpngLab, backendConfig, backendTag, describeBackends, pollUntil } from '../helpers/lab-kpng.js';

const NODE_IP = '192.168.0.2';
const HC_PORT = 30321;
const objects = (local: number, remote: number) => [
  node('node-a', undefined, [NODE_IP]),
  service(
    'demo',
    'lb',
    { type: 'LoadBalancer', clusterIP: '10.96.0.20', externalTrafficPolicy: 'Local', healthCheckNodePort: HC_PORT, ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080, nodePort: 30080 }] },
    { status: { loadBalancer: { ingress: [{ ip: '203.0.113.20' }] } } },
  ),
  slice('demo', 'lb-1', 'lb', [
    ...Array.from({ length: local }, (_, i) => ({ ip: `10.244.1.${10 + i}`, node: 'node-a' })),
    ...Array.from({ length: remote }, (_, i) => ({ ip: `10.244.2.${10 + i}`, node: 'node-b' })),
  ]),
];

await describeBackends('healthCheckNodePort', (b) => {
  let kl: KpngLab;
  before(async () => {
    kl = await KpngLab.create(
      b,
      { tag: `hc${backendTag(b)}`, node: { name: 'node-a', interfaces: [{ name: 'eth0', addresses: [`${NODE_IP}/24`] }] }, pods: [{ name: 'web-a', ips: ['10.244.1.10'] }, { name: 'web-b', ips: ['10.244.1.11'] }] },
      objects(1, 1),
      backendConfig(b, { clusterCIDR: '10.244.0.0/16', minSyncPeriod: '0s' }),
    );
    await kl.lab.serve('web-a', { tcp: [8080] });
    kl.start();
  });
  after(() => kl?.close());

  /** GET the health check from the world, outside the node */
  const ask = async (): Promise<{ code: number; body: any; weight: string }> => {
    // from an address of the world's (the lab routes its clients' sources back to it)
    const js = `const r = require('node:http').get({ host: '${NODE_IP}', port: ${HC_PORT}, path: '/healthz', localAddress: '203.0.113.9', timeout: 2000 }, (res) => { let b = ''; res.on('data', (d) => (b += d)); res.on('end', () => console.log(JSON.stringify({ code: res.statusCode, weight: res.headers['x-load-balancing-endpoint-weight'], body: b }))); }); r.on('timeout', () => r.destroy(new Error('timeout'))); r.on('error', (e) => console.log(JSON.stringify({ code: 0, body: String(e) })));`;
    const r = await kl.lab.exec('world', [process.execPath, '-e', js]);
    const o = JSON.parse(r.stdout.trim() || '{"code":0,"body":""}');
    let body: unknown = o.body;
    try {
      body = JSON.parse(o.body);
    } catch {
      // not JSON: kept as text for the message
    }
    return { code: o.code, body, weight: o.weight ?? '' };
  };

  it("answers 200 with kube-proxy's body while a local endpoint is there, 503 without, and follows the endpoints", async () => {
    const up = await pollUntil(ask, (r) => r.code === 200, 20_000, 200);
    assert.equal(up.value.code, 200, JSON.stringify(up.value));
    assert.deepEqual(up.value.body, { service: { namespace: 'demo', name: 'lb' }, localEndpoints: 1, serviceProxyHealthy: true });
    assert.equal(up.value.weight, '1');
    // two local endpoints: counted
    kl.setState(objects(2, 1));
    const two = await pollUntil(ask, (r) => r.code === 200 && (r.body as { localEndpoints?: number }).localEndpoints === 2, 15_000, 200);
    assert.ok(two.ok, JSON.stringify(two.value));
    // only remote endpoints: this node must not get the LB's traffic
    kl.setState(objects(0, 2));
    const down = await pollUntil(ask, (r) => r.code === 503, 15_000, 200);
    assert.ok(down.ok, JSON.stringify(down.value));
    assert.deepEqual(down.value.body, { service: { namespace: 'demo', name: 'lb' }, localEndpoints: 0, serviceProxyHealthy: true });
    // back
    kl.setState(objects(1, 0));
    const back = await pollUntil(ask, (r) => r.code === 200, 15_000, 200);
    assert.ok(back.ok, JSON.stringify(back.value));
    assert.equal((back.value.body as { localEndpoints: number }).localEndpoints, 1);
  });
});
