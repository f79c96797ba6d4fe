// npm run bench -- first-diff [--sizes 20000,100000] [--runs 3]
//
// A node's first diff in this process: every Service's view computed for
// the node, its ops made and their values read (what to-local's decoder
// does), at N Services x 5 endpoints over 100 nodes (node-agent's cluster).
// Prints each run's time and, from one more run with V8's sampling heap
// profiler (objects already collected included), the bytes allocated per
// endpoint and where. It is the start's "diff" phase without the lists and
// the dataplane around it; compare trees by running it in each, alternately.
import { Session } from 'node:inspector/promises';
import { Store, KINDS } from '../src/store/store.js';
import { ServiceViews } from '../src/localstate/views.js';
import { LocalDiff } from '../src/diff/local-diff.js';
import { convertObject } from '../src/sources/objects.js';
import { applyObject, type ModelObject } from '../src/sources/apply.js';
import { service, slice, node } from '../test/helpers/k8s.js';
import { vip } from './_scale.js';
import { num, nums } from './_harness.js';

const NODES = 100;
const podIP = (s: number, e: number) => {
  const i = s * 5 + e + 1;
  return `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`;
};

function cluster(n: number): Store {
  const store = new Store();
  store.update((tx) => {
    for (let i = 0; i < NODES; i++) applyObject(tx, convertObject(node(`node-${i}`, `z${i % 3}`, [`192.168.${i >> 8}.${(i & 255) + 2}`])) as ModelObject);
    for (let s = 0; s < n; s++) {
      applyObject(tx, convertObject(service('bench', `svc-${s}`, { clusterIP: vip(s), ports: [{ name: 'http', port: 80, targetPort: 8080 }] })) as ModelObject);
      const eps = Array.from({ length: 5 }, (_, e) => ({ ip: podIP(s, e), node: `node-${(s * 5 + e) % NODES}`, pod: `p-${s}-${e}-0` }));
      applyObject(tx, convertObject(slice('bench', `svc-${s}-1`, `svc-${s}`, eps)) as ModelObject);
    }
    for (const k of KINDS) tx.setSynced(k);
  });
  return store;
}

/** one first diff; its ops' values read as a decoder reads them */
function firstDiff(store: Store): { ms: number; ops: number } {
  const views = new ServiceViews(store);
  const diff = new LocalDiff(store, views, 'node-0');
  const t0 = performance.now();
  const ops = diff.next();
  for (const op of ops) if (op.kind === 'set') void op.value;
  const ms = performance.now() - t0;
  diff.close();
  views.close();
  return { ms, ops: ops.length };
}

interface ProfileNode {
  callFrame: { functionName: string; url: string; lineNumber: number };
  selfSize: number;
  children: ProfileNode[];
}

export default async function (args: string[]): Promise<void> {
  const sizes = nums(args, 'sizes', '20000,100000');
  const runs = num(args, 'runs', 3);
  for (const n of sizes) {
    const store = cluster(n);
    const times: string[] = [];
    let ops = 0;
    for (let r = 0; r < runs; r++) {
      const d = firstDiff(store);
      times.push(d.ms.toFixed(0));
      ops = d.ops;
    }
    const session = new Session();
    session.connect();
    await session.post('HeapProfiler.enable');
    await session.post('HeapProfiler.startSampling', { samplingInterval: 1024, includeObjectsCollectedByMajorGC: true, includeObjectsCollectedByMinorGC: true } as never);
    firstDiff(store);
    const { profile } = (await session.post('HeapProfiler.stopSampling')) as unknown as { profile: { head: ProfileNode } };
    session.disconnect();
    const bySite = new Map<string, number>();
    let total = 0;
    const walk = (nd: ProfileNode) => {
      total += nd.selfSize;
      // (run through tsx, the profile has no line numbers: 0)
      const line = nd.callFrame.lineNumber > 0 ? `:${nd.callFrame.lineNumber + 1}` : '';
      const site = `${nd.callFrame.functionName || '(anonymous)'} ${nd.callFrame.url.split('/').slice(-2).join('/')}${line}`;
      if (nd.selfSize) bySite.set(site, (bySite.get(site) ?? 0) + nd.selfSize);
      nd.children.forEach(walk);
    };
    walk(profile.head);
    console.log(`${n} Services: first diff ${times.join(', ')} ms (${ops} ops); allocated ${(total / (n * 5)).toFixed(0)} bytes per endpoint, most by:`);
    for (const [site, b] of [...bySite].sort((a, b) => b[1] - a[1]).slice(0, 8)) console.log(`  ${((100 * b) / total).toFixed(0).padStart(3)}%  ${site}`);
  }
}
