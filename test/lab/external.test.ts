// NodePort and LoadBalancer traffic from outside the cluster (the world's
// clients), with endpoints on this node and on another one (node-b, behind
// its own link), for every backend.
import { it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { Lab, POD_GATEWAY, describeOutcome, seenSource, verdict } from '../../src/lab/index.js';
import { node, service, serviceCIDR, slice } from '../helpers/k8s.js';
import { answeredBy, applyOnce, backendConfig, backendTag, describeBackends } from '../helpers/lab-kpng.js';

const NODE_IP = '192.168.0.2';
const LB_LOCAL = '198.51.100.10';
const LB_RANGES = '198.51.100.20';

const objects = [
  node('node-a', undefined, [NODE_IP]),
  node('node-b', undefined, ['192.168.50.3']),
  serviceCIDR('kubernetes', ['10.96.0.0/16']),
  // eTP=Cluster NodePort: both endpoints, masqueraded
  service('demo', 'np', { type: 'NodePort', clusterIP: '10.96.0.11', externalTrafficPolicy: 'Cluster', ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080, nodePort: 30080 }] }),
  slice('demo', 'np-1', 'np', [{ ip: '10.244.1.10', node: 'node-a' }, { ip: '10.244.2.10', node: 'node-b' }]),
  // eTP=Local LoadBalancer: only this node's endpoint, client address kept
  service(
    'demo',
    'lb',
    { type: 'LoadBalancer', clusterIP: '10.96.0.12', externalTrafficPolicy: 'Local', healthCheckNodePort: 32000, ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080, nodePort: 30081 }] },
    { status: { loadBalancer: { ingress: [{ ip: LB_LOCAL, ipMode: 'VIP' }] } } },
  ),
  slice('demo', 'lb-1', 'lb', [{ ip: '10.244.1.10', node: 'node-a' }, { ip: '10.244.2.10', node: 'node-b' }]),
  // source ranges: one client in, one out
  service(
    'demo',
    'fw',
    { type: 'LoadBalancer', clusterIP: '10.96.0.13', loadBalancerSourceRanges: ['203.0.113.0/25'], ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080, nodePort: 30082 }] },
    { status: { loadBalancer: { ingress: [{ ip: LB_RANGES }] } } },
  ),
  slice('demo', 'fw-1', 'fw', [{ ip: '10.244.1.10', node: 'node-a' }]),
  // eTP=Local with its only endpoint elsewhere, and a Service without endpoints
  service('demo', 'far', { type: 'NodePort', clusterIP: '10.96.0.14', externalTrafficPolicy: 'Local', externalIPs: ['198.51.100.30'], ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080, nodePort: 30083 }] }),
  slice('demo', 'far-1', 'far', [{ ip: '10.244.2.10', node: 'node-b' }]),
  service('demo', 'none', { type: 'NodePort', clusterIP: '10.96.0.15', ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080, nodePort: 30084 }] }),
];

await describeBackends('NodePort and LoadBalancer from outside', (b) => {
  let lab: Lab;
  before(async () => {
    lab = await Lab.create({
      tag: `ext${backendTag(b)}`,
      node: { name: 'node-a', interfaces: [{ name: 'eth0', addresses: [`${NODE_IP}/24`] }] },
      peers: [{ name: 'node-b', ips: ['192.168.50.3'] }],
      pods: [
        { name: 'web-a', ips: ['10.244.1.10'] },
        { name: 'web-b', ips: ['10.244.2.10'], node: 'node-b' },
        { name: 'client', ips: ['10.244.1.50'] },
      ],
    });
    // the world answers what kpng leaves alone ("")
    await Promise.all([lab.serve('web-a', { tcp: [8080] }), lab.serve('web-b', { tcp: [8080] }), lab.serve('world', { tcp: [80] })]);
    await applyOnce(b, lab, objects, backendConfig(b, { clusterCIDR: '10.244.0.0/16' }));
  });
  after(() => lab?.close());

  it("NodePort (eTP=Cluster) from an external client: both nodes' endpoints, masqueraded", async () => {
    const out = await lab.burst({ from: '203.0.113.2', to: NODE_IP, port: 30080, count: 24 });
    assert.deepEqual(answeredBy(out), ['10.244.1.10:8080', '10.244.2.10:8080'], out.map(describeOutcome).join('\n'));
    for (const o of out) assert.equal(seenSource(o), POD_GATEWAY[4], describeOutcome(o));
  });

  it('LoadBalancer IP (eTP=Local) from an external client: only the local endpoint, client address kept', async () => {
    const out = await lab.burst({ from: '203.0.113.2', to: LB_LOCAL, port: 80, count: 16 });
    assert.deepEqual(answeredBy(out), ['10.244.1.10:8080'], `${LB_LOCAL}:80`);
    for (const o of out) assert.equal(seenSource(o), '203.0.113.2');
  });

  it('NodePort of the eTP=Local Service from outside: only the local endpoint, client address kept', async () => {
    const out = await lab.burst({ from: '203.0.113.2', to: NODE_IP, port: 30081, count: 16 });
    assert.deepEqual(answeredBy(out), ['10.244.1.10:8080'], `${NODE_IP}:30081`);
    for (const o of out) assert.equal(seenSource(o), '203.0.113.2');
  });

  it('a pod reaching the eTP=Local LoadBalancer IP gets every endpoint, unmasqueraded', async () => {
    const out = await lab.burst({ from: '10.244.1.50', to: LB_LOCAL, port: 80, count: 24 });
    assert.deepEqual(answeredBy(out), ['10.244.1.10:8080', '10.244.2.10:8080']);
    for (const o of out) assert.equal(seenSource(o), '10.244.1.50');
  });

  it('loadBalancerSourceRanges: an allowed client is answered, another is dropped, the NodePort is not filtered', async () => {
    const [ok, blocked, nodePort] = await Promise.all([
      lab.connect({ from: '203.0.113.2', to: LB_RANGES, port: 80 }),
      lab.connect({ from: '203.0.113.200', to: LB_RANGES, port: 80 }),
      lab.connect({ from: '203.0.113.200', to: NODE_IP, port: 30082 }),
    ]);
    assert.equal(verdict(ok, LB_RANGES, 80), '10.244.1.10:8080', describeOutcome(ok));
    assert.equal(verdict(blocked, LB_RANGES, 80), 'DROP', describeOutcome(blocked));
    assert.equal(verdict(nodePort, NODE_IP, 30082), '10.244.1.10:8080', describeOutcome(nodePort));
  });

  it('eTP=Local without a local endpoint: outside traffic dropped, pods still served; no endpoints at all: rejected', async () => {
    const [extIP, np, pod, none, noneNP] = await Promise.all([
      lab.connect({ from: '203.0.113.2', to: '198.51.100.30', port: 80, timeoutMs: 800 }),
      lab.connect({ from: '203.0.113.2', to: NODE_IP, port: 30083, timeoutMs: 800 }),
      lab.connect({ from: '10.244.1.50', to: '198.51.100.30', port: 80 }),
      lab.connect({ from: '10.244.1.50', to: '10.96.0.15', port: 80 }),
      lab.connect({ from: '203.0.113.2', to: NODE_IP, port: 30084 }),
    ]);
    assert.equal(verdict(extIP, '198.51.100.30', 80), 'DROP', describeOutcome(extIP));
    assert.equal(verdict(np, NODE_IP, 30083), 'DROP', describeOutcome(np));
    assert.equal(verdict(pod, '198.51.100.30', 80), '10.244.2.10:8080', describeOutcome(pod));
    assert.equal(verdict(none, '10.96.0.15', 80), 'REJECT', describeOutcome(none));
    assert.equal(verdict(noneNP, NODE_IP, 30084), 'REJECT', describeOutcome(noneNP));
  });
});
