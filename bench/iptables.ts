// iptables vs nftables at scale, side by side in one run: to-iptables (with
// iptables-nft and iptables-legacy) and to-nft, for 1k / 10k / 30k Services x
// 5 endpoints, each backend and size in its own network namespace (real
// tools, real kernel):
//   npm run bench -- iptables [--sizes 1000,10000,30000] [--changes 20] [--connections 2000]
//                             [--backends nft,iptables-nft,iptables-legacy] [--runs 1] [--iptables-nft-max 10000]
// Reports: cold sync; one endpoint change from the store seeing it to the
// kernel having it (p50/p99); first-connection latency through a ClusterIP
// whose rule is first in KUBE-SERVICES and one whose rule is last, measured
// by a small separate process once the big one has exited (its GC pauses
// would pollute p99). iptables-nft runs up to --iptables-nft-max Services: its
// cold restore grows faster than linearly (37 s at 10k here, not done after
// 10 min at 30k).
import { spawn, spawnSync, execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { pino } from 'pino';
import { Store, KINDS } from '../src/store/store.js';
import { ServiceViews } from '../src/localstate/views.js';
import { LocalDiff } from '../src/diff/local-diff.js';
import { DecoderSink, type DecoderHandler } from '../src/diff/decoder.js';
import { LocalSet } from '../src/api/model.js';
import { convertObject } from '../src/sources/objects.js';
import { applyObject, type ModelObject } from '../src/sources/apply.js';
import { NftProxier } from '../src/backends/nft/proxier.js';
import { IptablesProxier } from '../src/backends/iptables/proxier.js';
import { defaultConfig } from '../src/backends/shared/config.js';
import { service, slice, node } from '../test/helpers/k8s.js';

type Backend = 'nft' | 'iptables-nft' | 'iptables-legacy';

interface SyncResult {
  backend: Backend;
  services: number;
  coldComputeMs: number;
  coldApplyMs: number;
  changeP50: number;
  changeP99: number;
  rssMiB: number;
}

interface Latency {
  /** microseconds */
  first: number[];
  last: number[];
}

const arg = (args: string[], name: string, def: string) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? args[i + 1] : def;
};
const pct = (xs: number[], p: number) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))];
const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const now = () => Number(process.hrtime.bigint()) / 1e6;

// probe Services: their KUBE-SERVICES rules sort first ("aaa/...") and last ("zzz/...")
const PROBE_FIRST = '172.31.255.1';
const PROBE_LAST = '172.31.255.2';
const ENDPOINT = '10.255.0.1';

export default async function (args: string[]) {
  if (process.env.KPNG_BENCH_CHILD) {
    const r = await child(JSON.parse(process.env.KPNG_BENCH_CHILD));
    console.log('RESULT ' + JSON.stringify(r));
    return;
  }
  if (process.getuid?.() !== 0) throw new Error('the iptables benchmark needs root (it creates network namespaces)');
  const sizes = arg(args, 'sizes', '1000,10000,30000').split(',').map(Number);
  const changes = Number(arg(args, 'changes', '20'));
  const connections = Number(arg(args, 'connections', '2000'));
  const runs = Number(arg(args, 'runs', '1'));
  const backends = arg(args, 'backends', 'nft,iptables-nft,iptables-legacy').split(',') as Backend[];
  const nftModeMax = Number(arg(args, 'iptables-nft-max', '10000'));
  const root = fileURLToPath(new URL('..', import.meta.url));
  const results = new Map<string, { sync: SyncResult[]; lat: Latency[] }>();

  // a benchmark interrupted (Ctrl-C, timeout) removes its namespace
  let current: string | undefined;
  const cleanup = () => {
    running?.kill('SIGKILL');
    if (current) spawnSync('ip', ['netns', 'del', current]);
    current = undefined;
  };
  const onSignal = () => {
    cleanup();
    process.exit(130);
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);

  for (let run = 0; run < runs; run++) {
    for (const services of sizes) {
      for (const backend of backends) {
        if (backend === 'iptables-nft' && services > nftModeMax) continue;
        const ns = (current = `kpng-bench-ipt-${randomBytes(3).toString('hex')}`);
        execFileSync('ip', ['netns', 'add', ns]);
        try {
          const r = await exec(['ip', 'netns', 'exec', ns, process.execPath, '--expose-gc', '--import', 'tsx', `${root}bench/run.ts`, 'iptables'], { KPNG_BENCH_CHILD: JSON.stringify({ backend, services, changes }) }, root);
          const line = r.stdout.split('\n').find((l) => l.startsWith('RESULT '));
          if (!line) throw new Error(`${backend} ${services} failed: ${r.stderr || r.stdout}`);
          // the rules stay in the namespace: a small process measures connections through them
          const p = await exec(['ip', 'netns', 'exec', ns, process.execPath, '-e', PROBE, String(connections)], {}, root);
          if (p.code !== 0) throw new Error(`probe for ${backend} ${services} failed: ${p.stderr}`);
          const k = `${services} ${backend}`;
          if (!results.has(k)) results.set(k, { sync: [], lat: [] });
          results.get(k)!.sync.push(JSON.parse(line.slice(7)));
          results.get(k)!.lat.push(JSON.parse(p.stdout));
          console.error(`run ${run + 1}/${runs}: ${services} services, ${backend} done`);
        } finally {
          cleanup();
        }
      }
    }
  }
  process.removeListener('SIGINT', onSignal);
  process.removeListener('SIGTERM', onSignal);

  const f = (x: number) => (x < 10 ? x.toFixed(2) : x.toFixed(0));
  const us = (x: number) => x.toFixed(0);
  const tools = ['nft --version', 'iptables-nft --version', 'iptables-legacy --version'].map((c) => spawnSync('sh', ['-c', c], { encoding: 'utf8' }).stdout.trim()).join(', ');
  console.log(`iptables vs nftables: services x 5 endpoints, each backend and size in a fresh network namespace; ${runs} run(s): medians of the runs' values (min in brackets when runs > 1); node ${process.version}; ${tools}`);
  console.log('services | backend | cold sync: compute + apply | one endpoint change p50 / p99 | first connection, rule first: p50 / p99 | rule last: p50 / p99 | RSS');
  for (const services of sizes) {
    for (const backend of backends) {
      const r = results.get(`${services} ${backend}`);
      if (!r) {
        if (backend === 'iptables-nft' && services > nftModeMax) console.log(`${services} | ${backend} | not run (more than --iptables-nft-max ${nftModeMax} Services) | | | |`);
        continue;
      }
      const m = (pick: (s: SyncResult) => number) => {
        const xs = r.sync.map(pick);
        return runs > 1 ? `${f(median(xs))} [${f(Math.min(...xs))}]` : f(xs[0]);
      };
      const l = (pick: (l: Latency) => number[], p: number) => {
        const xs = r.lat.map((x) => pct(pick(x), p));
        return runs > 1 ? `${us(median(xs))} [${us(Math.min(...xs))}]` : us(xs[0]);
      };
      console.log(
        `${services} | ${backend} | ${m((s) => s.coldComputeMs)} + ${m((s) => s.coldApplyMs)} ms | ${m((s) => s.changeP50)} / ${m((s) => s.changeP99)} ms | ${l((x) => x.first, 50)} / ${l((x) => x.first, 99)} us | ${l((x) => x.last, 50)} / ${l((x) => x.last, 99)} us | ${m((s) => s.rssMiB)} MiB`,
      );
    }
  }
}

let running: ReturnType<typeof spawn> | undefined;

/** runs a command to completion, asynchronously (signals reach this process meanwhile) */
function exec(argv: string[], env: Record<string, string>, cwd: string): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const p = (running = spawn(argv[0], argv.slice(1), { cwd, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] }));
    let stdout = '';
    let stderr = '';
    p.stdout.on('data', (d) => (stdout += d));
    p.stderr.on('data', (d) => (stderr = (stderr + d).slice(-20_000)));
    p.on('close', (code) => {
      running = undefined;
      resolve({ code, stdout, stderr });
    });
  });
}

async function child(p: { backend: Backend; services: number; changes: number }): Promise<SyncResult> {
  execFileSync('ip', ['link', 'set', 'lo', 'up']);
  // the probe's endpoint lives on lo (this kernel has no dummy links); service IPs are routed there too
  execFileSync('ip', ['addr', 'add', `${ENDPOINT}/32`, 'dev', 'lo']);
  execFileSync('ip', ['route', 'add', '172.16.0.0/12', 'dev', 'lo']);

  const config = defaultConfig();
  config.clusterCIDRs = ['10.0.0.0/8'];
  config.nftables.minSyncPeriodMs = config.iptables.minSyncPeriodMs = 0; // measure each change alone
  const log = pino({ level: 'warn' });
  const proxier: DecoderHandler & { close(): Promise<void> } =
    p.backend === 'nft'
      ? new NftProxier({ nodeName: 'node-0', config, log, once: true, healthChecks: false, families: [4] })
      : new IptablesProxier({ nodeName: 'node-0', config, log, once: true, healthChecks: false, families: [4], mode: p.backend === 'iptables-nft' ? 'nft' : 'legacy' });
  const store = new Store();
  const ip = (i: number) => `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`;
  const vip = (s: number) => `172.${16 + (s >> 16)}.${(s >> 8) & 255}.${s & 255}`;
  const sliceOf = (s: number, gen = 0) =>
    slice('bench', `svc-${s}-1`, `svc-${s}`, Array.from({ length: 5 }, (_, e) => ({ ip: e === 0 && gen ? ip(s * 5 + e + gen * 1_000_000) : ip(s * 5 + e), node: `node-${(s * 5 + e) % 100}`, pod: `p-${s}-${e}-${e === 0 ? gen : 0}` })));
  store.update((tx) => {
    applyObject(tx, convertObject(node('node-0', 'z1', ['192.168.0.2'])) as ModelObject);
    for (const [ns, clusterIP] of [['aaa', PROBE_FIRST], ['zzz', PROBE_LAST]]) {
      applyObject(tx, convertObject(service(ns, 'probe', { clusterIP, ports: [{ name: 'http', port: 80 }] })) as ModelObject);
      applyObject(tx, convertObject(slice(ns, 'probe-1', 'probe', [{ ip: ENDPOINT, node: 'node-0', pod: `probe-${ns}` }])) as ModelObject);
    }
    for (let s = 0; s < p.services - 2; s++) {
      applyObject(tx, convertObject(service('bench', `svc-${s}`, { clusterIP: vip(s), ports: [{ name: 'http', port: 80 }] })) as ModelObject);
      applyObject(tx, convertObject(sliceOf(s)) as ModelObject);
    }
    KINDS.forEach((k) => tx.setSynced(k));
  });
  const diff = new LocalDiff(store, new ServiceViews(store), 'node-0', { sets: [LocalSet.NodesSet, LocalSet.ServiceCIDRsSet] });
  const sink = new DecoderSink(proxier);

  // cold sync: ops into the proxier, then the sync that applies them
  let t0 = now();
  const ops = diff.next();
  for (const op of ops.slice(0, -1)) await sink.send(op);
  const coldComputeMs = now() - t0;
  t0 = now();
  await sink.send(ops.at(-1)!);
  const coldApplyMs = now() - t0;

  // one endpoint change at a time: store update -> ops -> kernel
  const times: number[] = [];
  for (let i = 0; i < p.changes; i++) {
    const s = (i * 7919) % (p.services - 2);
    const c = convertObject(sliceOf(s, i + 1)) as ModelObject;
    const t = now();
    store.update((tx) => applyObject(tx, c));
    for (const op of diff.next()) await sink.send(op);
    times.push(now() - t);
  }
  await proxier.close();
  (globalThis as { gc?: () => void }).gc?.();
  return { backend: p.backend, services: p.services, coldComputeMs, coldApplyMs, changeP50: pct(times, 50), changeP99: pct(times, 99), rssMiB: process.memoryUsage.rss() / 2 ** 20 };
}

/** the probe: a server at the endpoint, then connections to the two probe Services, interleaved; prints microseconds */
const PROBE = `
const net = require('node:net');
const n = Number(process.argv[1]);
const one = (host) => new Promise((resolve, reject) => {
  const t = process.hrtime.bigint();
  const c = net.connect({ host, port: 80 }, () => { const us = Number(process.hrtime.bigint() - t) / 1e3; c.destroy(); resolve(us); });
  c.on('error', reject);
});
const srv = net.createServer((s) => s.destroy()).listen(8080, '${ENDPOINT}', async () => {
  const first = [], last = [];
  for (let i = 0; i < 100; i++) { await one('${PROBE_FIRST}'); await one('${PROBE_LAST}'); }
  for (let i = 0; i < n; i++) { first.push(await one('${PROBE_FIRST}')); last.push(await one('${PROBE_LAST}')); }
  console.log(JSON.stringify({ first, last }));
  srv.close();
});
`;
