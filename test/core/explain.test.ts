// kpng get's reasons (explainCategorized) against the node-local state
// itself (computeServiceView): over a seeded set of clusters (conditions,
// nodes, zone and node hints, traffic policies, trafficDistribution), every
// endpoint kpng get calls used for internal or external traffic is exactly
// one the view gives that scope, on either node. Then the words of each
// kind of reason.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { syncedStore, service, slice, node, type EndpointSpec } from '../helpers/k8s.js';
import { computeServiceView, portCandidates, trafficPolicies } from '../../src/localstate/service-view.js';
import { explainCategorized } from '../../src/localstate/topology.js';

type Obj = Record<string, any>;

/** a small deterministic generator (mulberry32) */
function rng(seed: number) {
  return () => {
    seed |= 0;
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function cluster(r: () => number): Obj[] {
  const pick = <T>(xs: T[]) => xs[Math.floor(r() * xs.length)]!;
  const n = 1 + Math.floor(r() * 4);
  const hinted = r() < 0.4;
  const eps: EndpointSpec[] = [];
  for (let i = 0; i < n; i++) {
    const state = pick(['ready', 'ready', 'terminating', 'not-serving', 'not-ready']);
    const where = pick(['node-a', 'node-b', '']);
    eps.push({
      ip: `10.244.0.${10 + i}`,
      ...(where ? { node: where, zone: where === 'node-a' ? 'zone-1' : 'zone-2' } : {}),
      ready: state === 'ready',
      serving: state === 'ready' || state === 'terminating',
      terminating: state === 'terminating' || state === 'not-serving',
      pod: `p${i}`,
      ...(hinted && r() < 0.9 ? { zoneHints: [pick(['zone-1', 'zone-2'])] } : {}),
      ...(hinted && r() < 0.3 ? { nodeHints: [pick(['node-a', 'node-b'])] } : {}),
    });
  }
  const type = pick(['ClusterIP', 'NodePort', 'LoadBalancer']);
  return [
    node('node-a', 'zone-1'),
    node('node-b', 'zone-2'),
    service('ns', 'svc', {
      type,
      clusterIP: '10.96.0.10',
      ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080, ...(type === 'ClusterIP' ? {} : { nodePort: 30080 }) }],
      ...(r() < 0.3 ? { internalTrafficPolicy: 'Local' } : {}),
      ...(type !== 'ClusterIP' && r() < 0.5 ? { externalTrafficPolicy: 'Local' } : {}),
      ...(hinted ? { trafficDistribution: 'PreferClose' } : {}),
    }),
    slice('ns', 'svc-1', 'svc', eps),
  ];
}

test('kpng get uses exactly the endpoints the node-local state gives each scope (400 seeded clusters, two nodes)', () => {
  const r = rng(18);
  for (let k = 0; k < 400; k++) {
    const objects = cluster(r);
    const store = syncedStore(objects);
    const stored = store.getService('ns/svc')!.service;
    for (const [name, zone] of [['node-a', 'zone-1'], ['node-b', 'zone-2']] as const) {
      const ctx = { name, zone };
      const view = computeServiceView(stored, store.slicesOfService('ns/svc'), ctx)!;
      const inView = (scope: 'Internal' | 'External') => new Set(view.endpoints.filter((e) => e.endpoint.Scopes?.[scope]).flatMap((e) => e.endpoint.IPs!.V4));
      const pol = trafficPolicies(stored);
      const cands = portCandidates(store.slicesOfService('ns/svc'), stored.Ports[0]!, 4, ctx);
      const uses = explainCategorized(cands, ctx, pol.itpLocal, pol.etpLocal);
      const said = (scope: 'internal' | 'external') => new Set(cands.filter((_, i) => uses[i]![scope].used).map((c) => c.ip));
      const what = `case ${k} on ${name}: ${JSON.stringify(objects.slice(2))}\n${JSON.stringify(uses)}`;
      assert.deepEqual([...said('internal')].sort(), [...inView('Internal')].sort(), what);
      if (pol.externallyAccessible) assert.deepEqual([...said('external')].sort(), [...inView('External')].sort(), what);
    }
  }
});

test('the words of each reason', () => {
  const why = (objects: Obj[], nodeName: string, ip: string, scope: 'internal' | 'external' = 'internal') => {
    const store = syncedStore(objects);
    const svc = store.getService('ns/svc')!.service;
    const ctx = { name: nodeName, zone: store.getNode(nodeName)?.node.Topology?.Zone ?? '' };
    const pol = trafficPolicies(svc);
    const cands = portCandidates(store.slicesOfService('ns/svc'), svc.Ports[0]!, 4, ctx);
    const i = cands.findIndex((c) => c.ip === ip);
    return explainCategorized(cands, ctx, pol.itpLocal, pol.etpLocal)[i]![scope];
  };
  const nodes = [node('node-a', 'zone-1'), node('node-b', 'zone-2')];
  const svc = (spec: Obj = {}) => service('ns', 'svc', { clusterIP: '10.96.0.10', ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080, nodePort: 30080 }], type: 'NodePort', ...spec });
  const sl = (eps: EndpointSpec[]) => slice('ns', 'svc-1', 'svc', eps);

  const hinted = [...nodes, svc(), sl([{ ip: '10.244.0.1', node: 'node-a', zoneHints: ['zone-1'] }, { ip: '10.244.0.2', node: 'node-b', zoneHints: ['zone-2'] }])];
  assert.deepEqual(why(hinted, 'node-a', '10.244.0.1'), { used: true, why: 'ready; topology hint for zone zone-1' });
  assert.deepEqual(why(hinted, 'node-a', '10.244.0.2'), { used: false, why: 'topology: hinted for zone zone-2, not zone zone-1' });

  const nodeHinted = [...nodes, svc(), sl([{ ip: '10.244.0.1', node: 'node-a', nodeHints: ['node-a'] }, { ip: '10.244.0.2', node: 'node-b', nodeHints: ['node-b'] }])];
  assert.deepEqual(why(nodeHinted, 'node-b', '10.244.0.2'), { used: true, why: 'ready; topology hint for node node-b' });
  assert.deepEqual(why(nodeHinted, 'node-b', '10.244.0.1'), { used: false, why: 'topology: hinted for node node-a, not node node-b' });

  const terminating = [...nodes, svc(), sl([{ ip: '10.244.0.1', ready: true }, { ip: '10.244.0.2', ready: false, serving: true, terminating: true }, { ip: '10.244.0.3', ready: false, serving: false }])];
  assert.deepEqual(why(terminating, 'node-a', '10.244.0.2'), { used: false, why: 'terminating: ready endpoints exist' });
  assert.deepEqual(why(terminating, 'node-a', '10.244.0.3'), { used: false, why: 'not serving' });
  const fallback = [...nodes, svc(), sl([{ ip: '10.244.0.2', ready: false, serving: true, terminating: true }, { ip: '10.244.0.4', ready: false, serving: true, terminating: false }])];
  assert.deepEqual(why(fallback, 'node-a', '10.244.0.2'), { used: true, why: 'serving and terminating: the fallback (no ready endpoint)' });
  assert.deepEqual(why(fallback, 'node-a', '10.244.0.4'), { used: false, why: 'not ready' });

  const local = [...nodes, svc({ externalTrafficPolicy: 'Local', internalTrafficPolicy: 'Local' }), sl([{ ip: '10.244.0.1', node: 'node-a' }, { ip: '10.244.0.2', node: 'node-b' }, { ip: '10.244.0.3' }])];
  assert.deepEqual(why(local, 'node-a', '10.244.0.1', 'external'), { used: true, why: 'ready, on this node (Local policy)' });
  assert.deepEqual(why(local, 'node-a', '10.244.0.2', 'external'), { used: false, why: 'not on this node (Local policy; on node-b)' });
  assert.deepEqual(why(local, 'node-a', '10.244.0.3', 'internal'), { used: false, why: 'not on this node (Local policy; its node is unknown)' });
  const localFallback = [...nodes, svc({ internalTrafficPolicy: 'Local' }), sl([{ ip: '10.244.0.1', node: 'node-a', ready: false, serving: true, terminating: true }, { ip: '10.244.0.2', node: 'node-b' }])];
  assert.deepEqual(why(localFallback, 'node-a', '10.244.0.1'), { used: true, why: 'serving and terminating, on this node: the fallback (no ready local endpoint)' });
});
