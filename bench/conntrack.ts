// Conntrack cleanup during a UDP rollout, measured as a user runs kpng: a
// real `kpng file ... to-local to-nft` process in its own network namespace
// with 1,000 UDP ClusterIP Services x 3 endpoints and one TCP Service
// (nftables.syncPeriod 5s, minSyncPeriod 100ms). Every third UDP Service has
// conntrack entries to each of its endpoints (inserted over ctnetlink, as its
// clients' traffic would leave them), beside unrelated UDP entries. All UDP
// endpoints are rewritten (a rollout), and the TCP Service's endpoint changes
// 0.3 s later.
//
// The same run for the old way (one `conntrack -D` process per stale flow, 4
// at a time, awaited by the sync: kpng as of OLD_COMMIT, taken from git) and
// the new (ctnetlink in the background), one after the other. Printed: the
// TCP change's latency alone (median of 3) and during the rollout, how long
// kpng still applied the rollout itself after the TCP change was written (its
// log), what the TCP change waited beyond both (held back), when the stale
// entries were gone (watched every 100 ms from the rollout), how many went,
// kpng's own cleanup metrics, and /healthz polled every 100 ms throughout
// (0: no answer within 5 s, a load balancer's usual timeout).
//   npm run bench -- conntrack [--services 1000] [--share 3] [--others 2000] [--gap 300] [--ways old,new]
import { execFileSync, spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, renameSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createConnection, createServer } from 'node:net';
import { get } from 'node:http';
import { node, service, slice } from '../test/helpers/k8s.js';
import { syncEnds } from '../test/helpers/logs.js';
import { ConntrackNetlink, IPPROTO_UDP, type ConntrackEntry } from '../src/kernel/conntrack.js';
import { BenchNamespaces, prepareNamespace, serveAsChild, vip } from './_scale.js';
import { ROOT, arg, median, now } from './_harness.js';

/** the last commit whose cleanup ran one `conntrack -D` per stale flow and held the sync until all had ended */
const OLD_COMMIT = '3f09290';

const TCP_VIP = '172.20.0.10';
/** the TCP Service's two endpoints: servers on lo in the namespace */
const TCP_A = '10.255.0.1';
const TCP_B = '10.255.0.3';
const HEALTHZ = { host: '127.0.0.1', port: 10256 };
const METRICS = { host: '127.0.0.1', port: 10249 };
/** the client of the stale entries, and of the unrelated ones */
const STALE_CLIENT = '10.254.0.1';
const OTHER_CLIENT = '10.254.0.2';

/** endpoint e of UDP Service s in rollout generation g */
const udpEndpoint = (g: number, s: number, e: number) => `10.${100 + g * 8 + e}.${s >> 8}.${s & 255}`;
const hex = (ip: string) => Buffer.from(ip.split('.').map(Number)).toString('hex');

function cluster(services: number, generation: number, tcpEndpoint: string): object {
  const items: object[] = [node('node-0', undefined, ['192.168.0.2'])];
  items.push(service('bench', 'web', { clusterIP: TCP_VIP }), slice('bench', 'web-1', 'web', [{ ip: tcpEndpoint, node: 'node-0' }]));
  for (let s = 1; s <= services; s++) {
    items.push(service('dns', `u${s}`, { clusterIP: vip(s), ports: [{ name: 'dns', port: 53, protocol: 'UDP', targetPort: 5353 }] }));
    items.push(slice('dns', `u${s}-1`, `u${s}`, [0, 1, 2].map((e) => ({ ip: udpEndpoint(generation, s, e), node: `node-${e + 1}` })), [{ name: 'dns', port: 5353, protocol: 'UDP' }]));
  }
  return { apiVersion: 'v1', kind: 'List', items };
}

function udpEntry(client: string, sport: number, dst: string, replyFrom: string): ConntrackEntry {
  return { family: 4, proto: IPPROTO_UDP, orig: { src: hex(client), dst: hex(dst), sport, dport: 53 }, reply: { src: hex(replyFrom), dst: hex(client), sport: replyFrom === dst ? 53 : 5353, dport: sport }, zone: 0 };
}

// --- the child, in the namespace: the TCP Service's endpoints, and what reaches them

type ProbeRequest = { op: 'ready' } | { op: 'wait'; endpoint: string; timeoutMs: number } | { op: 'healthz'; on: boolean } | { op: 'metrics' };

async function startProbe(): Promise<(r: ProbeRequest) => Promise<unknown>> {
  prepareNamespace();
  execFileSync('ip', ['addr', 'add', `${TCP_B}/32`, 'dev', 'lo']);
  // each endpoint answers with its own address (unref'd: the child ends with its input)
  await Promise.all([TCP_A, TCP_B].map((ip) => new Promise<void>((resolve) => createServer((s) => s.end(ip)).listen(8080, ip, resolve).unref())));
  const answeredBy = () =>
    new Promise<string>((resolve) => {
      const c = createConnection({ host: TCP_VIP, port: 80, timeout: 300 });
      let got = '';
      c.on('data', (d) => (got += d));
      c.on('end', () => resolve(got));
      c.on('timeout', () => c.destroy());
      c.on('error', () => resolve(''));
      c.on('close', () => resolve(got));
    });
  const fetchText = (o: { host: string; port: number }, path: string) =>
    new Promise<{ code: number; body: string }>((resolve) => {
      const r = get({ ...o, path, timeout: 5000 }, (res) => {
        let body = '';
        res.on('data', (d) => (body += d));
        res.on('end', () => resolve({ code: res.statusCode ?? 0, body }));
      });
      r.on('timeout', () => r.destroy(new Error('timeout')));
      r.on('error', () => resolve({ code: 0, body: '' }));
    });
  let healthz: { timer: NodeJS.Timeout; codes: number[] } | undefined;
  return async (r) => {
    if (r.op === 'ready') return true;
    if (r.op === 'wait') {
      const end = Date.now() + r.timeoutMs;
      while (Date.now() < end) {
        if ((await answeredBy()) === r.endpoint) return true;
        await new Promise((res) => setTimeout(res, 10));
      }
      return false;
    }
    if (r.op === 'metrics') return (await fetchText(METRICS, '/metrics')).body;
    if (r.on) {
      const codes: number[] = [];
      healthz = { codes, timer: setInterval(() => void fetchText(HEALTHZ, '/healthz').then((x) => codes.push(x.code)), 100).unref() };
      return null;
    }
    clearInterval(healthz?.timer);
    return healthz?.codes ?? [];
  };
}

// --- the parent

interface Result {
  way: string;
  aloneMs: number;
  duringMs: number;
  /** how long after the TCP change was written kpng still applied the rollout (its last sync before the TCP change's ended) */
  rolloutAfterMs: number;
  staleGoneMs: number;
  staleEntries: number;
  staleLeft: number;
  deletedMetric: number;
  roundsMetric?: { count: number; sumMs: number };
  healthz: number[];
}

const metricValue = (text: string, series: string) => [...text.matchAll(new RegExp(`^${series}(?:\\{[^}]*\\})? ([0-9.e+-]+)$`, 'gm'))].reduce((a, m) => a + Number(m[1]), 0);

async function runWay(way: string, kpngBin: string, spaces: BenchNamespaces, dir: string, o: { services: number; share: number; others: number; gap: number }): Promise<Result> {
  const ns = spaces.add();
  const probe = spaces.keep(ns, {}, `the probe in ${ns}`);
  // lo up and the endpoints' servers on it before kpng starts
  await probe.ask({ op: 'ready' });
  const stateDir = join(dir, `${way}-state`);
  mkdirSync(stateDir);
  const write = (gen: number, tcp: string) => {
    writeFileSync(join(dir, 'state.tmp'), JSON.stringify(cluster(o.services, gen, tcp)));
    renameSync(join(dir, 'state.tmp'), join(stateDir, 'state.json'));
  };
  const config = join(dir, `${way}-config.json`);
  writeFileSync(config, JSON.stringify({ apiVersion: 'kubeproxy.config.k8s.io/v1alpha1', kind: 'KubeProxyConfiguration', mode: 'nftables', healthzBindAddress: `${HEALTHZ.host}:${HEALTHZ.port}`, metricsBindAddress: `${METRICS.host}:${METRICS.port}`, nftables: { syncPeriod: '5s', minSyncPeriod: '100ms' } }));
  write(0, TCP_A);
  let stderr = '';
  const kpng: ChildProcess = spawn('ip', ['netns', 'exec', ns, process.execPath, kpngBin, '--log-level', 'debug', 'file', '--input', stateDir, 'to-local', 'to-nft', '--node-name', 'node-0', '--config', config], { stdio: ['ignore', 'ignore', 'pipe'] });
  kpng.stderr!.on('data', (d) => (stderr += d));
  const ct = new ConntrackNetlink(ns);
  const waitFor = async (endpoint: string, what: string, timeoutMs = 600_000) => {
    const t = now();
    if (!(await probe.ask<boolean>({ op: 'wait', endpoint, timeoutMs }))) throw new Error(`${way}: ${what} never reached the kernel\n${stderr.slice(-3000)}`);
    return now() - t;
  };
  try {
    await waitFor(TCP_A, 'the first sync', 120_000);
    // alone: three changes, the median
    const alone: number[] = [];
    for (const tcp of [TCP_B, TCP_A, TCP_B]) {
      write(0, tcp);
      alone.push(await waitFor(tcp, 'the TCP change alone'));
      await new Promise((r) => setTimeout(r, 300));
    }
    // what the Services' clients left in the table
    const stale: ConntrackEntry[] = [];
    for (let s = 1; s <= o.services; s += o.share) for (let e = 0; e < 3; e++) stale.push(udpEntry(STALE_CLIENT, 1024 + stale.length, vip(s), udpEndpoint(0, s, e)));
    const others = Array.from({ length: o.others }, (_, i) => udpEntry(OTHER_CLIENT, 1024 + i, `10.77.${i >> 8}.${i & 255}`, `10.77.${i >> 8}.${i & 255}`));
    const made = await ct.create([...stale, ...others], 3600);
    if (made.done !== stale.length + others.length) throw new Error(`${way}: entries inserted: ${JSON.stringify(made)}`);
    const staleLeft = async () => (await ct.list(4, IPPROTO_UDP, (e) => e.orig.src === hex(STALE_CLIENT))).length;
    const deletedBefore = metricValue(await probe.ask<string>({ op: 'metrics' }), 'kubeproxy_conntrack_reconciler_deleted_entries_total');
    await probe.ask({ op: 'healthz', on: true });
    // the rollout, then the TCP change; the stale entries watched meanwhile
    const syncsBefore = syncEnds(stderr).length;
    const t0 = now();
    write(1, TCP_B);
    const staleGone = (async () => {
      let left = await staleLeft();
      while (left > 0 && now() - t0 < 900_000) {
        await new Promise((r) => setTimeout(r, 100));
        left = await staleLeft();
      }
      return { ms: now() - t0, left };
    })();
    await new Promise((r) => setTimeout(r, o.gap));
    const tTcp = Date.now();
    write(1, TCP_A);
    const duringMs = await waitFor(TCP_A, 'the TCP change during the rollout');
    // the rollout is applied by the syncs before the TCP change's, or by that one when it took both
    const ends = syncEnds(stderr).slice(syncsBefore);
    const rolloutAfterMs = ends.length ? Math.max(0, (ends.length > 1 ? ends.at(-2)! : ends[0]) - tTcp) : 0;
    const gone = await staleGone;
    const healthz = await probe.ask<number[]>({ op: 'healthz', on: false });
    const metrics = await probe.ask<string>({ op: 'metrics' });
    const duration = 'kubeproxy_conntrack_reconciler_sync_duration_seconds';
    const rounds = metrics.includes(duration) ? { count: metricValue(metrics, `${duration}_count`), sumMs: metricValue(metrics, `${duration}_sum`) * 1000 } : undefined;
    const deleted = metricValue(metrics, 'kubeproxy_conntrack_reconciler_deleted_entries_total') - deletedBefore;
    return { way, aloneMs: median(alone), duringMs, rolloutAfterMs, staleGoneMs: gone.ms, staleEntries: stale.length, staleLeft: gone.left, deletedMetric: deleted, roundsMetric: rounds, healthz };
  } finally {
    ct.close();
    kpng.kill('SIGKILL');
    await probe.end();
    spaces.remove(ns);
  }
}

/** kpng as of OLD_COMMIT, from this checkout's git history (its node_modules shared); undefined when there is no history here */
function oldKpng(dir: string): string | undefined {
  const tree = join(dir, 'old');
  mkdirSync(tree);
  const archive = spawnSync('git', ['-C', ROOT, 'archive', '--format=tar', OLD_COMMIT, 'bin', 'src', 'package.json', 'tsconfig.json'], { maxBuffer: 1 << 30 });
  if (archive.status !== 0) return undefined;
  const untar = spawnSync('tar', ['-x', '-C', tree], { input: archive.stdout });
  if (untar.status !== 0) return undefined;
  symlinkSync(join(ROOT, 'node_modules'), join(tree, 'node_modules'));
  return join(tree, 'bin/kpng.js');
}

export default async function (args: string[]) {
  if (await serveAsChild(startProbe)) return;
  const o = { services: Number(arg(args, 'services', '1000')), share: Number(arg(args, 'share', '3')), others: Number(arg(args, 'others', '2000')), gap: Number(arg(args, 'gap', '300')) };
  const dir = mkdtempSync(join(tmpdir(), 'kpng-bench-conntrack-'));
  const spaces = new BenchNamespaces('conntrack', 'kpng-bench-ct');
  try {
    const wanted = arg(args, 'ways', 'old,new').split(',');
    const old = wanted.includes('old') ? oldKpng(dir) : undefined;
    const ways: [string, string][] = [];
    if (old) ways.push(['old', old]);
    if (wanted.includes('new')) ways.push(['new', join(ROOT, 'bin/kpng.js')]);
    if (!old && wanted.includes('old')) console.log(`(no git history here: the old way, kpng as of ${OLD_COMMIT}, is left out)`);
    const results: Result[] = [];
    for (const [way, bin] of ways) {
      console.error(`${way}: running`);
      results.push(await runWay(way, bin, spaces, dir, o));
    }
    console.log(`conntrack cleanup during a UDP rollout: ${o.services} UDP Services x 3 endpoints (${Math.ceil(o.services / o.share) * 3} stale entries, ${o.others} unrelated UDP entries) and one TCP Service whose endpoint changes ${o.gap} ms after the rollout; to-nft, syncPeriod 5s, minSyncPeriod 100ms`);
    console.log('  way | TCP change alone | during the rollout | rollout still applied after it | held back | stale entries gone after | deleted (metric) | cleanup rounds (metric) | /healthz not 200');
    for (const r of results) {
      const rounds = r.roundsMetric ? `${r.roundsMetric.count} rounds, ${r.roundsMetric.sumMs.toFixed(0)} ms` : 'n/a';
      const bad = r.healthz.filter((c) => c !== 200).length;
      // held back: what the TCP change waited beyond its own time and the rollout's own apply
      const held = Math.max(0, r.duringMs - r.aloneMs - r.rolloutAfterMs);
      console.log(
        `  ${r.way.padEnd(3)} | ${r.aloneMs.toFixed(0).padStart(6)} ms | ${r.duringMs.toFixed(0).padStart(8)} ms (${(r.duringMs / r.aloneMs).toFixed(1)}x) | ${r.rolloutAfterMs.toFixed(0).padStart(6)} ms | ${held.toFixed(0).padStart(7)} ms | ${r.staleGoneMs.toFixed(0).padStart(8)} ms (${r.staleEntries - r.staleLeft} of ${r.staleEntries}) | ${r.deletedMetric} | ${rounds} | ${bad} of ${r.healthz.length} polls`,
      );
    }
  } finally {
    spaces.close();
    rmSync(dir, { recursive: true, force: true });
  }
}
