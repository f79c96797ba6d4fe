// The original kpng measurement, on our kube source: a synthetic cluster on
// the test API server (in this process, TLS on 127.0.0.1) under a steady
// churn where most updates change nothing a node uses, and `kpng kube
// --stats ... to-local to-log --node-name N` as a real process. Reports
// events, revisions, revisions/events, the ops the node saw, CPU and RSS;
// then RSS (and heap per object) after listing a big cluster.
//   npm run bench -- kube-churn [--minutes 10] [--services 1000] [--pods 1500] [--nodes 20]
//                               [--rate 73] [--big-services 10000] [--big-endpoints 50000]
//                               [--skip-churn] [--skip-big] [--tsx]
// kpng runs compiled (tsc into node_modules/.cache/kpng-bench-kube, as in
// production); --tsx runs bin/kpng.js from a development checkout instead.
// Anchor (original kpng, 1k services / 1.5k pods, 30 min): 130,941 events,
// 1,218 revisions (0.93 %).
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { TestApiServer, certKubeconfig } from '../test/helpers/apiserver.js';
import { SyntheticCluster, prng, type ChurnOp } from '../test/helpers/kube-cluster.js';
import { ROOT, compileKpng, flag, num, sleep, until } from './_harness.js';

let KPNG = [join(ROOT, 'bin/kpng.js')];

/** Compiles kpng once for this run (not into dist/: others may be using it). */
function compile(): void {
  try {
    KPNG = compileKpng(join(ROOT, 'node_modules/.cache/kpng-bench-kube')).slice(1);
  } catch (e) {
    console.log(`kube-churn: ${(e as Error).message}\nrunning kpng through tsx (bin/kpng.js) instead`);
  }
}

/**
 * The churn: about 1 % of the updates change what a proxy uses (pods come
 * and go, readiness flaps on any node, services come and go); the rest are
 * what a cluster writes all day: node heartbeats, EndpointSlice and Service
 * annotation, status and resourceVersion-only updates.
 */
const MIX: Partial<Record<ChurnOp, number>> = {
  nodeHeartbeat: 30,
  sliceAnnotation: 15,
  sliceBump: 15,
  serviceAnnotation: 10,
  serviceStatus: 14,
  serviceBump: 15,
  readinessFlap: 0.4,
  replacePod: 0.3,
  addPod: 0.1,
  removePod: 0.1,
  createService: 0.05,
  deleteService: 0.05,
};
const REAL: ReadonlySet<ChurnOp> = new Set(['readinessFlap', 'replacePod', 'addPod', 'removePod', 'createService', 'deleteService']);

interface Stats {
  t: number;
  events: number;
  revisions: number;
  usr: number;
  sys: number;
  cpu: number;
  rss: number;
}

/** `node bin/kpng.js kube --stats ... to-local to-log --node-name N`, its stats and op counts. */
function startKpng(kubeconfig: string, node: string) {
  const p = spawn(process.execPath, [...KPNG, 'kube', '--stats', '--kubeconfig', kubeconfig, 'to-local', 'to-log', '--node-name', node], {
    cwd: ROOT,
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, KPNG_LOG_LEVEL: 'info' },
  });
  const s = { stats: [] as Stats[], ops: 0, syncs: 0, warnings: 0, logs: [] as string[], pid: p.pid };
  let out = '';
  p.stdout.setEncoding('utf8').on('data', (d: string) => {
    out += d;
    const lines = out.split('\n');
    out = lines.pop()!;
    for (const l of lines) {
      if (l === '> sync') s.syncs++;
      else if (l) s.ops++;
    }
  });
  let err = '';
  p.stderr.setEncoding('utf8').on('data', (d: string) => {
    err += d;
    const lines = err.split('\n');
    err = lines.pop()!;
    for (const l of lines) {
      const f = l.split('\t');
      if (f[0] === 'stats:' && /^\d/.test(f[1])) {
        s.stats.push({ t: +f[1], events: +f[2], revisions: +f[3], usr: +f[4], sys: +f[5], cpu: +f[6], rss: +f[7] });
      } else if (!l.startsWith('stats:')) {
        if (/ WARN | ERROR /.test(l)) s.warnings++;
        if (s.logs.length < 200) s.logs.push(l);
      }
    }
  });
  const exited = new Promise<void>((r) => p.on('exit', () => r()));
  return {
    s,
    last: () => s.stats.at(-1),
    until(cond: () => boolean, what: string, ms = 120_000) {
      const exited = () => {
        if (p.exitCode !== null) throw new Error(`kpng exited before ${what}\n${s.logs.slice(-20).join('\n')}`);
        return cond();
      };
      return until(() => `kpng: ${what}\n${s.logs.slice(-20).join('\n')}`, exited, { timeoutMs: ms, everyMs: 50 });
    },
    async stop() {
      if (p.exitCode === null) {
        p.kill('SIGTERM');
        const t = setTimeout(() => p.kill('SIGKILL'), 5000);
        await exited;
        clearTimeout(t);
      }
    },
  };
}

const fmt = (n: number) => n.toLocaleString('en-US');

async function churn(args: string[], dir: string) {
  const minutes = num(args, 'minutes', 10);
  const shape = { services: num(args, 'services', 1000), pods: num(args, 'pods', 1500), nodes: num(args, 'nodes', 20) };
  const rate = num(args, 'rate', 73); // original: 130,941 events / 1,800 s
  // a real API server sends a bookmark about once a minute
  const server = await new TestApiServer({ bookmarkIntervalMs: 60_000 }).start();
  const cluster = new SyntheticCluster(server, prng(42));
  cluster.populate(shape);
  const node = [...cluster.podsByNode()].sort((a, b) => b[1] - a[1])[0][0];
  console.log(`kube-churn: ${shape.services} services, ${shape.pods} pods, ${shape.nodes} nodes; ${rate} updates/s for ${minutes} min; node ${node}`);
  const k = startKpng(certKubeconfig(join(dir, 'kubeconfig'), server.url), node);
  try {
    await k.until(() => k.s.syncs >= 1 && k.s.stats.length > 0, 'initial sync');
    await sleep(2000);
    const base = k.last()!;
    const baseOps = k.s.ops;
    const baseSyncs = k.s.syncs;
    console.log(`initial sync: ${fmt(base.events)} events, ${base.revisions} revisions, ${fmt(baseOps)} ops, RSS ${base.rss.toFixed(1)} MiB`);

    let made = 0;
    let real = 0;
    const t0 = Date.now();
    const end = t0 + minutes * 60_000;
    let nextReport = t0 + 60_000;
    for (let tick = 1; Date.now() < end; tick++) {
      // a steady rate: catch up to where we should be every 100 ms
      const due = Math.floor(((Date.now() - t0) / 1000) * rate);
      while (made < due) {
        const op = cluster.randomOp(MIX);
        if (cluster.apply(op)) {
          made++;
          if (REAL.has(op)) real++;
        }
      }
      if (Date.now() >= nextReport) {
        const l = k.last()!;
        console.log(`  ${Math.round((Date.now() - t0) / 60_000)} min: ${fmt(l.events - base.events)} events, ${l.revisions - base.revisions} revisions, ${k.s.syncs - baseSyncs} node syncs, RSS ${l.rss.toFixed(1)} MiB`);
        nextReport += 60_000;
      }
      await sleep(100);
    }
    await sleep(3000); // let the last stats lines come
    const last = k.last()!;
    const during = k.s.stats.filter((x) => x.t > base.t);
    const cpuMs = during.reduce((a, x) => a + x.usr + x.sys, 0);
    const wall = last.t - base.t;
    const rss = during.map((x) => x.rss);
    const events = last.events - base.events;
    const revisions = last.revisions - base.revisions;
    const r = {
      minutes,
      updates: made,
      realChanges: real,
      events,
      revisions,
      revsPerEventsPct: (revisions * 100) / events,
      nodeSyncs: k.s.syncs - baseSyncs,
      nodeOps: k.s.ops - baseOps,
      cpuPct: (cpuMs * 100) / wall,
      rssMiB: { min: Math.min(...rss), max: Math.max(...rss), end: last.rss },
      warnings: k.s.warnings,
      totals: { events: last.events, revisions: last.revisions, revsPerEventsPct: (last.revisions * 100) / last.events },
    };
    console.log(`\nkube-churn result (${minutes} min after the initial sync):`);
    console.log(`  updates made            ${fmt(made)} (${fmt(real)} change what a proxy uses: ${((real * 100) / made).toFixed(2)} %)`);
    console.log(`  events (store writes)   ${fmt(events)}`);
    console.log(`  revisions               ${fmt(revisions)}   revisions/events ${r.revsPerEventsPct.toFixed(3)} %`);
    console.log(`  node ${node}: ${fmt(r.nodeSyncs)} syncs, ${fmt(r.nodeOps)} ops`);
    console.log(`  CPU                     ${r.cpuPct.toFixed(2)} % of one core (kpng process, average)`);
    console.log(`  RSS                     ${r.rssMiB.min.toFixed(1)}–${r.rssMiB.max.toFixed(1)} MiB (end ${r.rssMiB.end.toFixed(1)})`);
    console.log(`  with the initial list   ${fmt(last.events)} events, ${fmt(last.revisions)} revisions (${r.totals.revsPerEventsPct.toFixed(3)} %)`);
    console.log(`  warnings logged         ${k.s.warnings}`);
    console.log(JSON.stringify({ churn: r }));
  } finally {
    await k.stop();
    await server.close();
  }
}

/** RSS of `kpng kube ... to-local to-log` once it has listed a cluster of this size. */
async function listRSS(dir: string, services: number, endpoints: number, nodes: number): Promise<{ rss: number; ms: number; ops: number }> {
  const server = await new TestApiServer().start();
  try {
    const cluster = new SyntheticCluster(server, prng(1));
    if (services) cluster.populate({ services, pods: endpoints, nodes });
    const t0 = Date.now();
    const k = startKpng(certKubeconfig(join(dir, `kubeconfig-${services}`), server.url), 'node-1');
    try {
      await k.until(() => k.s.syncs >= 1, 'initial sync', 600_000);
      const ms = Date.now() - t0;
      await sleep(5000); // settle: GC after the initial burst
      return { rss: k.last()!.rss, ms, ops: k.s.ops };
    } finally {
      await k.stop();
    }
  } finally {
    await server.close();
  }
}

/** In a child with --expose-gc: heap of store + reflectors after the list, and of the reflectors' key -> resourceVersion maps. */
async function heapProbe() {
  const { Store } = await import('../src/store/store.js');
  const { KubeSource } = await import('../src/sources/kube/index.js');
  const { resolveConnection } = await import('../src/sources/kube/config.js');
  const { pino } = await import('pino');
  const gc = (globalThis as { gc?: () => void }).gc!;
  const heap = () => (gc(), gc(), process.memoryUsage().heapUsed);
  const h0 = heap();
  const store = new Store();
  const src = new KubeSource(store, pino({ level: 'warn' }), { connection: resolveConnection({ kubeconfig: process.env.KPNG_BENCH_HEAP! }, {}) });
  src.start();
  while (!store.allSynced) await sleep(50);
  const objects = src.reflectors.reduce((a, r) => a + r.size, 0);
  await src.stop();
  const h1 = heap();
  for (const r of src.reflectors) (r as unknown as { known: Map<string, string> }).known = new Map();
  const h2 = heap();
  process.send!({ objects, total: h1 - h0, reflectors: h1 - h2 });
}

async function heapPerObject(dir: string, services: number, endpoints: number, nodes: number) {
  const server = await new TestApiServer().start();
  try {
    new SyntheticCluster(server, prng(1)).populate({ services, pods: endpoints, nodes });
    const kc = certKubeconfig(join(dir, 'kubeconfig-heap'), server.url);
    const child = spawn(process.execPath, ['--expose-gc', '--import', 'tsx', fileURLToPath(import.meta.url)], {
      cwd: ROOT,
      env: { ...process.env, KPNG_BENCH_HEAP: kc },
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    const r = await new Promise<{ objects: number; total: number; reflectors: number }>((resolve, reject) => {
      child.on('message', (m) => resolve(m as never));
      child.on('exit', (code) => reject(new Error(`heap probe exited ${code}`)));
    });
    child.kill();
    return r;
  } finally {
    await server.close();
  }
}

export default async function (args: string[]) {
  const dir = mkdtempSync(join(tmpdir(), 'kpng-bench-kube-'));
  if (!flag(args, 'tsx')) compile();
  console.log(`kube-churn: kpng is node ${KPNG.map((p) => p.replace(ROOT, '')).join(' ')}`);
  try {
    if (!flag(args, 'skip-churn')) await churn(args, dir);
    if (!flag(args, 'skip-big')) {
      const services = num(args, 'big-services', 10_000);
      const endpoints = num(args, 'big-endpoints', 50_000);
      const nodes = 100;
      const empty = await listRSS(dir, 0, 0, 0);
      const big = await listRSS(dir, services, endpoints, nodes);
      const h = await heapPerObject(dir, services, endpoints, nodes);
      const objects = services * 2 + nodes + 1;
      console.log(`\nlist-only RSS (kpng kube ... to-local to-log --node-name node-1, after sync + 5 s):`);
      console.log(`  empty cluster                          ${empty.rss.toFixed(1)} MiB`);
      console.log(`  ${fmt(services)} services / ${fmt(endpoints)} endpoints / ${nodes} nodes: ${big.rss.toFixed(1)} MiB (synced in ${fmt(big.ms)} ms from process start, ${fmt(big.ops)} ops)`);
      console.log(`  RSS per object (${fmt(objects)} objects)       ${(((big.rss - empty.rss) * 2 ** 20) / objects / 1024).toFixed(2)} KiB (store, views, one node's diff state, reflectors)`);
      console.log(`  heap after GC, store + reflectors      ${(h.total / 2 ** 20).toFixed(1)} MiB = ${(h.total / h.objects).toFixed(0)} B per object`);
      console.log(`  of which reflectors' key -> rv maps    ${(h.reflectors / 2 ** 20).toFixed(2)} MiB = ${(h.reflectors / h.objects).toFixed(0)} B per object`);
      console.log(JSON.stringify({ list: { services, endpoints, nodes, emptyRSS: empty.rss, bigRSS: big.rss, syncMs: big.ms, heap: h } }));
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

if (process.env.KPNG_BENCH_HEAP) await heapProbe();
