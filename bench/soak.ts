// A soak, as a user runs kpng: the real `kpng file ... to-local to-nft`
// process in a network namespace of its own, following a directory where
// every Service's endpoints are rewritten every --interval-ms (a rollout that
// never ends; a third of the Services are UDP, whose endpoint changes cost
// conntrack cleanup). Sampled every --sample-s: kpng's syncs, its network
// programming latency (its own histogram, kubeproxy_network_programming_
// duration_seconds), drift repairs (kpng_dataplane_repairs_total: nothing
// drifts here, so any is a false one), /healthz, and the process's RSS and
// open fds. At the end, once the churn has stopped, kpng's tables must equal
// what a fresh `kpng ... --once` of the final state writes in another
// namespace (normalized `nft list table` output: elements sorted, endpoint
// slots numbered per Service in order).
//   npm run bench -- soak [--minutes 10] [--services 300] [--interval-ms 200]
//     [--sample-s 5] [--sync-period 30s] [--min-sync-period 1s]
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { node, service, slice } from '../test/helpers/k8s.js';
import { BenchNamespaces, vip } from './_scale.js';
import { ROOT, arg } from './_harness.js';

const KPNG = join(ROOT, 'bin/kpng.js');
const ENDPOINTS = 3;
const METRICS = '127.0.0.1:10249';
const HEALTHZ = '127.0.0.1:10256';

/** Service s: TCP 80, or (every third) UDP 53 */
const isUdp = (s: number) => s % 3 === 2;

/** the Services, written once */
function services(n: number): object[] {
  const items: object[] = [node('node-0', undefined, ['10.255.0.1'])];
  for (let s = 0; s < n; s++) items.push(service('soak', `s${s}`, { clusterIP: vip(s), ports: [isUdp(s) ? { name: 'dns', port: 53, protocol: 'UDP' } : { name: 'http', port: 80 }] }));
  return items;
}

/** every Service's endpoints at generation g: all new addresses (a rollout) */
function slices(n: number, g: number): object[] {
  return Array.from({ length: n }, (_, s) => {
    const eps = Array.from({ length: ENDPOINTS }, (_, e) => ({ ip: `10.${1 + (g % 200)}.${s >> 6}.${((s & 63) << 2) + e + 1}`, node: e === 0 ? 'node-0' : `node-${e}` }));
    return slice('soak', `s${s}-1`, `s${s}`, eps, [isUdp(s) ? { name: 'dns', port: 5353, protocol: 'UDP' } : { name: 'http', port: 8080 }]);
  });
}

const list = (items: object[]) => JSON.stringify({ apiVersion: 'v1', kind: 'List', items });

// --- kpng's /metrics (Prometheus text), summed over labels

interface Scrape {
  /** name -> sum over its series */
  readonly sums: Map<string, number>;
  /** histogram name -> le -> cumulative count, summed over the other labels */
  readonly buckets: Map<string, Map<number, number>>;
}

function parseMetrics(text: string): Scrape {
  const sums = new Map<string, number>();
  const buckets = new Map<string, Map<number, number>>();
  for (const line of text.split('\n')) {
    const m = /^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const v = Number(m[3]);
    sums.set(m[1], (sums.get(m[1]) ?? 0) + v);
    const le = /le="([^"]+)"/.exec(m[2] ?? '');
    if (m[1].endsWith('_bucket') && le) {
      const h = m[1].slice(0, -'_bucket'.length);
      const b = buckets.get(h) ?? new Map<number, number>();
      buckets.set(h, b);
      const bound = le[1] === '+Inf' ? Infinity : Number(le[1]);
      b.set(bound, (b.get(bound) ?? 0) + v);
    }
  }
  return { sums, buckets };
}

/** a quantile of the observations between two scrapes of a histogram, as Prometheus' histogram_quantile interpolates it */
function quantile(q: number, name: string, from: Scrape | undefined, to: Scrape): number | undefined {
  const a = from?.buckets.get(name);
  const b = to.buckets.get(name);
  if (!b) return undefined;
  const les = [...b.keys()].sort((x, y) => x - y);
  const counts = les.map((le) => (b.get(le) ?? 0) - (a?.get(le) ?? 0));
  const total = counts[counts.length - 1];
  if (!total) return undefined;
  const rank = q * total;
  for (let i = 0; i < les.length; i++) {
    if (counts[i] < rank) continue;
    if (les[i] === Infinity) return les[i - 1];
    const lower = i ? les[i - 1] : 0;
    const below = i ? counts[i - 1] : 0;
    return lower + ((les[i] - lower) * (rank - below)) / Math.max(1, counts[i] - below);
  }
  return undefined;
}

// --- the tables, normalized

/**
 * `nft list table` output with what may differ between two equal
 * dataplanes taken out: element order, and the slot numbers of endpoint
 * elements ("VIP . proto . port . SLOT : endpoint"), numbered again per
 * Service in endpoint order (kpng reuses freed slots under churn; a fresh
 * load numbers them from 0).
 */
export function normalizeTable(text: string): string {
  return text.replace(/\t(set|map) (\S+) \{([\s\S]*?)\n\t\}/g, (block: string, _kind: string, name: string) =>
    block.replace(/elements = \{([^}]*)\}/, (_, body: string) => {
      const els = body.split(',').map((e) => e.replace(/\s+/g, ' ').trim()).filter(Boolean);
      if (!name.includes('endpoints')) return `elements = { ${els.sort().join(', ')} }`;
      const groups = new Map<string, string[]>();
      for (const e of els) {
        const m = /^(.*) \. \d+ : (.*)$/.exec(e);
        if (!m) throw new Error(`${name}: an element without a slot: ${e}`);
        groups.set(m[1], [...(groups.get(m[1]) ?? []), m[2]]);
      }
      const out = [...groups].flatMap(([key, targets]) => targets.sort().map((t, i) => `${key} . ${i} : ${t}`));
      return `elements = { ${out.sort().join(', ')} }`;
    }),
  );
}

function tables(ns: string): string {
  return ['ip', 'ip6']
    .map((f) => spawnSync('ip', ['netns', 'exec', ns, 'nft', 'list', 'table', f, 'kpng'], { encoding: 'utf8' }).stdout ?? '')
    .map(normalizeTable)
    .join('\n');
}

// --- the process

function rssMiB(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) / 1024 : 0;
}

const fds = (pid: number) => readdirSync(`/proc/${pid}/fd`).length;

/** GET inside the namespace (kpng serves on its loopback): status and body; never blocks the churn */
function get(ns: string, url: string): Promise<{ code: number; body: string }> {
  const script = `fetch(${JSON.stringify(url)}, { signal: AbortSignal.timeout(5000) }).then(async (r) => process.stdout.write(r.status + '\\n' + (await r.text())), () => process.stdout.write('0\\n'))`;
  return new Promise((resolve) => {
    const p = spawn('ip', ['netns', 'exec', ns, process.execPath, '-e', script], { stdio: ['ignore', 'pipe', 'ignore'] });
    let out = '';
    p.stdout!.on('data', (d) => (out += d));
    p.on('close', () => {
      const cut = out.indexOf('\n');
      resolve({ code: Number(out.slice(0, cut)) || 0, body: out.slice(cut + 1) });
    });
  });
}

interface Sample {
  readonly at: number;
  readonly scrape: Scrape;
  readonly rss: number;
  readonly fds: number;
  readonly healthz: number;
}

export default async function (args: string[]) {
  const minutes = Number(arg(args, 'minutes', '10'));
  const n = Number(arg(args, 'services', '300'));
  const intervalMs = Number(arg(args, 'interval-ms', '200'));
  const sampleS = Number(arg(args, 'sample-s', '5'));
  const syncPeriod = arg(args, 'sync-period', '30s');
  const minSyncPeriod = arg(args, 'min-sync-period', '1s');
  const dir = mkdtempSync(join(tmpdir(), 'kpng-bench-soak-'));
  const spaces = new BenchNamespaces('soak', 'kpng-soak');
  const procs: ChildProcess[] = [];
  try {
    const input = join(dir, 'state');
    mkdirSync(input);
    writeFileSync(join(input, 'services.json'), list(services(n)));
    const writeSlices = (g: number) => {
      writeFileSync(join(dir, 'slices.tmp'), list(slices(n, g)));
      renameSync(join(dir, 'slices.tmp'), join(input, 'slices.json'));
    };
    let gen = 0;
    writeSlices(gen);
    const config = join(dir, 'config.json');
    writeFileSync(config, JSON.stringify({ apiVersion: 'kubeproxy.config.k8s.io/v1alpha1', kind: 'KubeProxyConfiguration', mode: 'nftables', nftables: { syncPeriod, minSyncPeriod } }));
    const backend = ['to-local', '--state-socket', 'none', 'to-nft', '--config', config];
    const ns = spaces.add();
    spawnSync('ip', ['netns', 'exec', ns, 'ip', 'link', 'set', 'lo', 'up']);
    const p = spawn('ip', ['netns', 'exec', ns, process.execPath, KPNG, 'file', '--input', input, '--debounce', '20', '--node-name', 'node-0', ...backend, '--metrics-bind-address', METRICS, '--healthz-bind-address', HEALTHZ], { stdio: ['ignore', 'ignore', 'pipe'] });
    procs.push(p);
    let stderr = '';
    p.stderr!.on('data', (d) => (stderr = (stderr + d).slice(-20_000)));
    const exited = new Promise<never>((_, reject) => p.on('exit', (code) => reject(new Error(`kpng exited (${code}) during the soak:\n${stderr}`))));
    // ip netns exec execs kpng: the same pid
    const pid = p.pid!;
    const scrape = async () => parseMetrics((await get(ns, `http://${METRICS}/metrics`)).body);
    const syncs = (s: Scrape) => s.sums.get('kubeproxy_sync_proxy_rules_duration_seconds_count') ?? 0;
    const t0 = Date.now();
    while (!syncs(await scrape())) {
      if (Date.now() - t0 > 120_000) throw new Error(`kpng did not sync within 2 minutes:\n${stderr}`);
      await Promise.race([exited, new Promise((r) => setTimeout(r, 200))]);
    }
    console.error(`kpng programmed ${n} Services in ${Date.now() - t0} ms; churning for ${minutes} min`);

    const samples: Sample[] = [];
    const sampling: Promise<unknown>[] = [];
    const sample = () => {
      const at = Date.now();
      const [rss, files] = [rssMiB(pid), fds(pid)];
      const taken = Promise.all([scrape(), get(ns, `http://${HEALTHZ}/healthz`)]).then(([m, h]) => samples.push({ at, scrape: m, rss, fds: files, healthz: h.code }));
      sampling.push(taken);
      return taken;
    };
    await sample();
    const start = Date.now();
    const end = start + minutes * 60_000;
    let nextSample = start + sampleS * 1000;
    for (let next = start; Date.now() < end; ) {
      writeSlices(++gen);
      next += intervalMs;
      if (Date.now() >= nextSample) {
        void sample();
        nextSample += sampleS * 1000;
      }
      await Promise.race([exited, new Promise((r) => setTimeout(r, Math.max(0, next - Date.now())))]);
    }
    const stoppedAt = Date.now();
    await sample();
    await Promise.all(sampling);
    samples.sort((a, b) => a.at - b.at);

    // the final state, loaded fresh by --once in a namespace of its own
    const fresh = spaces.add();
    const once = spawnSync('ip', ['netns', 'exec', fresh, process.execPath, KPNG, 'file', '--input', input, '--node-name', 'node-0', ...backend, '--once', '--no-health-checks'], { encoding: 'utf8', timeout: 120_000 });
    if (once.status !== 0) throw new Error(`kpng --once failed:\n${once.stderr}`);
    const want = tables(fresh);
    let have = tables(ns);
    while (have !== want && Date.now() - stoppedAt < 60_000) {
      await Promise.race([exited, new Promise((r) => setTimeout(r, 250))]);
      have = tables(ns);
    }
    const convergedS = (Date.now() - stoppedAt) / 1000;
    await sample();

    report({ n, minutes, intervalMs, syncPeriod, minSyncPeriod, gen, samples: samples.slice(0, -1) });
    const total = samples[samples.length - 1].scrape.sums;
    console.log(`repairs (kpng_dataplane_repairs_total, expected 0): ${total.get('kpng_dataplane_repairs_total') ?? 0}`);
    console.log(`final table equals a fresh --once load of the final state: ${have === want ? `yes, ${convergedS.toFixed(1)} s after the churn stopped` : 'NO (after 60 s)'}`);
    if (have !== want) printDiff(have, want);
  } finally {
    for (const p of procs) p.kill('SIGKILL');
    spaces.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

/** one row per minute (and the whole run): syncs, programming p50/p99, RSS and fds at most, /healthz answers other than 200 */
function report(r: { n: number; minutes: number; intervalMs: number; syncPeriod: string; minSyncPeriod: string; gen: number; samples: Sample[] }) {
  const s = r.samples;
  const udp = Array.from({ length: r.n }, (_, i) => i).filter(isUdp).length;
  console.log(`soak: ${r.n} Services (${udp} UDP) x ${ENDPOINTS} endpoints, every endpoint rewritten every ${r.intervalMs} ms (${r.gen} rewrites) for ${r.minutes} min; kpng file ... to-local to-nft, syncPeriod ${r.syncPeriod}, minSyncPeriod ${r.minSyncPeriod}`);
  const fmt = (x: number | undefined) => (x === undefined ? '-' : x.toFixed(2));
  const row = (label: string, from: Sample, to: Sample, within: Sample[]) => {
    const syncs = (to.scrape.sums.get('kubeproxy_sync_proxy_rules_duration_seconds_count') ?? 0) - (from.scrape.sums.get('kubeproxy_sync_proxy_rules_duration_seconds_count') ?? 0);
    const perMin = (syncs * 60_000) / Math.max(1, to.at - from.at);
    const h = 'kubeproxy_network_programming_duration_seconds';
    const p50 = quantile(0.5, h, from.scrape, to.scrape);
    const p99 = quantile(0.99, h, from.scrape, to.scrape);
    const rss = Math.max(...within.map((x) => x.rss));
    const fdMax = Math.max(...within.map((x) => x.fds));
    const bad = within.filter((x) => x.healthz !== 200).length;
    console.log(`  ${label.padEnd(8)} ${perMin.toFixed(1).padStart(10)} ${`${fmt(p50)} / ${fmt(p99)}`.padStart(22)} ${rss.toFixed(0).padStart(12)} ${String(fdMax).padStart(8)} ${`${bad}/${within.length}`.padStart(16)}`);
  };
  console.log(`  ${'minute'.padEnd(8)} ${'syncs/min'.padStart(10)} ${'programming p50 / p99 s'.padStart(22)} ${'RSS MiB max'.padStart(12)} ${'fds max'.padStart(8)} ${'healthz not 200'.padStart(16)}`);
  // whole minutes (the few seconds after the last are in "all")
  for (let m = 0; (m + 1) * 60_000 <= s[s.length - 1].at - s[0].at + 5_000; m++) {
    const lo = s[0].at + m * 60_000;
    const within = s.filter((x) => x.at >= lo && x.at <= lo + 60_000);
    if (within.length < 2) continue;
    const from = [...s].reverse().find((x) => x.at <= lo) ?? s[0];
    row(String(m + 1), from, within[within.length - 1], within);
  }
  row('all', s[0], s[s.length - 1], s);
}

function printDiff(have: string, want: string) {
  const a = have.split('\n');
  const b = new Set(want.split('\n'));
  const onlyHave = a.filter((l) => !b.has(l)).slice(0, 10);
  const onlyWant = want.split('\n').filter((l) => !a.includes(l)).slice(0, 10);
  console.log(`  only in kpng's table:\n    ${onlyHave.join('\n    ')}\n  only in the fresh load:\n    ${onlyWant.join('\n    ')}`);
}
