// npm run bench -- daemonset [--nodes 100] [--services 500] [--endpoints 5] [--changes 50] [--procs 2]
//
// The "DaemonSet problem", measured: the test API server (this process, TLS
// on 127.0.0.1) with a cluster and a churn of EndpointSlice updates (one
// endpoint of one Service gets a new IP at a time: a pod restarted), and
//
// - kube-proxy's way: N node watchers that each list+watch every Service and
//   EndpointSlice from the API server (as each node's kube-proxy does; raw
//   HTTPS watches in --procs processes, counting what they receive);
// - kpng's way: one brain process (`kpng kube --kubeconfig ... to-api`)
//   watching the API server, serving N node watchers (raw gRPC localv1
//   watches, as `kpng local` does, in --procs processes).
//
// Per endpoint change: the events and bytes the API server sent to its
// watches (its JSON lines: the test server speaks JSON; kube-proxy asks for
// protobuf, about half the bytes), and the messages and bytes the brain sent
// to the nodes (gRPC messages with their 5-byte framing); the time from the
// change to the last node having it.
import { spawn, type ChildProcess } from 'node:child_process';
import https from 'node:https';
import { connect, type ClientHttp2Session } from 'node:http2';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { TestApiServer, certKubeconfig, RESOURCES } from '../test/helpers/apiserver.js';
import { nodeObject, serviceObject, sliceObject, type Pod } from '../test/helpers/kube-cluster.js';
import { freePort } from '../test/helpers/port.js';
import { watchRequest } from './_scale.js';
import { ROOT, forkSelf, forkedJob, now, options, pct, sleep, until } from './_harness.js';

const TOKEN = 'kpng-bench';
const nodeName = (i: number) => `node-${String(i).padStart(4, '0')}`;

// --- watcher processes: report what they received, every few ms

type WatcherJob = { mode: 'kube'; url: string; count: number } | { mode: 'kpng'; port: number; nodes: string[] };
interface Received {
  /** kube: watch events (lines); kpng: Syncs */
  events: number;
  bytes: number;
  /** when the last of them arrived (CLOCK_MONOTONIC ms) */
  at: number;
}

function watcherMain(job: WatcherJob) {
  const got: Received = { events: 0, bytes: 0, at: 0 };
  let dirty = false;
  setInterval(() => dirty && ((dirty = false), process.send!(got)), 10);
  const note = (events: number, bytes: number) => {
    got.events += events;
    got.bytes += bytes;
    if (events) got.at = now();
    dirty = true;
  };
  if (job.mode === 'kube') {
    // each node's kube-proxy: a watch of every Service and every EndpointSlice (the initial state as ADDED events)
    const agent = new https.Agent({ keepAlive: true, maxSockets: Infinity });
    for (let i = 0; i < job.count; i++) {
      for (const r of [RESOURCES.services, RESOURCES.endpointslices]) {
        https.get(`${job.url}${r.path}?watch=true`, { agent, headers: { authorization: `Bearer ${TOKEN}` }, rejectUnauthorized: false }, (res) => {
          res.on('data', (d: Buffer) => {
            let lines = 0;
            for (let k = d.indexOf(10); k >= 0; k = d.indexOf(10, k + 1)) lines++;
            note(lines, d.length);
          });
        });
      }
    }
  } else {
    const sessions: ClientHttp2Session[] = [];
    for (const node of job.nodes) {
      const session = connect(`http://127.0.0.1:${job.port}`);
      sessions.push(session);
      const stream = session.request({ ':method': 'POST', ':path': '/localv1.Sets/Watch', 'content-type': 'application/grpc', te: 'trailers' }, { endStream: false });
      const req = watchRequest(node);
      stream.write(req);
      let buf: Buffer = Buffer.alloc(0);
      stream.on('data', (d: Buffer) => {
        buf = buf.length ? Buffer.concat([buf, d]) : d;
        let off = 0;
        let syncs = 0;
        while (buf.length - off >= 5) {
          const len = buf.readUInt32BE(off + 1);
          if (buf.length - off < 5 + len) break;
          if (len === 2 && buf[off + 5] === 0x0a && buf[off + 6] === 0x00) (syncs++, stream.write(req));
          off += 5 + len;
        }
        note(syncs, off);
        buf = off === buf.length ? Buffer.alloc(0) : buf.subarray(off);
      });
    }
  }
  process.on('disconnect', () => process.exit(0));
}

const watcherJob = forkedJob<WatcherJob>('KPNG_BENCH_DS');
if (watcherJob) watcherMain(watcherJob);

// --- the run

class Watchers {
  readonly children: ChildProcess[] = [];
  private readonly got: Received[] = [];
  constructor(jobs: WatcherJob[]) {
    jobs.forEach((job, i) => {
      this.got.push({ events: 0, bytes: 0, at: 0 });
      const child = forkSelf(import.meta.url, 'KPNG_BENCH_DS', job);
      child.on('message', (m: Received) => (this.got[i] = m));
      this.children.push(child);
    });
  }
  get total(): Received {
    return this.got.reduce((a, g) => ({ events: a.events + g.events, bytes: a.bytes + g.bytes, at: Math.max(a.at, g.at) }), { events: 0, bytes: 0, at: 0 });
  }
  until(what: string, events: number, ms: number): Promise<void> {
    return until(() => `${what}: ${this.total.events} of ${events} events`, () => this.total.events >= events, { timeoutMs: ms });
  }
  kill() {
    for (const ch of this.children) ch.kill('SIGKILL');
  }
}

export default async function main(args: string[]) {
  const c = options(args, { nodes: 100, services: 500, endpoints: 5, changes: 50, procs: 2 });
  const api = await new TestApiServer({ tokens: [TOKEN] }).start();
  const dir = mkdtempSync(join(tmpdir(), 'kpng-bench-ds-'));
  const kubeconfig = certKubeconfig(join(dir, 'kubeconfig'), api.url);
  // the cluster: S Services of E endpoints each, pods spread over the nodes
  const pods: Pod[][] = [];
  let ipSeq = 1 << 16;
  const podIP = () => `10.${(ipSeq >> 16) & 255}.${(ipSeq >> 8) & 255}.${ipSeq++ & 255}`;
  for (let i = 0; i < c.nodes; i++) api.put(nodeObject(nodeName(i), i));
  for (let s = 0; s < c.services; s++) {
    const ns = `ns-${s % 20}`;
    pods.push(Array.from({ length: c.endpoints }, (_, j) => ({ name: `svc-${s}-${j}`, ip: podIP(), node: nodeName((s * c.endpoints + j) % c.nodes), ready: true })));
    api.put(serviceObject(ns, `svc-${s}`, `10.96.${(s >> 8) & 255}.${s & 255}`));
    api.put(sliceObject(ns, `svc-${s}-1`, `svc-${s}`, pods[s]));
  }
  let seed = 7;
  const rand = () => ((seed = (seed * 1103515245 + 12345) & 0x7fffffff), seed / 0x80000000);
  /** one endpoint of a random Service gets a new IP (its pod restarted) */
  const change = () => {
    const s = Math.floor(rand() * c.services);
    const p = pods[s][Math.floor(rand() * c.endpoints)];
    p.ip = podIP();
    api.put(sliceObject(`ns-${s % 20}`, `svc-${s}-1`, `svc-${s}`, pods[s]));
  };
  const perProc = Math.ceil(c.nodes / c.procs);
  const split = <T>(xs: T[]) => Array.from({ length: c.procs }, (_, p) => xs.slice(p * perProc, (p + 1) * perProc));
  const names = Array.from({ length: c.nodes }, (_, i) => nodeName(i));
  const results: Record<string, { apiEvents: number; apiBytes: number; nodeEvents: number; nodeBytes: number; lastMs: number[]; initS: number }> = {};

  const churn = async (w: Watchers, perChange: number) => {
    const a0 = { ...api.watchStats };
    const n0 = w.total;
    const lastMs: number[] = [];
    for (let k = 0; k < c.changes; k++) {
      const before = w.total.events;
      const tc = now();
      change();
      await w.until(`change ${k}`, before + perChange, 60_000);
      lastMs.push(w.total.at - tc);
      await sleep(10);
    }
    await sleep(100);
    const n1 = w.total;
    return {
      apiEvents: (api.watchStats.events - a0.events) / c.changes,
      apiBytes: (api.watchStats.bytes - a0.bytes) / c.changes,
      nodeEvents: (n1.events - n0.events) / c.changes,
      nodeBytes: (n1.bytes - n0.bytes) / c.changes,
      lastMs,
    };
  };

  let brain: ChildProcess | undefined;
  let w: Watchers | undefined;
  try {
    // kube-proxy's way
    let t0 = now();
    w = new Watchers(split(names).map((ns) => ({ mode: 'kube', url: api.url, count: ns.length })));
    await w.until('initial lists', c.nodes * 2 * c.services, 30 * 60_000);
    const kubeInit = (now() - t0) / 1000;
    const kube = await churn(w, c.nodes);
    results['kube-proxy on every node'] = { ...kube, initS: kubeInit };
    w.kill();
    w = undefined;
    await sleep(500);

    // kpng's way
    const port = await freePort();
    t0 = now();
    brain = spawn(process.execPath, [join(ROOT, 'bin/kpng.js'), 'kube', '--kubeconfig', kubeconfig, 'to-api', '--listen', `tcp://127.0.0.1:${port}`, '--metrics-bind-address', '', '--state-socket', 'none'], {
      cwd: ROOT,
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let err = '';
    brain.stderr!.on('data', (d) => (err += d));
    const started = () => {
      if (brain!.exitCode !== null) throw new Error(`the brain exited:\n${err.slice(-2000)}`);
      return err.includes('to-api: serving');
    };
    await until(() => `the brain did not start:\n${err.slice(-2000)}`, started, { timeoutMs: 120_000, everyMs: 20 });
    w = new Watchers(split(names).map((ns) => ({ mode: 'kpng', port, nodes: ns })));
    await w.until('initial syncs', c.nodes, 30 * 60_000);
    const kpngInit = (now() - t0) / 1000;
    const kpng = await churn(w, c.nodes);
    results['kpng: one brain, kpng local on every node'] = { ...kpng, initS: kpngInit };
  } finally {
    w?.kill();
    brain?.kill('SIGKILL');
    await api.close();
    rmSync(dir, { recursive: true, force: true });
  }

  console.log(`${c.nodes} nodes, ${c.services} services x ${c.endpoints} endpoints; ${c.changes} endpoint changes (one endpoint of one EndpointSlice gets a new IP), every node sees every Service`);
  console.log('per endpoint change:                         API server -> watches        to the nodes                change -> last node (p50/p99)   initial state');
  for (const [name, r] of Object.entries(results)) {
    const toNodes = name.startsWith('kube') ? `${r.apiEvents.toFixed(0)} events, ${(r.apiBytes / 1024).toFixed(1)} KiB` : `${r.nodeEvents.toFixed(0)} diffs, ${(r.nodeBytes / 1024).toFixed(1)} KiB`;
    console.log(
      `  ${name.padEnd(42)} ${`${r.apiEvents.toFixed(1)} events, ${(r.apiBytes / 1024).toFixed(1)} KiB`.padEnd(28)} ${toNodes.padEnd(27)} ${pct(r.lastMs, 50).toFixed(0)} / ${pct(r.lastMs, 99).toFixed(0)} ms`.padEnd(130) + ` ${r.initS.toFixed(1)} s`,
    );
  }
  const k = results['kube-proxy on every node'];
  const p = results['kpng: one brain, kpng local on every node'];
  console.log(`ratio: the API server sends ${(k.apiBytes / p.apiBytes).toFixed(0)}x fewer bytes (${(k.apiEvents / p.apiEvents).toFixed(0)}x fewer events) with kpng; the nodes get ${(k.apiBytes / p.nodeBytes).toFixed(1)}x fewer bytes from the brain than kube-proxies from the API server`);
}
