// kpng trace beyond the upstream scenarios, with real packets: ClientIP
// affinity, internalTrafficPolicy Local (with and without a local endpoint),
// externalTrafficPolicy Local without a local endpoint (LB IP and external
// IP), the node itself to a Local-policy cluster IP. The cases are a
// scenario in the flow data's schema, run by the same helpers: for every
// backend, kpng applied once in a lab, each case traced from the kernel's
// rules, then its packets sent, and both compared. With to-nft, ClientIP
// affinity is kernel state the trace reads: after the packets, the client's
// endpoint.
import { it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { Lab } from '../../src/lab/index.js';
import { applyOnce, backendTag, describeBackends, proxyMode } from '../helpers/lab-kpng.js';
import { checkFlow, compareTrace, configFor, flowTitle, labSpecFor, serveScenario, stateFor, traceInLab, type Flow, type Scenario } from '../helpers/lab-flows.js';
import { service, slice } from '../helpers/k8s.js';

const flow = (name: string, sourceIP: string, destIP: string, destPort: number, output: string, masq = false, protocol: Flow['protocol'] = 'TCP'): Flow => ({ name, sourceIP, protocol, destIP, destPort, output, masq });

const SCENARIO: Scenario = {
  source: 'kpng: cases kube-proxy also has, outside the transcribed sample',
  test: 'TraceCases',
  node: {
    name: 'node-a',
    ips: ['192.168.0.2'],
    primaryIP: '192.168.0.2',
    labels: {},
    interfaces: [
      { name: 'lo', addresses: ['127.0.0.1/8', '::1/128'] },
      { name: 'eth0', addresses: ['192.168.0.2/24'] },
    ],
  },
  config: { proxyMode: 'nftables', ipFamily: 'IPv4', clusterCIDR: '10.244.0.0/16', detectLocal: 'ClusterCIDR', serviceCIDRs: ['10.96.0.0/16'], nodePortAddresses: [], masqueradeAll: false, masqueradeBit: 14 },
  services: [
    service('demo', 'sticky', { type: 'NodePort', clusterIP: '10.96.0.60', sessionAffinity: 'ClientIP', sessionAffinityConfig: { clientIP: { timeoutSeconds: 600 } }, ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080, nodePort: 30060 }] }),
    service('demo', 'itp', { clusterIP: '10.96.0.70', internalTrafficPolicy: 'Local', ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }] }),
    service('demo', 'itpnone', { clusterIP: '10.96.0.71', internalTrafficPolicy: 'Local', ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }] }),
    service(
      'demo',
      'lb',
      { type: 'LoadBalancer', clusterIP: '10.96.0.80', externalTrafficPolicy: 'Local', healthCheckNodePort: 31080, externalIPs: ['192.0.2.80'], ports: [{ name: 'dns', port: 53, protocol: 'UDP', targetPort: 5353, nodePort: 30053 }] },
      { status: { loadBalancer: { ingress: [{ ip: '203.0.113.80' }] } } },
    ),
  ],
  endpointSlices: [
    slice('demo', 'sticky-1', 'sticky', [{ ip: '10.244.1.10', node: 'node-a' }, { ip: '10.244.2.10', node: 'node-b' }], [{ name: 'http', port: 8080 }]),
    slice('demo', 'itp-1', 'itp', [{ ip: '10.244.1.11', node: 'node-a' }, { ip: '10.244.2.11', node: 'node-b' }], [{ name: 'http', port: 8080 }]),
    slice('demo', 'itpnone-1', 'itpnone', [{ ip: '10.244.2.12', node: 'node-b' }], [{ name: 'http', port: 8080 }]),
    slice('demo', 'lb-1', 'lb', [{ ip: '10.244.2.13', node: 'node-b' }], [{ name: 'dns', port: 5353, protocol: 'UDP' }]),
  ],
  flows: [
    flow('pod to a ClusterIP with ClientIP affinity', '10.244.1.200', '10.96.0.60', 80, '10.244.1.10:8080, 10.244.2.10:8080'),
    flow('outside to its NodePort (eTP Cluster): masqueraded', '198.51.100.7', '192.168.0.2', 30060, '10.244.1.10:8080, 10.244.2.10:8080', true),
    flow('pod to an iTP=Local ClusterIP: the local endpoint only', '10.244.1.200', '10.96.0.70', 80, '10.244.1.11:8080'),
    flow('the node to an iTP=Local ClusterIP: the local endpoint, masqueraded', '192.168.0.2', '10.96.0.70', 80, '10.244.1.11:8080', true),
    flow('pod to an iTP=Local ClusterIP without a local endpoint: DROP', '10.244.1.200', '10.96.0.71', 80, 'DROP'),
    flow('outside to an eTP=Local LB IP without a local endpoint: DROP', '198.51.100.7', '203.0.113.80', 53, 'DROP', false, 'UDP'),
    flow('outside to an eTP=Local external IP without a local endpoint: DROP', '198.51.100.7', '192.0.2.80', 53, 'DROP', false, 'UDP'),
    flow('a pod to the eTP=Local LB IP: every endpoint (short-circuit)', '10.244.1.200', '203.0.113.80', 53, '10.244.2.13:5353', false, 'UDP'),
  ],
};

await describeBackends('kpng trace against real packets: affinity, Local policies', (b) => {
  let lab: Lab | undefined;
  const s: Scenario = { ...SCENARIO, config: { ...SCENARIO.config, proxyMode: proxyMode(b) === 'nftables' ? 'nftables' : 'iptables' } };
  before(async () => {
    lab = await Lab.create(labSpecFor(s, `trace${backendTag(b)}`));
    await serveScenario(lab, s);
    await applyOnce(b, lab, stateFor(s).items, configFor(s, proxyMode(b)));
  });
  after(() => lab?.close());

  s.flows.forEach((f, i) => {
    it(flowTitle(f, i), async () => {
      const t = await traceInLab(lab!, f);
      const r = await checkFlow(lab!, s, f);
      assert.ok(r.problems.length === 0, r.problems.join('\n'));
      const d = compareTrace(f, t, r.outcomes, { affinity: f.name.includes('affinity') || f.destPort === 30060 });
      assert.ok(d.length === 0, `kpng trace does not predict the real outcome:\n${d.join('\n')}`);
      if (f.name.includes('affinity') && b.name === 'nft') {
        assert.ok(t.reasons.some((x) => /sessionAffinity: ClientIP/.test(x)), t.reasons.join('\n'));
        // to-nft's affinity sets are kernel state the trace reads: now the client has its endpoint
        const again = await traceInLab(lab!, f);
        const real = [...new Set(r.outcomes.map((o) => (o.kind === 'answered' ? o.local : o.kind)))];
        assert.deepEqual(again.endpoints, real, `after the packets the trace names the client's endpoint\n${again.reasons.join('\n')}`);
      }
    });
  });

  // a client that never connected (to-nft's affinity sets know the others)
  it('kpng trace -o json, as a process in the node\'s namespace', async () => {
    const r = await lab!.runKpng(['trace', '--src', '198.51.100.99', '--dst', '192.168.0.2', '--dport', '30060', '-o', 'json'], 30_000);
    assert.equal(r.code, 0, r.stderr);
    const t = JSON.parse(r.stdout);
    assert.deepEqual(Object.keys(t).slice(0, 3), ['verdict', 'endpoints', 'masquerade']);
    assert.equal(t.verdict, 'dnat');
    assert.deepEqual([...t.endpoints].sort(), ['10.244.1.10:8080', '10.244.2.10:8080']);
    assert.equal(t.masquerade, true);
    assert.equal(t.backend, b.name);
    assert.ok(Array.isArray(t.path) && t.path.length > 0);
    const bad = await lab!.runKpng(['trace', '--src', '198.51.100.7', '--dst', 'nope', '--dport', '80'], 30_000);
    assert.equal(bad.code, 1);
    assert.match(bad.stderr, /--dst nope: not an IP address/);
  });
});
