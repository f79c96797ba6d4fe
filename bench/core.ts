// Core benchmark: a synthetic cluster (default 10k services, 50k endpoints,
// 100 nodes) through store -> node-local state -> diff, in one process.
//   npm run bench -- core [--services N] [--endpoints-per-service N] [--nodes N] [--changes N]
// Reports one node's state from scratch, one endpoint change (time and ops,
// p50/p99) side by side with a from-scratch recompute, and revisions per
// event under a churn of no-op updates.
import { Store, KINDS } from '../src/store/store.js';
import { ServiceViews } from '../src/localstate/views.js';
import { LocalDiff } from '../src/diff/local-diff.js';
import { convertObject } from '../src/sources/objects.js';
import { applyObject, type ModelObject } from '../src/sources/apply.js';
import { service, slice, node } from '../test/helpers/k8s.js';
import { num, pct } from './_harness.js';

const ms = (t0: bigint) => Number(process.hrtime.bigint() - t0) / 1e6;

export default async function (args: string[]) {
  const nSvc = num(args, 'services', 10_000);
  const perSvc = num(args, 'endpoints-per-service', 5);
  const nNodes = num(args, 'nodes', 100);
  const nChanges = num(args, 'changes', 200);
  const ip = (i: number) => `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`;

  const sliceObj = (s: number, gen = 0) =>
    slice('bench', `svc-${s}-1`, `svc-${s}`, Array.from({ length: perSvc }, (_, e) => {
      const n = s * perSvc + e;
      const g = e === 0 ? gen : 0; // a change replaces one endpoint
      return { ip: ip(n + g * 1_000_000), node: `node-${n % nNodes}`, zone: `zone-${n % 3}`, pod: `p-${s}-${e}-${g}` };
    }));
  const objects: Record<string, any>[] = [];
  for (let n = 0; n < nNodes; n++) objects.push(node(`node-${n}`, `zone-${n % 3}`, [`192.168.${n >> 8}.${n & 255}`]));
  for (let s = 0; s < nSvc; s++) {
    objects.push(service('bench', `svc-${s}`, { clusterIP: `172.${16 + (s >> 16)}.${(s >> 8) & 255}.${s & 255}`, ports: [{ name: 'http', port: 80 }] }));
    objects.push(sliceObj(s));
  }
  let converted = objects.map((o) => convertObject(o) as ModelObject);
  objects.length = 0;

  const store = new Store();
  let t0 = process.hrtime.bigint();
  store.update((tx) => {
    for (const c of converted) applyObject(tx, c);
    KINDS.forEach((k) => tx.setSynced(k));
  });
  const loadMs = ms(t0);
  const nObjects = converted.length;
  converted = [];

  // one node's state from scratch (fresh views: nothing cached)
  const scratch = () => {
    const views = new ServiceViews(store);
    const d = new LocalDiff(store, views, 'node-0');
    const t = process.hrtime.bigint();
    const ops = d.next();
    const took = ms(t);
    d.close();
    views.close();
    return { took, ops: ops.length };
  };
  const first = scratch();

  // one endpoint change, incremental, repeated
  const views = new ServiceViews(store);
  const diff = new LocalDiff(store, views, 'node-0');
  diff.next();
  const times: number[] = [];
  const opCounts: number[] = [];
  for (let i = 0; i < nChanges; i++) {
    const s = (i * 7919) % nSvc;
    const c = convertObject(sliceObj(s, i + 1)) as ModelObject;
    t0 = process.hrtime.bigint();
    store.update((tx) => applyObject(tx, c));
    const ops = diff.next();
    times.push(ms(t0));
    opCounts.push(ops.length);
  }
  const scratchAgain = scratch();

  // no-op churn: re-applying unchanged objects and status-only changes
  const revBefore = store.rev;
  const eventsBefore = store.events;
  let emitted = 0;
  for (let i = 0; i < 20_000; i++) {
    const s = (i * 104729) % nSvc;
    const o = i % 2 ? service('bench', `svc-${s}`, { clusterIP: `172.${16 + (s >> 16)}.${(s >> 8) & 255}.${s & 255}`, ports: [{ name: 'http', port: 80 }] }, { metadata: { annotations: { touched: String(i) }, resourceVersion: String(i) } }) : undefined;
    const c = o ? (convertObject(o) as ModelObject) : (store.getSlice(`bench/svc-${s}-1`) && undefined);
    store.update((tx) => {
      if (c) applyObject(tx, c);
      else {
        const sl = store.getSlice(`bench/svc-${s}-1`)!;
        tx.setSlice('bench', sl.name, sl.serviceName, [...sl.endpoints]);
      }
    });
    emitted += diff.next().length;
  }
  const noopEvents = store.events - eventsBefore;
  const noopRevs = store.rev - revBefore;
  diff.close();

  const gc = (globalThis as { gc?: () => void }).gc;
  gc?.();
  const heap = process.memoryUsage().heapUsed / 2 ** 20;
  const rss = process.memoryUsage.rss() / 2 ** 20;
  console.log(`core benchmark: ${nSvc} services x ${perSvc} endpoints (${nSvc * perSvc}), ${nNodes} nodes; node ${process.version}`);
  console.log(`load ${nObjects} objects into the store:        ${loadMs.toFixed(0)} ms`);
  console.log(`node-0 state from scratch:                 ${first.took.toFixed(0)} ms, ${first.ops} ops (again after changes: ${scratchAgain.took.toFixed(0)} ms)`);
  console.log(`one endpoint change (store update -> ops): p50 ${pct(times, 50).toFixed(3)} ms, p99 ${pct(times, 99).toFixed(3)} ms, ops p50 ${pct(opCounts, 50)} (max ${Math.max(...opCounts)}) over ${nChanges} changes`);
  console.log(`ratio from-scratch / one change (p50):     ${(first.took / pct(times, 50)).toFixed(0)}x`);
  console.log(`no-op churn: ${noopEvents} events -> ${noopRevs} revisions (${((noopRevs * 100) / noopEvents).toFixed(3)} %), ${emitted} ops emitted`);
  console.log(`memory with the store and one node's views: heap ${gc ? heap.toFixed(0) + ' MiB after GC' : '(run with --expose-gc)'}, RSS ${rss.toFixed(0)} MiB`);
}
