// npm run bench -- api-fanout [--nodes 1000] [--services 10000] [--endpoints 5] [--changes 100] [--procs 2]
//                             [--profile FILE] [--heap FILE] [--plot DIR]
//
// One brain (this process: store, views, to-api server on 127.0.0.1) serves
// N node watchers that run in separate processes (raw HTTP/2 gRPC clients,
// one connection per node, each asking for its next diff after every Sync,
// as kpng's clients do). The cluster: S ClusterIP services with E endpoints
// each, spread over the nodes. After the initial sync, one endpoint changes
// at a time (a pod restarted with a new IP); every node sees that service,
// so every node is affected. Reported per change: time from the change to
// each node's Sync (p50/p99 over all node syncs) and to the last node's Sync
// (p50/p99/max over changes), brain CPU, bytes sent; and the brain's RSS.
// --profile FILE writes a CPU profile of the change phase; --heap FILE a heap
// snapshot after the initial sync;
// KPNG_BENCH_TRACE_GC=1 prints the brain's GCs during the change phase;
// KPNG_BENCH_PRETENURING=1 leaves V8's pretenuring on (tuneHeapForFanOut);
// KPNG_BENCH_HEAP_GROWTH=P as to-api's --heap-growth P (default 50).
// --nodes 250,500,1000 runs each node count in a process of its own, one
// after the other, and ends with a line per count side by side; --plot DIR
// then draws api-fanout-nodes.svg (change -> every node's Sync, p50 and
// p99, and a node's Sync, p99, against the nodes served).
import type { ChildProcess } from 'node:child_process';
import { connect, type ClientHttp2Session } from 'node:http2';
import { writeFileSync } from 'node:fs';
import inspector from 'node:inspector';
import { pino } from 'pino';
import { Store, KINDS, type StoreTx } from '../src/store/store.js';
import { ServiceViews } from '../src/localstate/views.js';
import { convertObject } from '../src/sources/objects.js';
import { applyObject } from '../src/sources/apply.js';
import { ApiServer, DEFAULT_HEAP_GROWTH_PERCENT, tuneHeapForFanOut } from '../src/sinks/api/server.js';
import { onSyncFrames, watchRequest } from './_scale.js';
import { forkSelf, forkedJob, mb, mean, options, now, pct, sleep, until, writePlot } from './_harness.js';

export interface Config {
  nodes: number;
  services: number;
  endpoints: number;
  changes: number;
  procs: number;
  /** write a CPU profile of the change phase to this file (cpuprofile) */
  profile?: string;
  /** write a heap snapshot after the initial sync to this file */
  heap?: string;
}

const post = (s: inspector.Session, method: string) => new Promise((resolve, reject) => s.post(method, (e, r) => (e ? reject(e) : resolve(r))));

// --- watcher processes

interface WatcherJob {
  port: number;
  nodes: string[];
}

type FromWatcher = { type: 'first'; count: number } | { type: 'syncs'; times: number[]; nodes: number[] } | { type: 'ready' };

async function watcherMain(job: WatcherJob) {
  const send = (m: FromWatcher) => process.send!(m);
  let firstSyncs = 0;
  let pending: { times: number[]; nodes: number[] } = { times: [], nodes: [] };
  let flush: NodeJS.Timeout | undefined;
  const sessions: ClientHttp2Session[] = [];
  job.nodes.forEach((node, idx) => {
    const session = connect(`http://127.0.0.1:${job.port}`);
    sessions.push(session);
    session.on('error', (e) => console.error(`watcher ${node}: ${e.message}`));
    const stream = session.request({ ':method': 'POST', ':path': '/localv1.Sets/Watch', 'content-type': 'application/grpc', te: 'trailers' }, { endStream: false });
    const req = watchRequest(node);
    stream.write(req);
    let synced = 0;
    onSyncFrames(stream, () => {
      const t = now();
      stream.write(req);
      if (synced++ === 0) {
        if (++firstSyncs % 50 === 0 || firstSyncs === job.nodes.length) send({ type: 'first', count: firstSyncs });
        return;
      }
      pending.times.push(t);
      pending.nodes.push(idx);
      flush ??= setTimeout(() => {
        send({ type: 'syncs', ...pending });
        pending = { times: [], nodes: [] };
        flush = undefined;
      }, 5);
    });
    stream.on('error', (e) => console.error(`watcher ${node}: ${e.message}`));
  });
  process.on('disconnect', () => {
    sessions.forEach((s) => s.destroy());
    process.exit(0);
  });
}

/** what one run measured, for the line per node count and the plot */
interface Summary {
  nodes: number;
  initS: number;
  /** change -> a node's Sync, and -> every node's Sync, ms */
  anyP50: number;
  anyP99: number;
  everyP50: number;
  everyP99: number;
  cpuPerNodeUs: number;
  /** MB: max over the run, max during the changes */
  rssMax: number;
  rssChanges: number;
}

// --- the brain

function rng(seed: number) {
  return () => {
    seed = (seed * 1103515245 + 12345) & 0x7fffffff;
    return seed / 0x80000000;
  };
}

const ip = (n: number) => `10.${(n >> 16) & 255}.${(n >> 8) & 255}.${n & 255}`;

/**
 * Fills the store with the cluster. The brain keeps no Kubernetes objects
 * (the kube source does not either): the benchmark keeps each endpoint's IP
 * and node as numbers and rebuilds a slice object when it changes one.
 */
export function buildCluster(store: Store, c: Config) {
  const rand = rng(42);
  const nodeName = (i: number) => `node-${String(i).padStart(4, '0')}`;
  const podIPs = new Int32Array(c.services * c.endpoints);
  const podNodes = new Int32Array(c.services * c.endpoints);
  let podIP = 1 << 16;
  for (let i = 0; i < podIPs.length; i++) {
    podIPs[i] = podIP++;
    podNodes[i] = Math.floor(rand() * c.nodes);
  }
  const slice = (i: number) => {
    const ns = `ns-${i % 100}`;
    const name = `svc-${i}`;
    return {
      apiVersion: 'discovery.k8s.io/v1',
      kind: 'EndpointSlice',
      metadata: { namespace: ns, name: `${name}-1`, labels: { 'kubernetes.io/service-name': name } },
      addressType: 'IPv4',
      ports: [{ name: 'http', port: 8080, protocol: 'TCP' }],
      endpoints: Array.from({ length: c.endpoints }, (_, j) => ({
        addresses: [ip(podIPs[i * c.endpoints + j])],
        conditions: { ready: true },
        nodeName: nodeName(podNodes[i * c.endpoints + j]),
        targetRef: { kind: 'Pod', name: `${name}-${j}`, namespace: ns },
      })),
    };
  };
  const service = (i: number) => ({
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { namespace: `ns-${i % 100}`, name: `svc-${i}` },
    spec: { type: 'ClusterIP', clusterIP: `10.96.${(i >> 8) & 255}.${i & 255}`, clusterIPs: [`10.96.${(i >> 8) & 255}.${i & 255}`], ports: [{ name: 'http', port: 80, targetPort: 8080 }] },
  });
  const apply = (tx: StoreTx, o: Record<string, unknown>) => {
    const conv = convertObject(o);
    if (conv.kind !== 'Ignored') applyObject(tx, conv);
  };
  store.update((tx) => {
    for (let i = 0; i < c.nodes; i++) {
      apply(tx, { apiVersion: 'v1', kind: 'Node', metadata: { name: nodeName(i), labels: { 'topology.kubernetes.io/zone': `z${i % 3}` } }, spec: {}, status: {} });
    }
    for (let i = 0; i < c.services; i++) {
      apply(tx, service(i));
      apply(tx, slice(i));
    }
    KINDS.forEach((k) => tx.setSynced(k));
  });
  /** a random endpoint gets a new IP (its pod restarted): the changed slice, converted */
  const change = () => {
    const i = Math.floor(rand() * c.services);
    podIPs[i * c.endpoints + Math.floor(rand() * c.endpoints)] = podIP++;
    return convertObject(slice(i));
  };
  return { change };
}

export default async function main(args: string[]) {
  const o = options(args, { nodes: '1000', services: 10_000, endpoints: 5, changes: 100, procs: 2, profile: '', heap: '', plot: '' });
  const counts = o.nodes.split(',').map(Number);
  const config = (nodes: number): Config => ({ nodes, services: o.services, endpoints: o.endpoints, changes: o.changes, procs: o.procs, profile: o.profile || undefined, heap: o.heap || undefined });
  if (counts.length === 1) {
    const s = await fanOut(config(counts[0]));
    if (o.plot) await plot(o.plot, o, [s]);
    return;
  }
  // each node count in a brain process of its own, one after the other
  const summaries: Summary[] = [];
  for (const nodes of counts) {
    const child = forkSelf(import.meta.url, 'KPNG_BENCH_FANOUT', config(nodes), ['--expose-gc']);
    summaries.push(
      await new Promise<Summary>((resolve, reject) => {
        child.once('message', (m) => resolve(m as Summary));
        child.once('exit', (code) => reject(new Error(`the run with ${nodes} nodes exited (${code}) without a result`)));
      }),
    );
    console.log('');
  }
  console.log(`${o.services} services x ${o.endpoints} endpoints, ${o.changes} changes per run, each node count its own brain process:`);
  console.log('nodes | initial sync | change -> a node\'s Sync p50 / p99 | change -> every node\'s Sync p50 / p99 | brain CPU per node and change | brain RSS max / during the changes');
  for (const s of summaries) {
    console.log(`${s.nodes} | ${s.initS.toFixed(1)} s | ${s.anyP50.toFixed(1)} / ${s.anyP99.toFixed(1)} ms | ${s.everyP50.toFixed(1)} / ${s.everyP99.toFixed(1)} ms | ${s.cpuPerNodeUs.toFixed(1)} us | ${s.rssMax.toFixed(0)} / ${s.rssChanges.toFixed(0)} MB`);
  }
  if (o.plot) await plot(o.plot, o, summaries);
}

async function plot(dir: string, o: { services: number; endpoints: number; changes: number }, summaries: Summary[]): Promise<void> {
  await writePlot(dir, {
    name: 'api-fanout-nodes',
    title: 'One brain: an endpoint change to the Syncs of the nodes that see it',
    subtitle: `${o.services} Services x ${o.endpoints} endpoints, every node affected by every change; ${o.changes} changes; the nodes' watchers on the same machine`,
    x: { title: 'nodes served' },
    y: { title: 'ms' },
    series: 'change ->',
    mark: 'line',
    points: summaries.flatMap((s) => [
      { series: "every node's Sync, p99", x: s.nodes, y: s.everyP99 },
      { series: "every node's Sync, p50", x: s.nodes, y: s.everyP50 },
      { series: "a node's Sync, p99", x: s.nodes, y: s.anyP99 },
    ]),
  });
}

/** One brain in this process serving c.nodes watchers: the initial sync, then c.changes changes. */
async function fanOut(c: Config): Promise<Summary> {
  // as the to-api sink does
  if (!process.env.KPNG_BENCH_PRETENURING) tuneHeapForFanOut(Number(process.env.KPNG_BENCH_HEAP_GROWTH ?? DEFAULT_HEAP_GROWTH_PERCENT));
  const log = pino({ level: 'warn' });
  const t0 = now();
  const store = new Store({ keepDecodedSlices: true }); // as to-api runs it
  const cluster = buildCluster(store, c);
  const views = new ServiceViews(store, "", { keepDecoded: false }); // as to-api runs it
  console.log(`cluster: ${c.nodes} nodes, ${c.services} services, ${c.services * c.endpoints} endpoints (built in ${(now() - t0).toFixed(0)} ms, rss ${mb(process.memoryUsage.rss())} MB)`);

  const server = new ApiServer({ store, views, log, listen: 'tcp://127.0.0.1:0' });
  const port = Number((await server.start()).split(':').pop());
  const names = Array.from({ length: c.nodes }, (_, i) => `node-${String(i).padStart(4, '0')}`);
  const children: ChildProcess[] = [];
  const syncTimes: number[][] = [];
  let firstSyncs = 0;
  let lastSyncCount = 0;
  const perChild = Math.ceil(c.nodes / c.procs);
  let maxRss = 0;
  const rssTimer = setInterval(() => (maxRss = Math.max(maxRss, process.memoryUsage.rss())), 200);
  rssTimer.unref();
  try {
    const tStart = now();
    const cpuStart = process.cpuUsage();
    for (let p = 0; p < c.procs; p++) {
      const nodes = names.slice(p * perChild, (p + 1) * perChild);
      const firstByChild = { n: 0 };
      const child = forkSelf(import.meta.url, 'KPNG_BENCH_WATCHERS', { port, nodes } satisfies WatcherJob);
      children.push(child);
      child.on('message', (m: FromWatcher) => {
        if (m.type === 'first') {
          firstSyncs += m.count - firstByChild.n;
          firstByChild.n = m.count;
        } else if (m.type === 'syncs') {
          syncTimes.push(m.times);
          lastSyncCount += m.times.length;
        }
      });
    }
    let lastReport = now();
    const progress = () => {
      if (now() - lastReport > 10_000) {
        lastReport = now();
        console.log(`  initial sync: ${firstSyncs}/${c.nodes} nodes, ${mb(server.stats.bytes)} MB sent, rss ${mb(process.memoryUsage.rss())} MB`);
      }
      return firstSyncs >= c.nodes;
    };
    await until('initial sync', progress, { timeoutMs: 30 * 60_000, everyMs: 100 });
    const initMs = now() - tStart;
    const initCpu = process.cpuUsage(cpuStart);
    maxRss = Math.max(maxRss, process.memoryUsage.rss());
    (globalThis as { gc?: () => void }).gc?.(); // live memory, not what the initial sync left to collect
    const rssAfterInit = process.memoryUsage.rss();
    const heapAfterInit = process.memoryUsage().heapUsed;
    console.log(
      `initial sync: all ${c.nodes} nodes in ${(initMs / 1000).toFixed(1)} s, ${server.stats.messages} messages, ${mb(server.stats.bytes)} MB, ` +
        `brain cpu ${((initCpu.user + initCpu.system) / 1e6).toFixed(1)} s; brain rss max ${mb(maxRss)} MB, after gc ${mb(rssAfterInit)} MB (heap ${mb(heapAfterInit)} MB)`,
    );
    await sleep(5000);
    (globalThis as { gc?: () => void }).gc?.();
    await sleep(1000);
    const rssSettled = process.memoryUsage.rss();
    const m = process.memoryUsage();
    console.log(`brain rss 6 s after the initial sync: ${mb(rssSettled)} MB (V8 heap used ${mb(m.heapUsed)} MB, committed ${mb(m.heapTotal)} MB; external ${mb(m.external)} MB)`);
    if (c.heap) console.log(`heap snapshot: ${(await import('node:v8')).writeHeapSnapshot(c.heap)}`);
    let maxRssChanges = 0;

    const session = c.profile ? new inspector.Session() : undefined;
    if (session) {
      session.connect();
      await post(session, 'Profiler.enable');
      await post(session, 'Profiler.start');
    }
    if (process.env.KPNG_BENCH_TRACE_GC) (await import('node:v8')).setFlagsFromString('--trace-gc');
    // one endpoint change at a time
    const allNode: number[] = [];
    const lastNode: number[] = [];
    const cpuMs: number[] = [];
    const bytes: number[] = [];
    const msgs: number[] = [];
    for (let k = 0; k < c.changes; k++) {
      const conv = cluster.change();
      syncTimes.length = 0;
      lastSyncCount = 0;
      const b0 = server.stats.bytes;
      const m0 = server.stats.messages;
      const cpu0 = process.cpuUsage();
      const tc = now();
      store.update((tx) => conv.kind !== 'Ignored' && applyObject(tx, conv));
      await until(() => `change ${k}: only ${lastSyncCount}/${c.nodes} nodes synced`, () => lastSyncCount >= c.nodes, { timeoutMs: 30_000, everyMs: 2 });
      const cpu = process.cpuUsage(cpu0);
      const times = syncTimes.flat().map((t) => t - tc);
      allNode.push(...times);
      lastNode.push(Math.max(...times));
      cpuMs.push((cpu.user + cpu.system) / 1000);
      bytes.push(server.stats.bytes - b0);
      msgs.push(server.stats.messages - m0);
      maxRssChanges = Math.max(maxRssChanges, process.memoryUsage.rss());
      await sleep(20);
    }
    if (session) {
      const { profile } = (await post(session, 'Profiler.stop')) as { profile: unknown };
      writeFileSync(c.profile!, JSON.stringify(profile));
      session.disconnect();
    }
    console.log(`changes: ${c.changes} endpoint changes, each affecting all ${c.nodes} nodes`);
    console.log(`  change -> a node's Sync:      p50 ${pct(allNode, 50).toFixed(1)} ms, p99 ${pct(allNode, 99).toFixed(1)} ms`);
    console.log(`  change -> every node's Sync:  p50 ${pct(lastNode, 50).toFixed(1)} ms, p99 ${pct(lastNode, 99).toFixed(1)} ms, max ${Math.max(...lastNode).toFixed(1)} ms`);
    console.log(`  brain cpu per change:         avg ${mean(cpuMs).toFixed(1)} ms, p99 ${pct(cpuMs, 99).toFixed(1)} ms (${(mean(cpuMs) / c.nodes * 1000).toFixed(1)} us per node)`);
    console.log(`  sent per change:              ${mean(msgs).toFixed(0)} messages, ${(mean(bytes) / 1024).toFixed(1)} KiB (${(mean(bytes) / c.nodes).toFixed(0)} bytes per node)`);
    console.log(`brain rss: max ${mb(maxRssChanges)} MB during the changes, ${mb(process.memoryUsage.rss())} MB at the end; max ${mb(maxRss)} MB over the run (initial sync)`);
    console.log(`views computed: ${views.computed}`);
    return {
      nodes: c.nodes,
      initS: initMs / 1000,
      anyP50: pct(allNode, 50),
      anyP99: pct(allNode, 99),
      everyP50: pct(lastNode, 50),
      everyP99: pct(lastNode, 99),
      cpuPerNodeUs: (mean(cpuMs) / c.nodes) * 1000,
      rssMax: maxRss / 2 ** 20,
      rssChanges: maxRssChanges / 2 ** 20,
    };
  } finally {
    clearInterval(rssTimer);
    for (const ch of children) ch.kill('SIGKILL');
    await server.stop(200);
  }
}

// a child of this benchmark: the watchers of some nodes, or one run with one node count
const watcherJob = forkedJob<WatcherJob>('KPNG_BENCH_WATCHERS');
const oneRun = watcherJob ? undefined : forkedJob<Config>('KPNG_BENCH_FANOUT');
if (watcherJob) await watcherMain(watcherJob);
else if (oneRun) {
  process.send!(await fanOut(oneRun));
  process.disconnect();
}
