// What the dataplane benchmarks (nft, iptables, ebpf, ipvs) share: each measurement in
// its own network namespace, by a child process of the benchmark run there
// (once, or kept alive and asked one step at a time, so steps of different
// sizes interleave and the machine's noise hits them alike);
// the synthetic cluster (Services x 5 endpoints plus probe Services whose one
// endpoint is a server on lo); the cold sync and one endpoint change at a
// time; and the first-connection latency probe, a small separate process
// in a namespace whose rules stay after the child has exited.
import { spawn, execFileSync, spawnSync, type ChildProcess, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { createInterface } from 'node:readline';
import { randomBytes } from 'node:crypto';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pino } from 'pino';
import { Store, KINDS } from '../src/store/store.js';
import { ServiceViews } from '../src/localstate/views.js';
import { LocalDiff } from '../src/diff/local-diff.js';
import { DecoderSink, type DecoderHandler } from '../src/diff/decoder.js';
import { LocalSet } from '../src/api/model.js';
import { convertObject } from '../src/sources/objects.js';
import { applyObject, type ModelObject } from '../src/sources/apply.js';
import { defaultConfig, type KubeProxyConfiguration } from '../src/backends/shared/config.js';
import { service, slice, node } from '../test/helpers/k8s.js';
import { ROOT, now } from './_harness.js';

/** the probe Services' endpoint: a server on lo in each namespace (this kernel has no dummy links) */
export const ENDPOINT = '10.255.0.1';
/**
 * A client address that is not the endpoint (a pod of the cluster CIDR
 * calling another): probes from ENDPOINT itself are hairpin traffic, which
 * kube-proxy's rules masquerade (fully random ports, so some connections
 * meet the server's TIME_WAIT sockets and retransmit their SYN).
 */
export const CLIENT = '10.255.0.2';
/** the ClusterIP of synthetic Service s (172.16.0.0/12, routed to lo) */
export const vip = (s: number) => `172.${16 + (s >> 16)}.${(s >> 8) & 255}.${s & 255}`;

// --- the benchmark (parent) side

/**
 * The namespaces of one benchmark run and the processes in them. A benchmark
 * interrupted (Ctrl-C, timeout) kills its running child and removes its
 * namespaces; close() removes what is left.
 */
export class BenchNamespaces {
  private readonly live = new Set<string>();
  private running?: ChildProcess;
  private readonly kept = new Set<ChildProcess>();
  private readonly onSignal = () => {
    this.close();
    process.exit(130);
  };

  /** bench: the benchmark's name (bench/<bench>.ts, run again as the child); prefix: of the namespaces' names */
  constructor(
    private readonly bench: string,
    private readonly prefix: string,
  ) {
    if (process.getuid?.() !== 0) throw new Error(`the ${bench} benchmark needs root (it creates network namespaces)`);
    process.once('SIGINT', this.onSignal);
    process.once('SIGTERM', this.onSignal);
  }

  add(): string {
    const ns = `${this.prefix}-${randomBytes(3).toString('hex')}`;
    execFileSync('ip', ['netns', 'add', ns]);
    this.live.add(ns);
    return ns;
  }

  /** kills what still runs in ns (the processes of a killed child), then removes it */
  remove(ns: string): void {
    if (!this.live.delete(ns)) return;
    // a namespace outlives its removal while a process is in it
    const pids = spawnSync('ip', ['netns', 'pids', ns], { encoding: 'utf8' }).stdout ?? '';
    for (const pid of pids.split('\n').filter(Boolean)) {
      try {
        process.kill(Number(pid), 'SIGKILL');
      } catch {
        /* gone already */
      }
    }
    spawnSync('ip', ['netns', 'del', ns]);
  }

  /** kills what runs, removes every namespace left, stops handling signals */
  close(): void {
    this.running?.kill('SIGKILL');
    for (const p of this.kept) p.kill('SIGKILL');
    for (const ns of [...this.live]) this.remove(ns);
    process.removeListener('SIGINT', this.onSignal);
    process.removeListener('SIGTERM', this.onSignal);
  }

  /** runs the benchmark's child (runAsChild) in ns with params; returns what it measured */
  async child<R>(ns: string, params: object, what: string): Promise<R> {
    const r = await this.exec(['ip', 'netns', 'exec', ns, process.execPath, '--expose-gc', '--import', 'tsx', `${ROOT}bench/run.ts`, this.bench], { KPNG_BENCH_CHILD: JSON.stringify(params) });
    const line = r.stdout.split('\n').find((l) => l.startsWith('RESULT '));
    if (!line) throw new Error(`${what} failed: ${r.stderr || r.stdout}`);
    return JSON.parse(line.slice(7));
  }

  /**
   * Starts the benchmark's child (serveAsChild) in ns with params and keeps
   * it: ask() sends it one request and resolves with its answer; end() closes
   * its input and waits for it to exit.
   */
  keep(ns: string, params: object, what: string): { ask<R>(request: object): Promise<R>; end(): Promise<void> } {
    const p: ChildProcessWithoutNullStreams = spawn('ip', ['netns', 'exec', ns, process.execPath, '--expose-gc', '--import', 'tsx', `${ROOT}bench/run.ts`, this.bench], {
      cwd: ROOT,
      env: { ...process.env, KPNG_BENCH_CHILD: JSON.stringify(params), KPNG_BENCH_SERVE: '1' },
    });
    this.kept.add(p);
    let stderr = '';
    p.stderr.on('data', (d) => (stderr = (stderr + d).slice(-20_000)));
    const answers = createInterface({ input: p.stdout })[Symbol.asyncIterator]();
    const exited = new Promise<void>((resolve) =>
      p.on('close', () => {
        this.kept.delete(p);
        resolve();
      }),
    );
    return {
      ask: async <R>(request: object): Promise<R> => {
        p.stdin.write(JSON.stringify(request) + '\n');
        for (;;) {
          const line = await answers.next();
          if (line.done) throw new Error(`${what} failed: ${stderr}`);
          if (line.value.startsWith('ANSWER ')) return JSON.parse(line.value.slice(7)) as R;
        }
      },
      end: () => {
        p.stdin.end();
        return exited;
      },
    };
  }

  /**
   * First-connection latency through the rules left in ns: a server at the
   * endpoint, `warmup` then `n` rounds of one new TCP connection to each
   * host (interleaved), from a fresh process. Microseconds per host. close:
   * how the server ends each connection; from: the client's address
   * (default: the kernel's choice, ENDPOINT on lo).
   */
  async probe(ns: string, hosts: string[], opts: { n: number; warmup?: number; port?: number; close: 'end' | 'destroy'; cgroup?: string; from?: string }, what: string): Promise<number[][]> {
    return this.script(ns, PROBE, { hosts, n: opts.n, warmup: opts.warmup ?? 100, port: opts.port ?? 80, close: opts.close, endpoint: ENDPOINT, from: opts.from }, `latency probe for ${what}`, opts.cgroup);
  }

  /**
   * Runs a small node script in ns (argv[1]: params as JSON), in a cgroup
   * from its first instruction when given (eBPF programs attached there see
   * its sockets); returns what it printed, parsed as JSON.
   */
  async script<R>(ns: string, script: string, params: object, what: string, cgroup?: string): Promise<R> {
    return JSON.parse(await this.run(ns, [process.execPath, '-e', script, JSON.stringify(params)], what, cgroup));
  }

  /** runs argv in ns (in a cgroup from its first instruction when given); its standard output */
  async run(ns: string, argv: string[], what: string, cgroup?: string): Promise<string> {
    const inNs = ['ip', 'netns', 'exec', ns, ...argv];
    const p = await this.exec(cgroup ? ['sh', '-c', 'echo $$ > "$0/cgroup.procs" && exec "$@"', cgroup, ...inNs] : inNs, {});
    if (p.code !== 0) throw new Error(`${what} failed: ${p.stderr}`);
    return p.stdout;
  }

  /** runs a command to completion, asynchronously (signals reach this process meanwhile) */
  private exec(argv: string[], env: Record<string, string>): Promise<{ code: number | null; stdout: string; stderr: string }> {
    return new Promise((resolve) => {
      const p = (this.running = spawn(argv[0], argv.slice(1), { cwd: ROOT, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] }));
      let stdout = '';
      let stderr = '';
      p.stdout!.on('data', (d) => (stdout += d));
      p.stderr!.on('data', (d) => (stderr = (stderr + d).slice(-20_000)));
      p.on('close', (code) => {
        this.running = undefined;
        resolve({ code, stdout, stderr });
      });
    });
  }
}

/** the probe process: argv[1] is JSON { hosts, n, warmup, port, close, endpoint, from }; prints microseconds per host */
const PROBE = `
const net = require('node:net');
const { hosts, n, warmup, port, close, endpoint, from } = JSON.parse(process.argv[1]);
const one = (host) => new Promise((resolve, reject) => {
  const t = process.hrtime.bigint();
  const c = net.connect({ host, port, localAddress: from }, () => { const us = Number(process.hrtime.bigint() - t) / 1e3; c.destroy(); resolve(us); });
  c.on('error', reject);
});
const srv = net.createServer((s) => (close === 'end' ? s.end() : s.destroy())).listen(8080, endpoint, async () => {
  const out = hosts.map(() => []);
  for (let i = 0; i < warmup; i++) for (const h of hosts) await one(h);
  for (let i = 0; i < n; i++) for (let j = 0; j < hosts.length; j++) out[j].push(await one(hosts[j]));
  console.log(JSON.stringify(out));
  srv.close();
});
`;

// --- the child side, in its namespace

/** In the child (KPNG_BENCH_CHILD set): runs fn on its params, prints its result for the parent; false in the parent. */
export async function runAsChild<P, R>(fn: (p: P) => Promise<R>): Promise<boolean> {
  const params = process.env.KPNG_BENCH_CHILD;
  if (!params) return false;
  console.log('RESULT ' + JSON.stringify(await fn(JSON.parse(params))));
  return true;
}

/**
 * In a kept child (BenchNamespaces.keep): start(params) makes the handler of
 * its requests, each answered in turn until its input closes; false in the parent.
 */
export async function serveAsChild<P, Q>(start: (p: P) => Promise<(request: Q) => Promise<unknown>>): Promise<boolean> {
  const params = process.env.KPNG_BENCH_CHILD;
  if (!params || !process.env.KPNG_BENCH_SERVE) return false;
  const handle = await start(JSON.parse(params));
  for await (const line of createInterface({ input: process.stdin })) {
    if (line.trim()) console.log('ANSWER ' + JSON.stringify((await handle(JSON.parse(line))) ?? null));
  }
  return true;
}

/** lo up, the probe's endpoint on it, the Service IPs routed there too; an xtables lock of its own */
export function prepareNamespace(): void {
  // a namespace stands for a node of its own, so it gets its own xtables
  // lock: the host's /run/xtables.lock is shared by every namespace of the
  // machine, and other jobs' iptables holding it made a restore here give up
  process.env.XTABLES_LOCKFILE ??= join(tmpdir(), `kpng-bench-xtables-${process.pid}.lock`);
  execFileSync('ip', ['link', 'set', 'lo', 'up']);
  execFileSync('ip', ['addr', 'add', `${ENDPOINT}/32`, 'dev', 'lo']);
  execFileSync('ip', ['addr', 'add', `${CLIENT}/32`, 'dev', 'lo']);
  execFileSync('ip', ['route', 'add', '172.16.0.0/12', 'dev', 'lo']);
}

export interface ProbeService {
  namespace: string;
  name: string;
  clusterIP: string;
  /** the endpoint's pod name */
  pod: string;
}

export interface SyntheticCluster {
  store: Store;
  diff: LocalDiff;
  /** the EndpointSlice of the i-th change: one endpoint of one Service replaced */
  change(i: number): ModelObject;
}

/**
 * Node node-0; the probe Services (port 80, one endpoint: ENDPOINT on
 * node-0); then Services bench/svc-<s> for s in [from, to) at vip(s), port
 * 80, 5 endpoints each on other nodes; everything synced.
 */
export function syntheticCluster(c: { probes: ProbeService[]; from: number; to: number }): SyntheticCluster {
  const store = new Store();
  const ip = (i: number) => `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`;
  const sliceOf = (s: number, gen = 0) =>
    slice('bench', `svc-${s}-1`, `svc-${s}`, Array.from({ length: 5 }, (_, e) => ({ ip: e === 0 && gen ? ip(s * 5 + e + gen * 1_000_000) : ip(s * 5 + e), node: `node-${(s * 5 + e) % 100}`, pod: `p-${s}-${e}-${e === 0 ? gen : 0}` })));
  store.update((tx) => {
    applyObject(tx, convertObject(node('node-0', 'z1', ['192.168.0.2'])) as ModelObject);
    for (const p of c.probes) {
      applyObject(tx, convertObject(service(p.namespace, p.name, { clusterIP: p.clusterIP, ports: [{ name: 'http', port: 80 }] })) as ModelObject);
      applyObject(tx, convertObject(slice(p.namespace, `${p.name}-1`, p.name, [{ ip: ENDPOINT, node: 'node-0', pod: p.pod }])) as ModelObject);
    }
    for (let s = c.from; s < c.to; s++) {
      applyObject(tx, convertObject(service('bench', `svc-${s}`, { clusterIP: vip(s), ports: [{ name: 'http', port: 80 }] })) as ModelObject);
      applyObject(tx, convertObject(sliceOf(s)) as ModelObject);
    }
    KINDS.forEach((k) => tx.setSynced(k));
  });
  const diff = new LocalDiff(store, new ServiceViews(store), 'node-0', { sets: [LocalSet.NodesSet, LocalSet.ServiceCIDRsSet] });
  return { store, diff, change: (i) => convertObject(sliceOf(c.from + ((i * 7919) % (c.to - c.from)), i + 1)) as ModelObject };
}

/** `services` Services in all: svc-0, the probe Service (its one endpoint is the probe's server on ENDPOINT), then the synthetic ones */
export function probedCluster(services: number): SyntheticCluster {
  return syntheticCluster({ probes: [{ namespace: 'bench', name: 'svc-0', clusterIP: vip(0), pod: 'probe' }], from: 1, to: services });
}

/**
 * The cold sync (compute: every op but the last into the proxier; apply: the
 * last, the sync); then change(i) makes the i-th endpoint change and returns
 * its time from the store update to the kernel having it.
 */
export async function coldSync(cluster: SyntheticCluster, proxier: DecoderHandler): Promise<{ coldComputeMs: number; coldApplyMs: number; change(i: number): Promise<number> }> {
  const sink = new DecoderSink(proxier);
  let t0 = now();
  const ops = cluster.diff.next();
  for (const op of ops.slice(0, -1)) await sink.send(op);
  const coldComputeMs = now() - t0;
  t0 = now();
  await sink.send(ops.at(-1)!);
  const coldApplyMs = now() - t0;
  const change = async (i: number) => {
    const c = cluster.change(i);
    const t = now();
    cluster.store.update((tx) => applyObject(tx, c));
    for (const op of cluster.diff.next()) await sink.send(op);
    return now() - t;
  };
  return { coldComputeMs, coldApplyMs, change };
}

/** kube-proxy's defaults, every family's minSyncPeriod 0 (each change measured alone), the cluster's pods in 10.0.0.0/8 */
export function benchConfig(): KubeProxyConfiguration {
  const config = defaultConfig();
  config.clusterCIDRs = ['10.0.0.0/8'];
  config.nftables.minSyncPeriodMs = config.iptables.minSyncPeriodMs = config.ipvs.minSyncPeriodMs = 0;
  return config;
}

/** a child BenchNamespaces.keep started */
export type KeptChild = ReturnType<BenchNamespaces['keep']>;

/**
 * `changes` endpoint changes, one at a time, the children in turn (1, 2, ...,
 * 1, ...: the machine's noise hits them alike); each child's change times
 * (ms, store to kernel) and its proxier's own sync times.
 */
export async function changesInTurn(children: readonly KeptChild[], changes: number): Promise<{ ms: number[]; syncMs: number[] }[]> {
  const out = children.map(() => ({ ms: [] as number[], syncMs: [] as number[] }));
  for (let i = 0; i < changes; i++) {
    for (const [k, c] of children.entries()) {
      const [ms, syncMs] = await c.ask<[number, number]>({ op: 'change', i });
      out[k].ms.push(ms);
      out[k].syncMs.push(syncMs);
    }
  }
  return out;
}

/** the log of the proxiers under test: warnings and errors only */
export const benchLog = () => pino({ level: 'warn' });

/** A proxier the dataplane benchmarks measure: closed at the end; its last sync's ms when it tells. */
export interface ProxierUnderTest extends DecoderHandler {
  close(): Promise<void>;
  readonly stats?: { readonly lastSyncMs: number };
}

/** What the parent asks a proxier child (KeptChild.ask), one step at a time. */
export type ProxierRequest = { op: 'cold' } | { op: 'change'; i: number } | { op: 'finish' } | { op: 'detail' };

/** a proxier child's answer to 'cold' (with what its `cold` hook adds) */
export interface ProxierCold {
  coldComputeMs: number;
  coldApplyMs: number;
}

/**
 * The request handler of a kept child (serveAsChild) that runs one proxier
 * on a synthetic cluster: 'cold' is its cold sync (coldSync; `cold` adds to
 * the answer), 'change' i the i-th endpoint change ([ms from the store update
 * to the kernel, the proxier's lastSyncMs]; `changed` runs after it),
 * 'finish' closes it (then `closed`) and answers the RSS after a GC, 'detail'
 * answers what `detail` tells (ipvs: where its changes' time went).
 */
export function proxierChild(
  proxier: ProxierUnderTest,
  cluster: SyntheticCluster,
  hooks: { cold?: (c: ProxierCold) => object; changed?: () => void; closed?: () => void; detail?: () => unknown } = {},
): (r: ProxierRequest) => Promise<unknown> {
  let change: ((i: number) => Promise<number>) | undefined;
  return async (r) => {
    switch (r.op) {
      case 'cold': {
        const c = await coldSync(cluster, proxier);
        change = c.change;
        const cold: ProxierCold = { coldComputeMs: c.coldComputeMs, coldApplyMs: c.coldApplyMs };
        return { ...cold, ...hooks.cold?.(cold) };
      }
      case 'change': {
        const ms = await change!(r.i);
        hooks.changed?.();
        return [ms, proxier.stats?.lastSyncMs ?? 0];
      }
      case 'finish':
        await proxier.close();
        hooks.closed?.();
        return rssMiB();
      case 'detail':
        return hooks.detail?.();
    }
  };
}

/** resident memory after a full GC (the benchmarks run with --expose-gc), MiB */
export function rssMiB(): number {
  (globalThis as { gc?: () => void }).gc?.();
  return process.memoryUsage.rss() / 2 ** 20;
}

/** Calls onSync for each Sync op (an OpItem `{ Sync {} }`) of a raw gRPC localv1 watch stream, skipping the other frames unread. */
export function onSyncFrames(stream: { on(event: 'data', f: (d: Buffer) => void): unknown }, onSync: () => void): void {
  let buf: Buffer = Buffer.alloc(0);
  stream.on('data', (d: Buffer) => {
    buf = buf.length ? Buffer.concat([buf, d]) : d;
    let off = 0;
    while (buf.length - off >= 5) {
      const len = buf.readUInt32BE(off + 1);
      if (buf.length - off < 5 + len) break;
      const isSync = len === 2 && buf[off + 5] === 0x0a && buf[off + 6] === 0x00;
      off += 5 + len;
      if (isSync) onSync();
    }
    buf = off === buf.length ? Buffer.alloc(0) : buf.subarray(off);
  });
}

function varint(n: number): Buffer {
  const out: number[] = [];
  while (n >= 0x80) (out.push((n & 0x7f) | 0x80), (n = Math.floor(n / 128)));
  out.push(n);
  return Buffer.from(out);
}

/** a localv1 WatchReq{NodeName=1, HeldDigests=3} as a gRPC frame, for the raw watchers */
export function watchRequest(node: string, held?: Buffer): Buffer {
  const name = Buffer.from(node);
  const parts = [Buffer.from([0x0a]), varint(name.length), name];
  if (held?.length) parts.push(Buffer.from([0x1a]), varint(held.length), held);
  return grpcFrame(Buffer.concat(parts));
}

/** A gRPC message frame (not compressed) around msg, for the raw watchers */
export function grpcFrame(msg: Buffer): Buffer {
  const f = Buffer.allocUnsafe(5 + msg.length);
  f[0] = 0;
  f.writeUInt32BE(msg.length, 1);
  msg.copy(f, 5);
  return f;
}
