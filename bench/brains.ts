// npm run bench -- brains [--nodes 1000] [--services 10000] [--endpoints 5] [--changes 50]
//                         [--brains 1] [--procs 2] [--down-changes 10] [--restart both|resume|full|none]
//
// Brains as processes (each its own store, built from the same seeded
// cluster, and its own to-api server on 127.0.0.1), N node watchers in
// --procs processes (raw HTTP/2 gRPC, one connection per node, the next
// request after each Sync, as api-fanout's). Each node follows its own brain
// (brainOrder of its name over the brains' addresses, as kpng local does).
//
// 1. initial sync of every node (what a brain restart costs every node today);
// 2. --changes endpoint changes, one at a time, applied by every brain (every
//    node sees every service): change -> each node's Sync p50/p99, and to the
//    last node's; brains' CPU per change; each brain's RSS;
// 3. brain 0 is SIGKILLed; --down-changes changes happen while it is down.
//    With one brain it is restarted (a new process on the same port, which
//    rebuilds the cluster and replays every change); with several, its nodes
//    fail over to their next brain. Measured: from the restarted brain
//    serving (or the kill) to every one of its nodes' first Sync on the new
//    stream, the bytes the brains sent meanwhile, with resume (each node's
//    HeldDigests in its first request) and/or without (today: Reset and the
//    full state).
//
// A node's HeldDigests are what it holds as digests; a kpng local node
// computes them from its FilterResetSink. The raw watchers keep no state, so
// the killed brain computes them for its nodes from the views it served
// them, just before it is killed: the same bytes by construction
// (src/diff/resume.ts; test/api/brains.test.ts checks a real node's resume).
import type { ChildProcess } from 'node:child_process';
import { connect, type ClientHttp2Session, type ClientHttp2Stream } from 'node:http2';
import { pino } from 'pino';
import { Store } from '../src/store/store.js';
import { ServiceViews } from '../src/localstate/views.js';
import { applyObject } from '../src/sources/apply.js';
import { ApiServer, tuneHeapForFanOut } from '../src/sinks/api/server.js';
import { brainOrder } from '../src/api/grpc/client.js';
import { BucketDigests, bucketCountFor, bucketOf, viewDigest } from '../src/diff/resume.js';
import { freePort } from '../test/helpers/port.js';
import { buildCluster, type Config as ClusterConfig } from './api-fanout.js';
import { onSyncFrames, watchRequest } from './_scale.js';
import { forkSelf, forkedJob, mb, mean, now, options, pct, procStat, sleep, sum, until } from './_harness.js';

const RESTARTS = ['both', 'resume', 'full', 'none'] as const;
const DEFAULTS = { nodes: 1000, services: 10_000, endpoints: 5, changes: 50, brains: 1, procs: 2, downChanges: 10, restart: 'both' as (typeof RESTARTS)[number] };
type Config = typeof DEFAULTS;

const nodeName = (i: number) => `node-${String(i).padStart(4, '0')}`;

// --- a brain process

interface BrainJob {
  port: number;
  cluster: ClusterConfig;
  /** changes to apply before serving (a restarted brain catches up with the cluster) */
  replay: number;
}

type ToBrain = { type: 'change' } | { type: 'stats' } | { type: 'digests'; nodes: string[] };
type FromBrain =
  | { type: 'serving' }
  | { type: 'stats'; cpuMs: number; rss: number; maxRss: number; bytes: number; messages: number }
  | { type: 'digests'; held: string[] };

async function brainMain(job: BrainJob) {
  tuneHeapForFanOut();
  const store = new Store();
  const cluster = buildCluster(store, job.cluster);
  const apply = () => {
    const conv = cluster.change();
    store.update((tx) => conv.kind !== 'Ignored' && applyObject(tx, conv));
  };
  for (let i = 0; i < job.replay; i++) apply();
  const views = new ServiceViews(store, '', { keepDecoded: false });
  const server = new ApiServer({ store, views, log: pino({ level: 'warn' }), listen: `tcp://127.0.0.1:${job.port}` });
  await server.start();
  let maxRss = 0;
  setInterval(() => (maxRss = Math.max(maxRss, process.memoryUsage.rss())), 200).unref();
  const send = (m: FromBrain) => process.send!(m);
  process.on('message', (m: ToBrain) => {
    if (m.type === 'change') apply();
    else if (m.type === 'stats') {
      const c = process.cpuUsage();
      send({ type: 'stats', cpuMs: (c.user + c.system) / 1000, rss: process.memoryUsage.rss(), maxRss, bytes: server.stats.bytes, messages: server.stats.messages });
    } else if (m.type === 'digests') {
      // what each node holds: the view this brain sent it of every service
      const keys = [...store.serviceKeys()];
      const held = m.nodes.map((name) => {
        const zone = store.getNode(name)?.node?.Topology?.Zone ?? '';
        const vs = keys.map((k) => views.view(k, { name, zone })).filter((v) => v !== undefined);
        const d = new BucketDigests(bucketCountFor(vs.length));
        for (const v of vs) {
          const { hash, digest } = viewDigest(v!);
          d.add(bucketOf(hash, d.buckets), digest);
        }
        return Buffer.from(d.toBytes()).toString('base64');
      });
      send({ type: 'digests', held });
    }
  });
  process.on('disconnect', () => process.exit(0));
  send({ type: 'serving' });
}

/** user + system CPU of a process, ms */
const processCpuMs = (pid: number) => procStat(pid).cpu * 1000;

// --- a watcher process

interface WatcherJob {
  nodes: { name: string; ports: number[] }[];
}
type ToWatcher = { type: 'held'; held: Record<string, string> };
type FromWatcher = { type: 'first'; count: number } | { type: 'resynced'; count: number } | { type: 'syncs'; times: number[] };

async function watcherMain(job: WatcherJob) {
  const send = (m: FromWatcher) => process.send!(m);
  let firsts = 0;
  let resyncs = 0;
  let pending: number[] = [];
  let flush: NodeJS.Timeout | undefined;
  const held = new Map<string, Buffer>();
  const sessions = new Set<ClientHttp2Session>();
  process.on('message', (m: ToWatcher) => {
    held.clear();
    for (const [k, v] of Object.entries(m.held)) held.set(k, Buffer.from(v, 'base64'));
  });

  const watch = (node: { name: string; ports: number[] }, at: number, reconnect: boolean) => {
    const session = connect(`http://127.0.0.1:${node.ports[at]}`);
    sessions.add(session);
    let stream: ClientHttp2Stream | undefined;
    let synced = 0;
    let gone = false;
    // a dead brain: on to the node's next one (the same one, restarted, with one brain), as kpng local does
    const retry = () => {
      if (gone) return;
      gone = true;
      sessions.delete(session);
      session.destroy();
      const next = synced > 0 ? (at + 1) % node.ports.length : at;
      setTimeout(() => watch(node, next, reconnect || synced > 0), 100 + Math.random() * 200);
    };
    session.on('error', retry);
    session.on('close', retry);
    stream = session.request({ ':method': 'POST', ':path': '/localv1.Sets/Watch', 'content-type': 'application/grpc', te: 'trailers' }, { endStream: false });
    stream.on('error', retry);
    stream.on('close', retry);
    const plain = watchRequest(node.name);
    stream.write(reconnect ? watchRequest(node.name, held.get(node.name)) : plain);
    onSyncFrames(stream, () => {
      const t = now();
      stream!.write(plain);
      if (synced++ === 0) {
        if (reconnect) send({ type: 'resynced', count: ++resyncs });
        else if (++firsts % 50 === 0 || firsts === job.nodes.length) send({ type: 'first', count: firsts });
        return;
      }
      pending.push(t);
      flush ??= setTimeout(() => {
        send({ type: 'syncs', times: pending });
        pending = [];
        flush = undefined;
      }, 5);
    });
  };
  for (const n of job.nodes) watch(n, 0, false);
  process.on('disconnect', () => {
    sessions.forEach((s) => s.destroy());
    process.exit(0);
  });
}

const brainJob = forkedJob<BrainJob>('KPNG_BENCH_BRAIN');
const watcherJob = brainJob ? undefined : forkedJob<WatcherJob>('KPNG_BENCH_BRAIN_WATCHERS');
if (brainJob) await brainMain(brainJob);
else if (watcherJob) await watcherMain(watcherJob);

// --- the run

class Brain {
  readonly proc: ChildProcess;
  private waiting = new Map<string, (m: FromBrain) => void>();
  readonly serving: Promise<void>;
  readonly exited: Promise<void>;

  constructor(job: BrainJob) {
    this.proc = forkSelf(import.meta.url, 'KPNG_BENCH_BRAIN', job, ['--expose-gc']);
    this.proc.on('message', (m: FromBrain) => {
      const w = this.waiting.get(m.type);
      this.waiting.delete(m.type);
      w?.(m);
    });
    this.serving = this.next('serving').then(() => {});
    this.exited = new Promise((r) => this.proc.on('exit', () => r()));
  }

  private next<T extends FromBrain['type']>(type: T): Promise<Extract<FromBrain, { type: T }>> {
    return new Promise((resolve) => this.waiting.set(type, resolve as (m: FromBrain) => void));
  }

  change(): void {
    this.proc.send({ type: 'change' } satisfies ToBrain);
  }

  async stats() {
    const r = this.next('stats');
    this.proc.send({ type: 'stats' } satisfies ToBrain);
    return r;
  }

  async digests(nodes: string[]): Promise<string[]> {
    const r = this.next('digests');
    this.proc.send({ type: 'digests', nodes } satisfies ToBrain);
    return (await r).held;
  }

  async kill(): Promise<void> {
    this.proc.kill('SIGKILL');
    await this.exited;
  }
}

export default async function main(args: string[]) {
  const c = options(args, DEFAULTS, { restart: RESTARTS });
  const cluster: ClusterConfig = { nodes: c.nodes, services: c.services, endpoints: c.endpoints, changes: 0, procs: 0 };
  const ports = await Promise.all(Array.from({ length: c.brains }, () => freePort()));
  const address = (p: number) => `tcp://127.0.0.1:${p}`;
  const t0 = now();
  let brains = ports.map((port) => new Brain({ port, cluster, replay: 0 }));
  const children: ChildProcess[] = [];
  try {
    await Promise.all(brains.map((b) => b.serving));
    console.log(`${c.brains} brain process${c.brains > 1 ? 'es' : ''} serving ${c.nodes} nodes, ${c.services} services, ${c.services * c.endpoints} endpoints (built in ${((now() - t0) / 1000).toFixed(1)} s); ${c.procs} watcher processes`);
    const names = Array.from({ length: c.nodes }, (_, i) => nodeName(i));
    const orders = names.map((n) => brainOrder(ports.map(address), n).map((a) => Number(a.split(':').pop())));
    const ownNodes = ports.map((p) => names.filter((_, i) => orders[i][0] === p));
    if (c.brains > 1) console.log(`nodes per brain: ${ownNodes.map((x) => x.length).join(', ')}`);

    let firsts = 0;
    let resynced = 0;
    let syncCount = 0;
    let syncTimes: number[] = [];
    const perChild = Math.ceil(c.nodes / c.procs);
    const tStart = now();
    const cpu0 = await Promise.all(brains.map((b) => b.stats()));
    for (let p = 0; p < c.procs; p++) {
      const nodes = names.slice(p * perChild, (p + 1) * perChild).map((name) => ({ name, ports: orders[names.indexOf(name)] }));
      const counts = { first: 0, resynced: 0 };
      const child = forkSelf(import.meta.url, 'KPNG_BENCH_BRAIN_WATCHERS', { nodes } satisfies WatcherJob);
      children.push(child);
      child.on('message', (m: FromWatcher) => {
        if (m.type === 'first') (firsts += m.count - counts.first), (counts.first = m.count);
        else if (m.type === 'resynced') (resynced += m.count - counts.resynced), (counts.resynced = m.count);
        else (syncTimes.push(...m.times), (syncCount += m.times.length));
      });
    }
    await until('initial sync', () => firsts >= c.nodes, { timeoutMs: 30 * 60_000 });
    const initMs = now() - tStart;
    const s1 = await Promise.all(brains.map((b) => b.stats()));
    const initBytes = sum(s1.map((s) => s.bytes));
    const initMessages = sum(s1.map((s) => s.messages));
    console.log(
      `initial sync: ${c.nodes} nodes in ${(initMs / 1000).toFixed(1)} s, ${initMessages} messages, ${mb(initBytes)} MB (${(initBytes / c.nodes / 1024).toFixed(0)} KiB a node), ` +
        `brain cpu ${(sum(s1.map((s, i) => s.cpuMs - cpu0[i].cpuMs)) / 1000).toFixed(1)} s; brain rss ${s1.map((s) => mb(s.rss)).join(', ')} MB`,
    );

    // changes, one at a time, every brain applies it
    const allNode: number[] = [];
    const lastNode: number[] = [];
    const cpuMs: number[] = [];
    const watchersCpu0 = sum(children.map((ch) => processCpuMs(ch.pid!)));
    for (let k = 0; k < c.changes; k++) {
      const before = await Promise.all(brains.map((b) => b.stats()));
      syncTimes = [];
      syncCount = 0;
      const tc = now();
      brains.forEach((b) => b.change());
      await until(`change ${k}`, () => syncCount >= c.nodes, { timeoutMs: 60_000 });
      const after = await Promise.all(brains.map((b) => b.stats()));
      const times = syncTimes.map((t) => t - tc);
      allNode.push(...times);
      lastNode.push(Math.max(...times));
      cpuMs.push(sum(after.map((s, i) => s.cpuMs - before[i].cpuMs)));
      await sleep(20);
    }
    const watchersCpu = (sum(children.map((ch) => processCpuMs(ch.pid!))) - watchersCpu0) / Math.max(1, c.changes);
    const s2 = await Promise.all(brains.map((b) => b.stats()));
    if (c.changes > 0) {
      console.log(`changes: ${c.changes} endpoint changes, each affecting all ${c.nodes} nodes`);
      console.log(`  change -> a node's Sync:      p50 ${pct(allNode, 50).toFixed(1)} ms, p99 ${pct(allNode, 99).toFixed(1)} ms`);
      console.log(`  change -> every node's Sync:  p50 ${pct(lastNode, 50).toFixed(1)} ms, p99 ${pct(lastNode, 99).toFixed(1)} ms, max ${Math.max(...lastNode).toFixed(1)} ms`);
      console.log(`  brains' cpu per change:       avg ${mean(cpuMs).toFixed(1)} ms (all brains together; ${((mean(cpuMs) / c.nodes) * 1000).toFixed(1)} us per node)`);
      // the simulated nodes share this machine's CPUs with the brains: what they take is not the brains'
      console.log(`  watchers' cpu per change:     avg ${watchersCpu.toFixed(1)} ms (all ${c.procs} watcher processes together)`);
      console.log(`  brain rss:                    max ${s2.map((s) => mb(s.maxRss)).join(', ')} MB`);
    }

    // brain 0 dies: restarted (one brain) or its nodes fail over (several)
    let applied = c.changes;
    const modes: ('resume' | 'full')[] = c.restart === 'both' ? ['resume', 'full'] : c.restart === 'none' ? [] : [c.restart];
    for (const mode of modes) {
      const affected = ownNodes[0];
      const held: Record<string, string> = {};
      if (mode === 'resume') {
        const td = now();
        const d = await brains[0].digests(affected);
        affected.forEach((n, i) => (held[n] = d[i]));
        console.log(`${mode}: digests of ${affected.length} nodes (${(d[0]?.length ?? 0) * 0.75} bytes a node) computed by the brain in ${((now() - td) / 1000).toFixed(1)} s`);
      }
      children.forEach((ch) => ch.send({ type: 'held', held } satisfies ToWatcher));
      await sleep(200);
      const others = brains.slice(1);
      const before = await Promise.all(others.map((b) => b.stats()));
      resynced = 0;
      const tKill = now();
      await brains[0].kill();
      // changes while it is down (the others apply them; a restarted brain replays them)
      for (let k = 0; k < c.downChanges; k++) others.forEach((b) => b.change());
      applied += c.downChanges;
      let tFrom = tKill;
      let restarted: Brain | undefined;
      if (c.brains === 1) {
        restarted = new Brain({ port: ports[0], cluster, replay: applied });
        await restarted.serving;
        tFrom = now();
        before.push(await restarted.stats());
      }
      await until(`${mode}: ${affected.length} nodes back`, () => resynced >= affected.length, { timeoutMs: 30 * 60_000 });
      const ms = now() - tFrom;
      await sleep(200);
      const serving = restarted ? [restarted] : others;
      const after = await Promise.all(serving.map((b) => b.stats()));
      const base = before;
      const bytes = sum(after.map((s, i) => s.bytes - base[i].bytes));
      const messages = sum(after.map((s, i) => s.messages - base[i].messages));
      const cpu = sum(after.map((s, i) => s.cpuMs - base[i].cpuMs));
      const fullBytes = (initBytes / c.nodes) * affected.length;
      console.log(
        `${mode}: ${c.brains === 1 ? 'brain restarted' : 'brain killed'}, ${c.downChanges} changes while down; ${affected.length} nodes ${c.brains === 1 ? 'back' : 'failed over'} in ${(ms / 1000).toFixed(2)} s` +
          ` (from ${c.brains === 1 ? 'the new brain serving' : 'the kill'}); sent ${messages} messages, ${(bytes / 1024).toFixed(0)} KiB = ${((100 * bytes) / fullBytes).toFixed(2)} % of their full states;` +
          ` brain cpu ${(cpu / 1000).toFixed(1)} s`,
      );
      if (restarted) brains = [restarted];
      else break; // the killed brain's nodes now follow others: one failover per run
    }
  } finally {
    for (const ch of children) ch.kill('SIGKILL');
    await Promise.all(brains.map((b) => b.kill()));
  }
}
