// The node agent as a user runs it: the real `kpng` process, from its start
// to a programmed node, on a synthetic cluster (Services x 5 endpoints over
// 100 nodes, node-0 programmed with to-nft), each run in a network
// namespace of its own (split: the brain's /metrics on 10259 beside the agent's):
//   npm run bench -- node-agent [--sizes 1000,10000,30000] [--changes 20]
//                               [--ways file,kube,split,to-file] [--tsx] [--debounce 100]
//                               [--timeout 600] [--node-flags "--trace-gc ..."] [--verbose]
//                               [--against REV [--pairs 5]] [--api-page-ms 0]
// Ways: file = `kpng file --input DIR to-local to-nft`; kube = `kpng kube
// --kubeconfig K to-local to-nft` against the test API server (TLS, list +
// watch, in the measuring process); split = the brain `kpng file --input
// DIR to-api --listen unix://S` and the agent `kpng local --api unix://S
// to-nft`; to-file = `kpng file --input DIR --no-watch to-file --node-name
// node-0 --once` (YAML, then JSON), one node's state.
// Reported per way and size: start -> node programmed (/healthz reports a
// first successful sync, at the time it gives as lastUpdated, and the
// kernel's kpng table holds every element),
// RSS steady (5 s later), after the changes (about 30 s later: what V8's
// memory reducer left) and peak (VmHWM), heap after a full GC (through the
// inspector, opened with SIGUSR1 once everything else is measured), CPU
// seconds (utime + stime) to programmed and in all; then one endpoint change
// (a slice file rewritten, or the slice replaced on the API server) -> the
// kernel has the new endpoint (nftables' change events, over netlink),
// p50/p99.
// kpng runs compiled (tsc into .bench-dist/, as dist/ is built: its
// ../package.json is kpng's), at its default log level; --tsx runs
// bin/kpng.js from the sources instead. --node-flags: node's flags for the
// kpng processes; --verbose prints kpng's log lines (at debug level), when
// the kube source's lists ended (the agent's CPU and page faults then), the
// first nft sync's time, the page faults to programmed, each change's time
// (from programmed; and how much of it was the write itself: the test API
// server's put, or the file's rename) and the lines of kpng's output V8's
// --trace-gc (or --trace-deopt, --trace-opt) writes, as they came.
// --against REV: the same runs with kpng as of git revision REV too (its
// src/ compiled apart), the two trees alternately, run by run, --pairs
// times; then each tree's median and range side by side. On a machine
// whose speed moves within minutes, three pairs of wall time have pointed
// the wrong way where five did not (docs/design/parser-thread.md, the
// threshold tried): the agent's CPU seconds are printed beside the start.
// --api-page-ms N: the test API server answers each page of the Services'
// and EndpointSlices' lists N ms late, as an API server on another machine
// takes its time without taking this one's CPU (the kube way's lists are
// otherwise bound by the two CPUs the agent shares with the server).
import { spawn, spawnSync, execFileSync, type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync, statSync, symlinkSync } from 'node:fs';
import { loadavg, tmpdir, totalmem, freemem, cpus } from 'node:os';
import { join } from 'node:path';
import { BenchNamespaces, runAsChild, vip } from './_scale.js';
import { ROOT, arg, compileKpng, cpuPressure, flag, median, now, num, nums, pct, plotDir, procStat, sleep, until, writePlot, type Point } from './_harness.js';
import { service, slice, node } from '../test/helpers/k8s.js';
import { TestApiServer, certKubeconfig, type KubeObject } from '../test/helpers/apiserver.js';
import { saveByRename } from '../test/file/util.js';
import { DEFAULT_REFLECTOR_OPTIONS } from '../src/sources/kube/reflector.js';
import { NETLINK_NETFILTER, NetlinkSocket, NetlinkWriter, NLM_F_DUMP, NLM_F_REQUEST } from '../src/kernel/netlink.js';

const NODES = 100;
const NODE = 'node-0';
/** between two changes: longer than to-nft's default minSyncPeriod (1 s), so no change waits for it */
const CHANGE_GAP_MS = 1_100;
/** settle after programmed before RSS "steady" is read */
const SETTLE_MS = 5_000;
/** how often /healthz is asked whether the first sync happened */
const HEALTHZ_POLL_MS = 250;

type Way = 'file' | 'kube' | 'split';
const WAYS: readonly Way[] = ['file', 'kube', 'split'];

// --- the synthetic cluster

/** pod IP of endpoint e of Service s (10.0.0.0 up: 500k endpoints stay under 10.8) */
const podIP = (s: number, e: number) => {
  const i = s * 5 + e + 1;
  return `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`;
};
/** the new IP of the i-th change (10.200.0.0 up: never a pod IP of the cluster) */
const changedIP = (i: number) => `10.${200 + ((i >> 16) & 31)}.${(i >> 8) & 255}.${i & 255}`;
/** the Service the i-th change touches, of the `targets` ones spread over the cluster */
const target = (services: number, targets: number, i: number) => Math.floor(((i % targets) * services) / targets);

const svcObj = (s: number) => service('bench', `svc-${s}`, { clusterIP: vip(s), ports: [{ name: 'http', port: 80, targetPort: 8080 }] }) as KubeObject;
/** Service s's slice; after change `gen` (1-based) its endpoint 0 is changedIP(gen - 1) */
const sliceObj = (s: number, gen = 0) =>
  slice(
    'bench',
    `svc-${s}-1`,
    `svc-${s}`,
    Array.from({ length: 5 }, (_, e) => ({ ip: e === 0 && gen ? changedIP(gen - 1) : podIP(s, e), node: `node-${(s * 5 + e) % NODES}`, pod: `p-${s}-${e}-${e === 0 ? gen : 0}` })),
  ) as KubeObject;
const nodeObjs = () => Array.from({ length: NODES }, (_, n) => node(`node-${n}`, `z${n % 3}`, [`192.168.${n >> 8}.${(n & 255) + 2}`]) as KubeObject);
const list = (items: object[]) => JSON.stringify({ apiVersion: 'v1', kind: 'List', metadata: { resourceVersion: '' }, items });

/**
 * The cluster as files, as `kubectl get -o json` prints lists: nodes, then
 * Services and slices in files of 1000; the slices changes touch are each in
 * a file of their own (a change rewrites one small file).
 */
export function writeCluster(dir: string, services: number, targets: number): void {
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, 'nodes.json'), list(nodeObjs()));
  const changing = new Set(Array.from({ length: targets }, (_, i) => target(services, targets, i)));
  for (let from = 0; from < services; from += 1000) {
    const to = Math.min(services, from + 1000);
    const ss: number[] = [];
    for (let s = from; s < to; s++) ss.push(s);
    writeFileSync(join(dir, `services-${from}.json`), list(ss.map(svcObj)));
    writeFileSync(join(dir, `slices-${from}.json`), list(ss.filter((s) => !changing.has(s)).map((s) => sliceObj(s))));
  }
  for (const s of changing) writeFileSync(join(dir, `slice-${s}.json`), JSON.stringify(sliceObj(s)));
}

/** rewrites one slice file as editors and config tools do (saveByRename) */
export function rewriteSlice(dir: string, s: number, gen: number): void {
  saveByRename(join(dir, `slice-${s}.json`), JSON.stringify(sliceObj(s, gen)));
}

// --- processes

interface Stages {
  listsMs?: number;
  listsCpu?: number;
  /** this process's CPU seconds (the test API server's) from the agent's start to the lists' end */
  serverCpu?: number;
  listsFaults?: number;
  programmedFaults?: number;
  firstSyncMs?: number;
}

/** A kpng process of the run: its output's tail for errors, and a bounded stop. */
class Kpng {
  readonly p: ChildProcess;
  private tail = '';
  private readonly exited: Promise<void>;

  constructor(
    readonly name: string,
    argv: string[],
    onGcLine?: (line: string) => void,
  ) {
    this.p = spawn(argv[0], argv.slice(1), { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
    // a chunk may end inside a line: its start waits for the rest (per stream)
    const keep = (partial: { line: string }) => (d: Buffer) => {
      this.tail = (this.tail + d).slice(-4000);
      if (!onGcLine) return;
      const lines = (partial.line + d).split('\n');
      partial.line = lines.pop()!;
      for (const l of lines) if (/^\[\d+:0x[0-9a-f]+\]|^\[(bailout|deoptimiz|marking|compiling|optimiz)|^\d\d:\d\d:\d\d\.\d{3} [A-Z]+ /.test(l)) onGcLine(l);
    };
    this.p.stdout!.on('data', keep({ line: '' }));
    this.p.stderr!.on('data', keep({ line: '' }));
    this.exited = new Promise((r) => this.p.on('exit', () => r()));
  }

  get pid(): number {
    return this.p.pid!;
  }

  /** throws, with its last output, when it has exited */
  check(): void {
    if (this.p.exitCode !== null || this.p.signalCode !== null) throw new Error(`${this.name} exited (${this.p.exitCode ?? this.p.signalCode}):\n${this.tail}`);
  }

  get output(): string {
    return this.tail;
  }

  async stop(): Promise<void> {
    if (this.p.exitCode !== null || this.p.signalCode !== null) return;
    this.p.kill('SIGTERM');
    const t = setTimeout(() => this.p.kill('SIGKILL'), 5000);
    await this.exited;
    clearTimeout(t);
  }
}

/** /healthz's lastUpdated: set once a sync succeeded ('' before) */
async function lastUpdated(port: number): Promise<string> {
  try {
    const r = await fetch(`http://127.0.0.1:${port}/healthz`, { signal: AbortSignal.timeout(2000) });
    return String(((await r.json()) as { lastUpdated?: string }).lastUpdated ?? '');
  } catch {
    return '';
  }
}

// The kernel read over netlink (kpng's own netlink code): the nft tool is
// slow on this table (one `nft get element` at 10k did not return in 2
// minutes here) and nft monitor missed the changes at 10k.
const NFNLGRP_NFTABLES = 7;
const NFT_MSG_NEWSETELEM = (10 << 8) | 12;
const NFT_MSG_GETSETELEM = (10 << 8) | 13;
const NFPROTO_IPV4 = 2;

/** the payload attributes of one list attribute, counted (every entry has the same type) */
function countAttrs(b: Buffer | undefined): number {
  let n = 0;
  for (let a = 0; b && a + 4 <= b.length; n++) {
    const len = b.readUInt16LE(a);
    if (len < 4) break;
    a += (len + 3) & ~3;
  }
  return n;
}

/** Elements in kpng's table (ip kpng) per set or map, dumped from the kernel. */
function tableElements(sets: string[]): Map<string, number> {
  const nl = new NetlinkSocket(NETLINK_NETFILTER, undefined, 32 << 20);
  const counts = new Map<string, number>();
  try {
    for (const [i, set] of sets.entries()) {
      nl.send(new NetlinkWriter().begin(NFT_MSG_GETSETELEM, NLM_F_REQUEST | NLM_F_DUMP, i + 1, [NFPROTO_IPV4, 0, 0]).string(1, 'kpng').string(2, set).end().take());
      let n = 0;
      let done = false;
      nl.await(
        () => done,
        (m) => {
          if (m.seq !== i + 1) return;
          if (m.isDone || m.isError) done = true;
          else if (m.type === NFT_MSG_NEWSETELEM) n += countAttrs(m.bytes(m.attrs().get(3)));
        },
        120_000,
      );
      counts.set(set, n);
    }
  } catch {
    // no table yet
  } finally {
    nl.close();
  }
  return counts;
}

/** Set element additions as they are committed: has(ip) once one carried ip. */
class ElementWatch {
  private readonly nl = new NetlinkSocket(NETLINK_NETFILTER, undefined, 32 << 20);
  private readonly seen = new Set<string>();

  constructor() {
    this.nl.membership(NFNLGRP_NFTABLES, true);
  }

  /** whether an element with ip (IPv4) was added since the last call that found it */
  has(ip: string): boolean {
    const want = Buffer.from(ip.split('.').map(Number));
    this.nl.drain((m) => {
      if (m.type === NFT_MSG_NEWSETELEM && m.bytes(m.attrs().get(3))!.indexOf(want) >= 0) this.seen.add(ip);
    });
    return this.seen.delete(ip);
  }

  close(): void {
    this.nl.close();
  }
}

/** what the table must hold for `services` Services: each one's ClusterIP, and its 5 endpoints */
function expectedElements(services: number): Record<string, number> {
  return { 'service-ips': services, 'cluster-endpoints-tcp': services * 5 };
}

/**
 * Heap after a full GC of a running node process: SIGUSR1 opens its
 * inspector on 127.0.0.1:9229 (of this namespace); a small client asks for
 * a GC, then process.memoryUsage(). Node 20 has a WebSocket client behind a
 * flag only, hence the separate process. Run last: the inspector stays open.
 */
function heapAfterGC(pid: number): number | undefined {
  process.kill(pid, 'SIGUSR1');
  const r = spawnSync(process.execPath, ['--experimental-websocket', '--no-warnings', '-e', HEAP_PROBE], { encoding: 'utf8', timeout: 60_000 });
  const m = /^HEAP (\d+)/m.exec(r.stdout);
  return m ? Number(m[1]) / 2 ** 20 : undefined;
}

const HEAP_PROBE = `
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
(async () => {
  let url;
  for (let i = 0; i < 100 && !url; i++) {
    try { url = (await (await fetch('http://127.0.0.1:9229/json/list')).json())[0].webSocketDebuggerUrl; } catch { await sleep(100); }
  }
  const ws = new WebSocket(url);
  const pending = new Map();
  let id = 0;
  const call = (method, params = {}) => new Promise((resolve) => { pending.set(++id, resolve); ws.send(JSON.stringify({ id, method, params })); });
  ws.onmessage = (e) => { const m = JSON.parse(e.data); if (pending.has(m.id)) { pending.get(m.id)(m.result); pending.delete(m.id); } };
  await new Promise((r) => (ws.onopen = r));
  await call('HeapProfiler.collectGarbage');
  await call('HeapProfiler.collectGarbage');
  const r = await call('Runtime.evaluate', { expression: 'process.memoryUsage().heapUsed', returnByValue: true });
  console.log('HEAP ' + r.result.value);
  ws.close();
  process.exit(0);
})();
`;

// --- one run, in its namespace (the benchmark's child)

interface RunParams {
  way: Way;
  services: number;
  changes: number;
  targets: number;
  dir: string;
  run: string;
  kpng: string[];
  debounce: number;
  timeoutMs: number;
  verbose: boolean;
  /** ms the test API server waits before each list page of Services and EndpointSlices */
  apiPageMs: number;
}

interface ProcResult {
  /** MiB */
  rssSteady: number;
  /** after the changes (half a minute later): what V8's memory reducer left */
  rssAfter: number;
  rssPeak: number;
  heap?: number;
  /** CPU seconds to programmed, and over the whole run */
  cpuProgrammed: number;
  cpuTotal: number;
}

interface RunResult {
  way: Way;
  services: number;
  programmedMs: number;
  elements: Record<string, number>;
  agent: ProcResult;
  brain?: ProcResult;
  changeMs: number[];
  /** with --verbose: the changes and V8's trace lines, ms from the start */
  events?: string[];
  stages?: Stages;
}

async function runOne(p: RunParams): Promise<RunResult> {
  execFileSync('ip', ['link', 'set', 'lo', 'up']);
  mkdirSync(p.run, { recursive: true });
  const sock = (n: string) => `unix://${join(p.run, n)}`;
  let server: TestApiServer | undefined;
  const procs: Kpng[] = [];
  let watch: ElementWatch | undefined;
  try {
    let kubeconfig = '';
    if (p.way === 'kube') {
      // history for the watches after the list only: the changes
      server = await new TestApiServer({ historyLimit: 10_000 }).start();
      for (const n of nodeObjs()) server.put(n);
      for (let s = 0; s < p.services; s++) {
        server.put(svcObj(s));
        server.put(sliceObj(s));
      }
      kubeconfig = certKubeconfig(join(p.run, 'kubeconfig'), server.url);
      // (every page at kpng's page size; a few more for a list started again)
      const pages = Math.ceil(p.services / DEFAULT_REFLECTOR_OPTIONS.pageSize) + 4;
      if (p.apiPageMs > 0) for (const resource of ['services', 'endpointslices'] as const) server.failNext({ resource, watch: false }, { delayMs: p.apiPageMs }, pages);
    }
    const agentTail = ['to-nft', '--node-name', NODE];
    const t0 = now();
    const t0Wall = Date.now();
    const cpu0 = process.cpuUsage();
    const events: string[] = [];
    /** with --verbose: when the kube source's lists ended (the agent's CPU and page faults then), the first nft sync's ms, page faults to programmed */
    const stages: Stages = {};
    const gcLine = p.verbose
      ? (l: string) => {
          const at = now() - t0;
          events.push(`${at.toFixed(0)} ${l}`);
          if (l.includes('kube source: initial state complete')) {
            const s = procStat(procs[0].pid);
            const u = process.cpuUsage(cpu0);
            Object.assign(stages, { listsMs: at, listsCpu: s.cpu, listsFaults: s.faults, serverCpu: (u.user + u.system) / 1e6 });
          }
          const sync = / full=true ms=(\d+)/.exec(l);
          if (sync && stages.firstSyncMs === undefined) stages.firstSyncMs = Number(sync[1]);
        }
      : undefined;
    if (p.way === 'file') {
      procs.push(new Kpng('kpng file ... to-local to-nft', [...p.kpng, 'file', '--input', p.dir, '--debounce', String(p.debounce), 'to-local', '--state-socket', sock('node.sock'), ...agentTail], gcLine));
    } else if (p.way === 'kube') {
      procs.push(new Kpng('kpng kube ... to-local to-nft', [...p.kpng, 'kube', '--kubeconfig', kubeconfig, 'to-local', '--state-socket', sock('node.sock'), ...agentTail], gcLine));
    } else {
      // the brain's /metrics on a port of its own: the agent has 10249
      procs.push(new Kpng('kpng local ... to-nft', [...p.kpng, 'local', '--api', sock('brain.sock'), '--state-socket', sock('node.sock'), ...agentTail], gcLine));
      procs.push(
        new Kpng('kpng file ... to-api', [...p.kpng, 'file', '--input', p.dir, '--debounce', String(p.debounce), 'to-api', '--listen', sock('brain.sock'), '--state-socket', sock('brain-state.sock'), '--metrics-bind-address', '127.0.0.1:10259']),
      );
    }
    const [agent, brain] = procs;
    const alive = () => procs.forEach((k) => k.check());
    const tail = () => procs.map((k) => `${k.name}:\n${k.output}`).join('\n');
    // the time of the first successful sync is the one /healthz reports
    // (lastUpdated): polled every 250 ms, so that the benchmark's requests
    // (kubelet probes every 10 s) are not part of the start it measures
    let updated = '';
    await until(() => `/healthz reported no sync\n${tail()}`, async () => (alive(), (updated = await lastUpdated(10256)) !== ''), { timeoutMs: p.timeoutMs, everyMs: HEALTHZ_POLL_MS });
    const healthyMs = Math.min(now() - t0, Date.parse(updated) - t0Wall);
    const want = expectedElements(p.services);
    let elements = new Map<string, number>();
    let listings = 0;
    await until(
      () => `the kernel's table holds ${JSON.stringify(Object.fromEntries(elements))}, expected ${JSON.stringify(want)}`,
      () => (listings++, (elements = tableElements(Object.keys(want))), Object.entries(want).every(([k, n]) => elements.get(k) === n)),
      { timeoutMs: p.timeoutMs, everyMs: 500 },
    );
    // the listing came after /healthz: programmed when /healthz said so, unless the first listing fell short
    const programmedMs = listings === 1 ? healthyMs : now() - t0;
    const cpuAt = procs.map((k) => procStat(k.pid).cpu);
    stages.programmedFaults = procStat(agent.pid).faults;
    await sleep(SETTLE_MS);
    alive();
    const steady = procs.map((k) => procStat(k.pid).rss);

    // one endpoint change at a time -> the kernel has its new IP
    watch = new ElementWatch();
    const changeMs: number[] = [];
    for (let i = 0; i < p.changes; i++) {
      const s = target(p.services, p.targets, i);
      const ip = changedIP(i);
      const faults = p.verbose ? procStat(agent.pid).faults : 0;
      const t = now();
      if (p.way === 'kube') server!.put(sliceObj(s, i + 1));
      else rewriteSlice(p.dir, s, i + 1);
      const written = now();
      await until(() => `change ${i} (${ip} for svc-${s}) did not reach the kernel\n${tail()}`, () => (alive(), watch!.has(ip)), { timeoutMs: 30_000, everyMs: 1 });
      changeMs.push(now() - t);
      if (p.verbose) events.push(`${(t - t0).toFixed(0)} change ${i}: ${(now() - t).toFixed(1)} ms (the write ${(written - t).toFixed(1)} ms of it), ${procStat(agent.pid).faults - faults} page faults`);
      await sleep(CHANGE_GAP_MS);
    }
    const end = procs.map((k) => procStat(k.pid));
    // heap last: the inspector stays open; the brain's after the agent has gone (one port, 9229)
    const agentHeap = heapAfterGC(agent.pid);
    await agent.stop();
    const brainHeap = brain ? heapAfterGC(brain.pid) : undefined;
    const result = (i: number, heap: number | undefined): ProcResult => ({ rssSteady: steady[i], rssAfter: end[i].rss, rssPeak: end[i].hwm, heap, cpuProgrammed: cpuAt[i], cpuTotal: end[i].cpu });
    return {
      way: p.way,
      services: p.services,
      programmedMs,
      elements: Object.fromEntries(elements),
      agent: result(0, agentHeap),
      brain: brain ? result(1, brainHeap) : undefined,
      changeMs,
      events: p.verbose ? events : undefined,
      stages: p.verbose ? stages : undefined,
    };
  } finally {
    watch?.close();
    for (const k of procs) await k.stop();
    await server?.close();
  }
}

// --- to-file of one node's state

interface ToFileResult {
  format: string;
  ms: number;
  /** MiB */
  peak: number;
  cpu: number;
  bytes: number;
  error?: string;
}

/** wall time, peak RSS (the kernel's ru_maxrss of the waited-for child) and CPU of a command */
const RUSAGE = `
import json, resource, subprocess, sys, time
t = time.monotonic()
p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
ms = (time.monotonic() - t) * 1000
u = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"code": p.returncode, "ms": ms, "maxrss_kib": u.ru_maxrss, "cpu": u.ru_utime + u.ru_stime, "stderr": p.stderr.decode()[-2000:]}))
`;

function toFile(kpng: string[], dir: string, out: string, format: string, timeoutMs: number): ToFileResult {
  rmSync(out, { force: true });
  const r = spawnSync('python3', ['-c', RUSAGE, ...kpng, 'file', '--input', dir, '--no-watch', 'to-file', '--node-name', NODE, '--once', '--format', format, '--output', out], {
    cwd: ROOT,
    encoding: 'utf8',
    timeout: timeoutMs,
  });
  if (r.status !== 0 || !r.stdout) return { format, ms: NaN, peak: NaN, cpu: NaN, bytes: 0, error: r.error?.message ?? r.stderr.slice(-500) };
  const x = JSON.parse(r.stdout) as { code: number; ms: number; maxrss_kib: number; cpu: number; stderr: string };
  let bytes = 0;
  try {
    bytes = statSync(out).size;
  } catch {
    /* reported as an error below */
  }
  return { format, ms: x.ms, peak: x.maxrss_kib / 1024, cpu: x.cpu, bytes, error: x.code !== 0 || !bytes ? `exit ${x.code}: ${x.stderr}` : undefined };
}

// --- the benchmark

/** Compiles kpng once for this run into root's .bench-dist/ (as dist/ is built; others may use dist/). */
function compile(root = ROOT): string[] {
  try {
    return compileKpng(join(root, '.bench-dist'), root);
  } catch (e) {
    throw new Error(`node-agent: ${(e as Error).message} (use --tsx to run the sources)`);
  }
}

/** kpng as of a git revision, compiled in dir (its src/ and build files from git, this checkout's node_modules) */
function compileRevision(rev: string, dir: string): string[] {
  const tar = execFileSync('git', ['-C', ROOT, 'archive', '--format=tar', rev, 'src', 'package.json', 'tsconfig.json', 'tsconfig.build.json'], { maxBuffer: 1 << 30 });
  mkdirSync(dir, { recursive: true });
  execFileSync('tar', ['-x', '-C', dir], { input: tar });
  symlinkSync(join(ROOT, 'node_modules'), join(dir, 'node_modules'));
  return compile(dir);
}

const f0 = (x: number | undefined) => (x === undefined || Number.isNaN(x) ? '-' : x.toFixed(0));
const f1 = (x: number | undefined) => (x === undefined || Number.isNaN(x) ? '-' : x.toFixed(1));
const ratio = (a: number | undefined, b: number | undefined) => (a === undefined || b === undefined || !b || Number.isNaN(a) || Number.isNaN(b) ? '-' : `${(a / b).toFixed(2)}x`);

/** why a size cannot run here (memory), or undefined: about 8 KiB per Service per process measured, times the processes of a size at once */
function tooBig(services: number): string | undefined {
  const needMiB = (services * 3 * 12 * 1024) / 2 ** 20 + 2048; // kube: the API server's objects, kpng; split: brain + agent
  const haveMiB = freemem() / 2 ** 20;
  return needMiB > haveMiB ? `needs about ${needMiB.toFixed(0)} MiB free, the machine has ${haveMiB.toFixed(0)} MiB` : undefined;
}

export default async function main(args: string[]) {
  if (await runAsChild(runOne)) return;
  const sizes = nums(args, 'sizes', '1000,10000,30000');
  const changes = num(args, 'changes', 20);
  const ways = arg(args, 'ways', 'file,kube,split,to-file').split(',');
  const debounce = num(args, 'debounce', 100);
  const timeoutMs = num(args, 'timeout', 600) * 1000;
  for (const w of ways) if (![...WAYS, 'to-file'].includes(w)) throw new Error(`unknown way ${w} (file, kube, split, to-file)`);
  const nodeFlags = arg(args, 'node-flags', '').split(' ').filter(Boolean);
  const against = arg(args, 'against', '');
  const pairs = against ? Math.max(1, num(args, 'pairs', 5)) : 1;
  const [node, script] = flag(args, 'tsx') ? [process.execPath, join(ROOT, 'bin/kpng.js')] : compile();
  const verbose = flag(args, 'verbose');
  const apiPageMs = num(args, 'api-page-ms', 0);
  // --verbose: kpng's debug lines too (the kube source's list, each nft sync's time)
  const command = (nodeScript: string) => [node, ...nodeFlags, nodeScript, ...(verbose ? ['--log-level', 'debug'] : [])];
  const kpng = command(script);
  const work = mkdtempSync(join(tmpdir(), 'kpng-bench-agent-'));
  /** the trees run: this one, and REV's */
  const trees: { name: string; kpng: string[] }[] = [{ name: 'this tree', kpng }];
  if (against) {
    try {
      trees.push({ name: against, kpng: command(compileRevision(against, join(work, 'against'))[1]) });
    } catch (e) {
      rmSync(work, { recursive: true, force: true });
      throw e;
    }
  }
  const load0 = loadavg();
  console.log(
    `node-agent: kpng is ${kpng.map((x) => x.replace(ROOT, '')).join(' ')}; ${cpus().length} CPUs, ${(totalmem() / 2 ** 30).toFixed(1)} GiB; load average ${load0.map((x) => x.toFixed(2)).join(' ')}; ` +
      `node ${process.version}; ${execFileSync('nft', ['--version'], { encoding: 'utf8' }).trim()}`,
  );
  console.log(`cluster: Services x 5 endpoints over ${NODES} nodes, node ${NODE} programmed with to-nft; file source --debounce ${debounce}; ${changes} endpoint changes per run, ${CHANGE_GAP_MS} ms apart`);
  if (against) console.log(`against: kpng as of ${against}, ${pairs} pairs, the two trees alternately`);
  if (apiPageMs > 0) console.log(`the test API server answers each list page of Services and EndpointSlices ${apiPageMs} ms late`);
  const spaces = new BenchNamespaces('node-agent', 'kpng-agent');
  const results: RunResult[] = [];
  const failed: { way: string; services: number; why: string }[] = [];
  const toFiles = new Map<number, ToFileResult[]>();
  const ab: AbResult[] = [];
  try {
    for (let pair = 0; pair < pairs; pair++) for (const services of sizes) {
      const skip = tooBig(services);
      if (skip) {
        console.log(`${services} Services: skipped, ${skip}`);
        for (const way of ways) failed.push({ way, services, why: `skipped: ${skip}` });
        continue;
      }
      const targets = Math.max(1, Math.min(changes, services));
      const dir = join(work, `cluster-${services}`);
      writeCluster(dir, services, targets);
      for (const way of ways) for (const tree of trees) {
        const kpng = tree.kpng;
        const who = against ? ` (${tree.name}, pair ${pair + 1})` : '';
        if (way === 'to-file') {
          const out = join(work, `to-file-${services}`);
          const r = ['yaml', 'json'].map((format) => toFile(kpng, dir, out, format, timeoutMs));
          if (tree === trees[0] && !toFiles.has(services)) toFiles.set(services, r);
          for (const x of r) {
            if (against && !x.error) ab.push({ tree: tree.name, way: `to-file ${x.format}`, services, ms: x.ms, cpu: x.cpu, rss: NaN, peak: x.peak });
            console.error(`  ${services} to-file ${x.format}${who}: ${x.error ? `failed: ${x.error}` : `${f0(x.ms)} ms, peak ${f0(x.peak)} MiB`}`);
          }
          continue;
        }
        // each run starts from the cluster as written (changes rewrote some slices);
        // the file source reads a file changed under 2 s before again at its
        // next reload (it may have been read half-written): the first change
        // would wait for every file read again
        writeCluster(dir, services, targets);
        await new Promise((r) => setTimeout(r, 2_100));
        const ns = spaces.add();
        const t = Date.now();
        try {
          const r = await spaces.child<RunResult>(
            ns,
            { way: way as Way, services, changes, targets, dir, run: join(work, `run-${way}-${services}`), kpng, debounce, timeoutMs, verbose, apiPageMs } satisfies RunParams,
            `${way} at ${services}`,
          );
          if (tree === trees[0] && !results.some((x) => x.way === r.way && x.services === r.services)) results.push(r);
          if (against) ab.push({ tree: tree.name, way: r.way, services, ms: r.programmedMs, cpu: r.agent.cpuProgrammed, rss: r.agent.rssSteady, peak: r.agent.rssPeak });
          for (const e of r.events ?? []) console.error(`    ${e}`);
          const st = r.stages;
          const stages = st
            ? `${st.listsMs !== undefined ? `, lists ended at ${f0(st.listsMs)} ms (agent CPU ${f1(st.listsCpu!)} s, the API server's ${f1(st.serverCpu!)} s, ${f0(st.listsFaults! / 1000)}k page faults)` : ''}` +
              `${st.firstSyncMs !== undefined ? `, first nft sync ${f0(st.firstSyncMs)} ms` : ''}, ${f0(st.programmedFaults! / 1000)}k page faults to programmed`
            : '';
          console.error(`  ${services} ${way}${who}: programmed in ${f0(r.programmedMs)} ms${stages}, agent RSS ${f0(r.agent.rssSteady)} / ${f0(r.agent.rssAfter)} / ${f0(r.agent.rssPeak)} MiB (run ${((Date.now() - t) / 1000).toFixed(0)} s)`);
        } catch (e) {
          const why = (e as Error).message.slice(0, 3000);
          failed.push({ way: `${way}${who}`, services, why });
          console.error(`  ${services} ${way}${who}: FAILED: ${why}`);
        } finally {
          spaces.remove(ns);
        }
      }
    }
  } finally {
    spaces.close();
    rmSync(work, { recursive: true, force: true });
  }
  report(sizes, ways, results, toFiles, failed, load0);
  if (against) abReport(trees.map((t) => t.name), ab);
  const plots = plotDir(args);
  if (plots) await plot(plots, changes, results);
}

const LABEL: Record<Way, string> = { file: 'file to-local to-nft', kube: 'kube to-local to-nft', split: 'split: local to-nft' };

/** --plot: the start, the agent's RSS and one change's latency against the number of Services, per way */
async function plot(dir: string, changes: number, results: RunResult[]): Promise<void> {
  const subtitle = `the real kpng process, node-0 programmed with to-nft; Services x 5 endpoints over ${NODES} nodes; ${changes} changes per run`;
  const per = (y: (r: RunResult) => number): Point[] => results.map((r) => ({ series: LABEL[r.way], x: r.services, y: y(r) }));
  const x = { title: 'Services', log: true };
  await writePlot(dir, { name: 'node-agent-start', title: 'Start to a programmed node', subtitle, x, y: { title: 's' }, series: 'way', mark: 'line', points: per((r) => r.programmedMs / 1000) });
  const brains: Point[] = results.flatMap((r) => (r.brain ? [{ series: 'split: the brain (file to-api)', x: r.services, y: r.brain.rssSteady }] : []));
  await writePlot(dir, { name: 'node-agent-rss', title: 'RSS of a quiet node agent (5 s after programmed)', subtitle, x, y: { title: 'MiB' }, series: 'process', mark: 'line', points: [...per((r) => r.agent.rssSteady), ...brains] });
  await writePlot(dir, { name: 'node-agent-change', title: 'One endpoint change, source to kernel', subtitle, x, y: { title: 'ms, p50' }, series: 'way', mark: 'line', points: per((r) => pct(r.changeMs, 50)) });
}

/** one run of one tree, for --against */
interface AbResult {
  tree: string;
  way: string;
  services: number;
  /** start -> programmed, or to-file's time */
  ms: number;
  /** CPU seconds to programmed (to-file: in all) */
  cpu: number;
  /** MiB: steady (NaN for to-file), peak */
  rss: number;
  peak: number;
}

/** Each tree's median and range per way and size, and the ratio of the medians (this tree / REV). */
function abReport(trees: string[], ab: AbResult[]) {
  const cell = (xs: number[], f: (x: number) => string) => {
    const s = xs.filter((x) => !Number.isNaN(x));
    return s.length ? `${f(median(s))} (${f(Math.min(...s))}–${f(Math.max(...s))})` : '-';
  };
  const [a, b] = trees;
  console.log('');
  console.log(`${a} vs ${b}, median (range) of each | Services | runs | start -> programmed (to-file: time), s | ratio | agent CPU to programmed, s | ratio | RSS steady, MiB | RSS peak, MiB`);
  console.log(`--- | --- | --- | --- | --- | --- | --- | --- | ---`);
  const keys = [...new Set(ab.map((x) => `${x.way}|${x.services}`))];
  for (const k of keys) {
    const [way, services] = k.split('|');
    const of = (t: string) => ab.filter((x) => x.tree === t && `${x.way}|${x.services}` === k);
    const A = of(a);
    const B = of(b);
    const col = (pick: (x: AbResult) => number, f: (x: number) => string) => `${cell(A.map(pick), f)} / ${cell(B.map(pick), f)}`;
    console.log(
      `${way} | ${services} | ${A.length} / ${B.length} | ${col((x) => x.ms / 1000, (x) => x.toFixed(1))} | ${ratio(median(A.map((x) => x.ms)), median(B.map((x) => x.ms)))} | ` +
        `${col((x) => x.cpu, (x) => x.toFixed(1))} | ${ratio(median(A.map((x) => x.cpu)), median(B.map((x) => x.cpu)))} | ${col((x) => x.rss, (x) => x.toFixed(0))} | ${col((x) => x.peak, (x) => x.toFixed(0))}`,
    );
  }
}

function report(sizes: number[], ways: string[], results: RunResult[], toFiles: Map<number, ToFileResult[]>, failed: { way: string; services: number; why: string }[], load0: number[]) {
  const get = (way: string, services: number) => results.find((r) => r.way === way && r.services === services);
  const runWays = ways.filter((w) => w !== 'to-file') as Way[];
  const label = LABEL;
  console.log('');
  console.log(`way | Services | start -> programmed | agent RSS steady / after the changes / peak | agent heap after GC | agent CPU to programmed / total | brain RSS steady / peak | brain heap | brain CPU | change -> kernel p50 / p99`);
  console.log(`--- | --- | --- | --- | --- | --- | --- | --- | --- | ---`);
  for (const services of sizes) {
    for (const way of runWays) {
      const r = get(way, services);
      if (!r) continue;
      const b = r.brain;
      console.log(
        `${label[way]} | ${services} | ${f1(r.programmedMs / 1000)} s | ${f0(r.agent.rssSteady)} / ${f0(r.agent.rssAfter)} / ${f0(r.agent.rssPeak)} MiB | ${f0(r.agent.heap)} MiB | ${f1(r.agent.cpuProgrammed)} / ${f1(r.agent.cpuTotal)} s | ` +
          `${b ? `${f0(b.rssSteady)} / ${f0(b.rssPeak)} MiB | ${f0(b.heap)} MiB | ${f1(b.cpuProgrammed)} / ${f1(b.cpuTotal)} s` : '- | - | -'} | ${f1(pct(r.changeMs, 50))} / ${f1(pct(r.changeMs, 99))} ms`,
      );
    }
  }
  // side by side: each way against the file source's all-in-one at that size, and each size against the smallest
  if (runWays.length > 1 && runWays.includes('file')) {
    console.log('');
    console.log(`vs file to-local to-nft at the same size | Services | start -> programmed | agent RSS steady | agent RSS peak | change p99`);
    console.log(`--- | --- | --- | --- | --- | ---`);
    for (const services of sizes) {
      const base = get('file', services);
      for (const way of runWays.filter((w) => w !== 'file')) {
        const r = get(way, services);
        if (!r || !base) continue;
        console.log(`${label[way]} | ${services} | ${ratio(r.programmedMs, base.programmedMs)} | ${ratio(r.agent.rssSteady, base.agent.rssSteady)} | ${ratio(r.agent.rssPeak, base.agent.rssPeak)} | ${ratio(pct(r.changeMs, 99), pct(base.changeMs, 99))}`);
      }
    }
  }
  if (sizes.length > 1) {
    console.log('');
    console.log(`vs ${sizes[0]} Services (same way) | Services | start -> programmed | agent RSS steady | agent RSS per Service above ${sizes[0]} | brain RSS per Service above ${sizes[0]} | change p99`);
    console.log(`--- | --- | --- | --- | --- | --- | ---`);
    for (const way of runWays) {
      const small = get(way, sizes[0]);
      for (const services of sizes.slice(1)) {
        const r = get(way, services);
        if (!r || !small) continue;
        const per = (a: number, b: number) => `${(((a - b) * 1024) / (services - sizes[0])).toFixed(1)} KiB`;
        console.log(
          `${label[way]} | ${services} | ${ratio(r.programmedMs, small.programmedMs)} | ${ratio(r.agent.rssSteady, small.agent.rssSteady)} | ${per(r.agent.rssSteady, small.agent.rssSteady)} | ${r.brain && small.brain ? per(r.brain.rssSteady, small.brain.rssSteady) : '-'} | ${ratio(pct(r.changeMs, 99), pct(small.changeMs, 99))}`,
        );
      }
    }
  }
  if (toFiles.size) {
    console.log('');
    console.log(`kpng file --input DIR --no-watch to-file --node-name ${NODE} --once | Services | time | peak RSS | CPU | output`);
    console.log(`--- | --- | --- | --- | --- | ---`);
    for (const [services, rs] of toFiles) {
      for (const x of rs) console.log(`--format ${x.format} | ${services} | ${x.error ? `failed: ${x.error.split('\n')[0]}` : `${f1(x.ms / 1000)} s`} | ${f0(x.peak)} MiB | ${f1(x.cpu)} s | ${(x.bytes / 2 ** 20).toFixed(1)} MiB`);
    }
  }
  for (const x of failed) console.log(`\n${x.way} at ${x.services}: ${x.why}`);
  console.log(`\nload average before ${load0.map((x) => x.toFixed(2)).join(' ')}, after ${loadavg().map((x) => x.toFixed(2)).join(' ')}; ${cpuPressure()}`);
  console.log(JSON.stringify({ nodeAgent: results.map((r) => ({ ...r, changeP50: pct(r.changeMs, 50), changeP99: pct(r.changeMs, 99) })), toFile: Object.fromEntries(toFiles) }));
}
