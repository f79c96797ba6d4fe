// nftables backend at scale, side by side for 1k / 10k / 30k Services x 5
// endpoints, each size in its own network namespace (real nft, real kernel):
//   npm run bench -- nft [--sizes 1000,10000,30000] [--changes 100] [--connections 3000]
// Reports: cold sync; one endpoint change from the source seeing it to the
// kernel having it (p50/p99); first-connection latency through a ClusterIP.
import { spawnSync, execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { pino } from 'pino';
import { Store, KINDS } from '../src/store/store.js';
import { ServiceViews } from '../src/localstate/views.js';
import { LocalDiff } from '../src/diff/local-diff.js';
import { DecoderSink } from '../src/diff/decoder.js';
import { LocalSet } from '../src/api/model.js';
import { convertObject } from '../src/sources/objects.js';
import { applyObject, type ModelObject } from '../src/sources/apply.js';
import { NftProxier } from '../src/backends/nft/proxier.js';
import { defaultConfig } from '../src/backends/shared/config.js';
import { service, slice, node } from '../test/helpers/k8s.js';

interface Result {
  services: number;
  coldComputeMs: number;
  coldApplyMs: number;
  coldBytes: number;
  changeP50: number;
  changeP99: number;
  changeApplyP50: number;
  connectP50: number;
  connectP99: number;
  rssMiB: number;
}

const arg = (args: string[], name: string, def: string) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? args[i + 1] : def;
};
const pct = (xs: number[], p: number) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))];
const now = () => Number(process.hrtime.bigint()) / 1e6;

export default async function (args: string[]) {
  if (process.env.KPNG_BENCH_CHILD) {
    const r = await child(JSON.parse(process.env.KPNG_BENCH_CHILD));
    console.log('RESULT ' + JSON.stringify(r));
    return;
  }
  if (process.getuid?.() !== 0) throw new Error('the nft benchmark needs root (it creates network namespaces)');
  const sizes = arg(args, 'sizes', '1000,10000,30000').split(',').map(Number);
  const changes = Number(arg(args, 'changes', '100'));
  const connections = Number(arg(args, 'connections', '3000'));
  const results: Result[] = [];
  const root = fileURLToPath(new URL('..', import.meta.url));
  const namespaces: string[] = [];
  try {
    for (const services of sizes) {
      const ns = `kpng-bench-${randomBytes(3).toString('hex')}`;
      execFileSync('ip', ['netns', 'add', ns]);
      namespaces.push(ns);
      const r = spawnSync('ip', ['netns', 'exec', ns, process.execPath, '--expose-gc', '--import', 'tsx', `${root}bench/run.ts`, 'nft'], {
        cwd: root,
        encoding: 'utf8',
        env: { ...process.env, KPNG_BENCH_CHILD: JSON.stringify({ services, changes }) },
        maxBuffer: 64 << 20,
      });
      const line = r.stdout.split('\n').find((l) => l.startsWith('RESULT '));
      if (!line) throw new Error(`benchmark for ${services} failed: ${r.stderr || r.stdout}`);
      results.push(JSON.parse(line.slice(7)));
      console.error(`${services} services programmed`);
    }
    // first-connection latency, side by side: the rules stay in each
    // namespace; rounds alternate between sizes so noise hits them alike
    const lat = namespaces.map(() => [] as number[]);
    const rounds = 5;
    for (let round = 0; round < rounds; round++) {
      namespaces.forEach((ns, i) => lat[i].push(...connectLatencies(ns, '172.16.0.0', 80, Math.ceil(connections / rounds) + 100)));
    }
    results.forEach((r, i) => {
      r.connectP50 = pct(lat[i], 50);
      r.connectP99 = pct(lat[i], 99);
    });
  } finally {
    for (const ns of namespaces) spawnSync('ip', ['netns', 'del', ns]);
  }
  const base = results[0];
  const f = (x: number) => x.toFixed(x < 10 ? 2 : 0);
  console.log(`nft benchmark: services x 5 endpoints, each size in a fresh network namespace; node ${process.version}, ${execFileSync('nft', ['--version'], { encoding: 'utf8' }).trim()}`);
  console.log('services | cold sync: compute + apply (transaction) | one endpoint change p50 / p99 (apply p50) | vs smallest (p99) | first connection p50 / p99 | vs smallest (p50) | RSS');
  for (const r of results) {
    console.log(
      `${r.services} | ${f(r.coldComputeMs)} + ${f(r.coldApplyMs)} ms (${(r.coldBytes / 2 ** 20).toFixed(1)} MiB) | ${f(r.changeP50)} / ${f(r.changeP99)} ms (${f(r.changeApplyP50)}) | ${(r.changeP99 / base.changeP99).toFixed(2)}x | ${(r.connectP50 * 1000).toFixed(0)} / ${(r.connectP99 * 1000).toFixed(0)} us | ${(r.connectP50 / base.connectP50).toFixed(2)}x | ${r.rssMiB.toFixed(0)} MiB`,
    );
  }
}

/** new TCP connections one after another from a fresh process in a namespace (ms each; first 100 dropped as warm-up) */
export function connectLatencies(ns: string, host: string, port: number, n: number): number[] {
  const script = `
    const net = require('node:net'); const server = net.createServer((s) => s.end()).listen(8080, '10.255.0.1', async () => {
      const out = [];
      for (let i = 0; i < ${n}; i++) {
        const t = process.hrtime.bigint();
        await new Promise((res, rej) => { const c = net.connect({ host: '${host}', port: ${port} }, () => { out.push(Number(process.hrtime.bigint() - t) / 1e6); c.destroy(); res(); }); c.on('error', rej); });
      }
      server.close(); console.log(JSON.stringify(out.slice(100)));
    });`;
  const r = spawnSync('ip', ['netns', 'exec', ns, process.execPath, '-e', script], { encoding: 'utf8', maxBuffer: 16 << 20 });
  if (r.status !== 0) throw new Error(`latency probe failed: ${r.stderr}`);
  return JSON.parse(r.stdout);
}

async function child(p: { services: number; changes: number }): Promise<Result> {
  execFileSync('ip', ['link', 'set', 'lo', 'up']);
  // a real endpoint for the latency probe: 10.255.0.1:8080 on lo (this
  // kernel has no dummy links); service IPs routed there too
  execFileSync('ip', ['addr', 'add', '10.255.0.1/32', 'dev', 'lo']);
  execFileSync('ip', ['route', 'add', '172.16.0.0/12', 'dev', 'lo']);

  const config = defaultConfig();
  config.clusterCIDRs = ['10.0.0.0/8'];
  config.nftables.minSyncPeriodMs = 0; // measure each change alone
  const proxier = new NftProxier({ nodeName: 'node-0', config, log: pino({ level: 'warn' }), once: true, healthChecks: false });
  const store = new Store();
  const ip = (i: number) => `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`;
  const vip = (s: number) => `172.${16 + (s >> 16)}.${(s >> 8) & 255}.${s & 255}`;
  const sliceOf = (s: number, gen = 0) =>
    slice('bench', `svc-${s}-1`, `svc-${s}`, Array.from({ length: 5 }, (_, e) => ({ ip: s === 0 ? '10.255.0.1' : e === 0 && gen ? ip(s * 5 + e + gen * 1_000_000) : ip(s * 5 + e), node: `node-${(s * 5 + e) % 100}`, pod: `p-${s}-${e}-${e === 0 ? gen : 0}` })));
  store.update((tx) => {
    applyObject(tx, convertObject(node('node-0', 'z1', ['192.168.0.2'])) as ModelObject);
    for (let s = 0; s < p.services; s++) {
      applyObject(tx, convertObject(service('bench', `svc-${s}`, { clusterIP: vip(s), ports: [{ name: 'http', port: 80 }] })) as ModelObject);
      applyObject(tx, convertObject(s === 0 ? slice('bench', 'svc-0-1', 'svc-0', [{ ip: '10.255.0.1', node: 'node-0', pod: 'probe' }]) : sliceOf(s)) as ModelObject);
    }
    KINDS.forEach((k) => tx.setSynced(k));
  });
  const diff = new LocalDiff(store, new ServiceViews(store), 'node-0', { sets: [LocalSet.NodesSet, LocalSet.ServiceCIDRsSet] });
  const sink = new DecoderSink(proxier);

  // cold sync
  let t0 = now();
  const ops = diff.next();
  for (const op of ops.slice(0, -1)) await sink.send(op);
  const computeMs = now() - t0;
  t0 = now();
  await sink.send(ops.at(-1)!);
  const applyMs = now() - t0;
  const coldBytes = proxier.stats.lastTransactionBytes;

  // one endpoint change at a time: store update -> ops -> nft applied
  const times: number[] = [];
  const applies: number[] = [];
  for (let i = 0; i < p.changes; i++) {
    const s = 1 + ((i * 7919) % (p.services - 1));
    const c = convertObject(sliceOf(s, i + 1)) as ModelObject;
    const t = now();
    store.update((tx) => applyObject(tx, c));
    for (const op of diff.next()) await sink.send(op);
    times.push(now() - t);
    applies.push(proxier.stats.lastSyncMs);
  }

  (globalThis as { gc?: () => void }).gc?.();
  return {
    services: p.services,
    coldComputeMs: computeMs,
    coldApplyMs: applyMs,
    coldBytes,
    changeP50: pct(times, 50),
    changeP99: pct(times, 99),
    changeApplyP50: pct(applies, 50),
    connectP50: 0,
    connectP99: 0,
    rssMiB: process.memoryUsage.rss() / 2 ** 20,
  };
}
