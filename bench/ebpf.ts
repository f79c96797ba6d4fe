// to-ebpf against to-nft and to-iptables (iptables-legacy: iptables-nft-restore
// does not take a 30k load here), side by side in one
// run, at 1k and 30k Services x 5 endpoints, each backend and size in its own
// network namespace (real kernel; to-ebpf's programs on a cgroup of the
// benchmark's own, pinned in a bpffs mount of its own):
//   npm run bench -- ebpf [--sizes 1000,30000] [--changes 300] [--connections 2000] [--rate-ms 2000]
// Reports: one endpoint change from the store to the kernel (p50/p99, to-ebpf
// and to-nft); through a ClusterIP, from two clients: a Node one, and a
// compiled one (bench/probe.c, which adds almost nothing of its own): the
// first connection (connect() to established; connect + one request
// answered) and the short-connection rate (connect, one request, answer,
// close); and the floor beside them: the same probes straight to the
// endpoint's IP in a namespace with no proxy at all. Changes alternate
// between backends and sizes, and so do the connection rounds, so the
// machine's noise hits them alike.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pino } from 'pino';
import type { DecoderHandler } from '../src/diff/decoder.js';
import { NftProxier } from '../src/backends/nft/proxier.js';
import { IptablesProxier } from '../src/backends/iptables/proxier.js';
import { EbpfProxier } from '../src/backends/ebpf/proxier.js';
import { Datapath } from '../src/backends/ebpf/datapath.js';
import { defaultConfig } from '../src/backends/shared/config.js';
import { LabCgroup } from '../src/lab/cgroup.js';
import { BenchNamespaces, CLIENT, ENDPOINT, arg, coldSync, pct, prepareNamespace, rssMiB, serveAsChild, probedCluster, vip } from './_scale.js';

type Backend = 'ebpf' | 'nft' | 'iptables';
const BACKENDS: Backend[] = ['ebpf', 'nft', 'iptables'];

interface Params {
  backend: Backend;
  services: number;
  cgroup?: string;
  bpffs?: string;
}

type Request = { op: 'cold' } | { op: 'change'; i: number } | { op: 'finish' };

/** connect, send one line, read the answer, close; as many as it can in ms with `conc` at once; connections per second */
const RATE = `
const net = require('node:net');
const { host, port, ms, conc, endpoint, from } = JSON.parse(process.argv[1]);
const one = () => new Promise((resolve, reject) => {
  const c = net.connect({ host, port, localAddress: from }, () => c.write('x\\n'));
  c.once('data', () => { c.destroy(); resolve(); });
  c.on('error', reject);
});
const srv = net.createServer((s) => { s.on('error', () => {}); s.once('data', () => s.end('ok\\n')); }).listen(8080, endpoint, async () => {
  for (let i = 0; i < 200; i++) await one();
  let n = 0;
  const end = Date.now() + ms;
  const t0 = process.hrtime.bigint();
  const worker = async () => { while (Date.now() < end) { await one(); n++; } };
  await Promise.all(Array.from({ length: conc }, worker));
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  console.log(JSON.stringify(n / secs));
  srv.close();
});
`;

/** what the connection probes measured through one namespace's dataplane (microseconds; connections per second) */
interface Probed {
  /** first connection, Node client: connect() to established */
  node: number[];
  /** first connection, compiled client: connect() alone, and to the answer of one request */
  connect: number[];
  answer: number[];
  /** short connections per second, Node client and compiled client (one value per round) */
  nodeRate: number[];
  cRate: number[];
}
const probed = (): Probed => ({ node: [], connect: [], answer: [], nodeRate: [], cRate: [] });

/** compiles bench/probe.c (the C compiler to-ebpf's programs need is there) */
function compileProbe(): { bin: string; dir: string } {
  const dir = mkdtempSync(join(tmpdir(), 'kpng-bench-probe-'));
  const bin = join(dir, 'probe');
  execFileSync('cc', ['-O2', '-pthread', '-o', bin, join(new URL('.', import.meta.url).pathname, 'probe.c')]);
  return { bin, dir };
}

export default async function (args: string[]) {
  if (await serveAsChild(child)) return;
  const sizes = arg(args, 'sizes', '1000,30000').split(',').map(Number);
  const changes = Number(arg(args, 'changes', '300'));
  const connections = Number(arg(args, 'connections', '2000'));
  const rateMs = Number(arg(args, 'rate-ms', '2000'));
  const spaces = new BenchNamespaces('ebpf', 'kpng-bench-ebpf');
  const cgroups: LabCgroup[] = [];
  type Run = { backend: Backend; services: number; ns: string; cgroup?: string; params: Params; cold?: { computeMs: number; applyMs: number }; change: number[]; apply: number[]; probed: Probed; rss?: number };
  const runs: Run[] = [];
  // the floor: no proxy, no rules, the probes connect to the endpoint itself
  const direct = { ns: '', probed: probed() };
  const probe = compileProbe();
  try {
    direct.ns = spaces.add();
    for (const a of [['link', 'set', 'lo', 'up'], ['addr', 'add', `${ENDPOINT}/32`, 'dev', 'lo'], ['addr', 'add', `${CLIENT}/32`, 'dev', 'lo']]) execFileSync('ip', ['-n', direct.ns, ...a]);
    for (const services of sizes) {
      for (const backend of BACKENDS) {
        const ns = spaces.add();
        let cgroup: string | undefined;
        let bpffs: string | undefined;
        if (backend === 'ebpf') {
          const cg = LabCgroup.create('bench');
          cgroups.push(cg);
          cgroup = cg.path;
          bpffs = join(cg.bpffs, 'kpng');
        }
        runs.push({ backend, services, ns, cgroup, params: { backend, services, cgroup, bpffs }, change: [], apply: [], probed: probed() });
      }
    }
    const children = runs.map((r) => spaces.keep(r.ns, r.params, `${r.backend} ${r.services}`));
    for (const [i, c] of children.entries()) {
      runs[i].cold = await c.ask<{ computeMs: number; applyMs: number }>({ op: 'cold' });
      console.error(`${runs[i].backend} ${runs[i].services}: programmed (${runs[i].cold!.applyMs.toFixed(0)} ms)`);
    }
    // one change at a time, in turn (to-iptables is not asked: the issue compares to-ebpf and to-nft)
    for (let i = 0; i < changes; i++) {
      for (const [j, c] of children.entries()) {
        if (runs[j].backend === 'iptables') continue;
        const [total, apply] = await c.ask<[number, number]>({ op: 'change', i });
        runs[j].change.push(total);
        runs[j].apply.push(apply);
      }
    }
    for (const [j, c] of children.entries()) {
      runs[j].rss = await c.ask<number>({ op: 'finish' });
      await c.end();
    }
    // connections: the dataplane stays in each namespace after its child exited
    const rounds = 5;
    const n = Math.ceil(connections / rounds);
    const measure = async (into: Probed, ns: string, host: string, port: number, what: string, cgroup?: string) => {
      const [us] = await spaces.probe(ns, [host], { n, warmup: 50, port, close: 'destroy', cgroup, from: CLIENT }, what);
      into.node.push(...us);
      into.nodeRate.push(await spaces.script<number>(ns, RATE, { host, port, ms: rateMs / rounds, conc: 4, endpoint: ENDPOINT, from: CLIENT }, `rate ${what}`, cgroup));
      const c = [ENDPOINT, CLIENT, host, String(port)];
      const first = JSON.parse(await spaces.run(ns, [probe.bin, 'first', ...c, String(n), '50'], `compiled probe ${what}`, cgroup)) as { connect: number[]; answer: number[] };
      into.connect.push(...first.connect);
      into.answer.push(...first.answer);
      into.cRate.push(Number(await spaces.run(ns, [probe.bin, 'rate', ...c, String(rateMs / rounds), '4'], `compiled rate ${what}`, cgroup)));
    };
    for (let round = 0; round < rounds; round++) {
      for (const r of runs) await measure(r.probed, r.ns, vip(0), 80, `${r.backend} ${r.services}`, r.cgroup);
      await measure(direct.probed, direct.ns, ENDPOINT, 8080, 'no proxy');
    }
  } finally {
    spaces.close();
    for (const cg of cgroups) cg.close();
    rmSync(probe.dir, { recursive: true, force: true });
  }
  const f = (x: number) => x.toFixed(x < 10 ? 2 : 0);
  const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
  const us = (xs: number[]) => `${pct(xs, 50).toFixed(1)} / ${pct(xs, 99).toFixed(1)} us`;
  const vs = (a: number, b: number) => `${(a / b).toFixed(2)}x`;
  /** the connection columns of one row, against to-nft's of the same size */
  const connectionColumns = (p: Probed, nft: Probed) =>
    [
      `${us(p.node)} | ${vs(pct(p.node, 50), pct(nft.node, 50))}`,
      `${us(p.connect)} | ${vs(pct(p.connect, 50), pct(nft.connect, 50))}`,
      `${us(p.answer)} | ${vs(pct(p.answer, 50), pct(nft.answer, 50))}`,
      `${mean(p.nodeRate).toFixed(0)} | ${vs(mean(p.nodeRate), mean(nft.nodeRate))}`,
      `${mean(p.cRate).toFixed(0)} | ${vs(mean(p.cRate), mean(nft.cRate))}`,
    ].join(' | ');
  console.log(`ebpf benchmark: services x 5 endpoints, each backend and size in a fresh network namespace; ${changes} changes; ${connections} first connections per client; short connections ${rateMs} ms x 4 at once per client; node ${process.version}, kernel ${execFileSync('uname', ['-r'], { encoding: 'utf8' }).trim()}, ${execFileSync('nft', ['--version'], { encoding: 'utf8' }).trim()}`);
  console.log(
    'backend | services | cold sync (compute + apply) | one endpoint change p50 / p99 (the sync alone: p50 / p99) | first connection, Node client p50 / p99 | vs to-nft | compiled client: connect() p50 / p99 | vs to-nft | connect + one request answered p50 / p99 | vs to-nft | short connections/s, Node client | vs to-nft | compiled client | vs to-nft | RSS',
  );
  for (const r of runs) {
    const nft = runs.find((x) => x.backend === 'nft' && x.services === r.services)!;
    const change = r.change.length ? `${f(pct(r.change, 50))} / ${f(pct(r.change, 99))} ms (${f(pct(r.apply, 50))} / ${f(pct(r.apply, 99))})` : '-';
    console.log(`to-${r.backend} | ${r.services} | ${f(r.cold!.computeMs)} + ${f(r.cold!.applyMs)} ms | ${change} | ${connectionColumns(r.probed, nft.probed)} | ${r.rss!.toFixed(0)} MiB`);
  }
  // the floor, against each size's to-nft
  for (const services of sizes) {
    const nft = runs.find((x) => x.backend === 'nft' && x.services === services)!;
    console.log(`no proxy (the endpoint's IP) | ${services} | - | - | ${connectionColumns(direct.probed, nft.probed)} | -`);
  }
  // what each backend adds to a first connection: its p50 minus the no-proxy namespace's (rules, conntrack and translation all count)
  console.log('backend | services | added to a first connection above no proxy (p50 minus p50): Node client | compiled client connect() | connect + answer');
  for (const r of runs) {
    const above = (xs: number[], floor: number[]) => `${(pct(xs, 50) - pct(floor, 50)).toFixed(1)} us`;
    console.log(`to-${r.backend} | ${r.services} | ${above(r.probed.node, direct.probed.node)} | ${above(r.probed.connect, direct.probed.connect)} | ${above(r.probed.answer, direct.probed.answer)}`);
  }
}

/** in the namespace: one backend's proxier and its cluster, asked one step at a time */
async function child(p: Params) {
  prepareNamespace();
  const config = defaultConfig();
  config.clusterCIDRs = ['10.0.0.0/8'];
  config.nftables.minSyncPeriodMs = 0; // measure each change alone
  config.iptables.minSyncPeriodMs = 0;
  const log = pino({ level: 'warn' });
  let datapath: Datapath | undefined;
  const proxier: DecoderHandler & { close(): Promise<void> } =
    p.backend === 'ebpf'
      ? new EbpfProxier({ nodeName: 'node-0', config, log, once: true, healthChecks: false, maps: () => (datapath ??= Datapath.open({ bpffs: p.bpffs!, cgroupPath: p.cgroup!, maxServicePorts: 65536, maxEndpoints: 262144, log })).maps })
      : p.backend === 'nft'
        ? new NftProxier({ nodeName: 'node-0', config, log, once: true, session: true, healthChecks: false })
        : new IptablesProxier({ nodeName: 'node-0', config, log, once: true, healthChecks: false, families: [4], mode: 'legacy' });
  const cluster = probedCluster(p.services);
  let change: ((i: number) => Promise<number>) | undefined;
  return async (r: Request): Promise<unknown> => {
    switch (r.op) {
      case 'cold': {
        const cold = await coldSync(cluster, proxier);
        change = cold.change;
        return { computeMs: cold.coldComputeMs, applyMs: cold.coldApplyMs };
      }
      case 'change':
        return [await change!(r.i), (proxier as { stats?: { lastSyncMs: number } }).stats?.lastSyncMs ?? 0];
      case 'finish':
        await proxier.close();
        datapath?.close();
        return rssMiB();
    }
  };
}
