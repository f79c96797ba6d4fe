// to-ebpf against to-nft and to-iptables (iptables-legacy: iptables-nft-restore
// does not take a 30k load here), side by side in one
// run, at 1k and 30k Services x 5 endpoints, each backend and size in its own
// network namespace (real kernel; to-ebpf's programs on a cgroup of the
// benchmark's own, pinned in a bpffs mount of its own):
//   npm run bench -- ebpf [--sizes 1000,30000] [--changes 300] [--connections 2000] [--rate-ms 2000] [--plot DIR]
// Reports: one endpoint change from the store to the kernel (p50/p99, to-ebpf
// and to-nft); through a ClusterIP, from two clients: a Node one, and a
// compiled one (bench/probe.c, which adds almost nothing of its own): the
// first connection (connect() to established; connect + one request
// answered) and the short-connection rate (connect, one request, answer,
// close); and the floor beside them: the same probes straight to the
// endpoint's IP in a namespace with no proxy at all. Changes alternate
// between backends and sizes, and so do the connection rounds, so the
// machine's noise hits them alike. --plot DIR draws ebpf-connect.svg: what
// a first connection costs through each backend and with no proxy (p50).
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { NftProxier } from '../src/backends/nft/proxier.js';
import { IptablesProxier } from '../src/backends/iptables/proxier.js';
import { EbpfProxier } from '../src/backends/ebpf/proxier.js';
import { Datapath } from '../src/backends/ebpf/datapath.js';
import { LabCgroup } from '../src/lab/cgroup.js';
import { BenchNamespaces, CLIENT, ENDPOINT, benchConfig, benchLog, changesInTurn, prepareNamespace, proxierChild, serveAsChild, probedCluster, vip, type ProxierCold, type ProxierUnderTest } from './_scale.js';
import { mean, num, nums, pct, plotDir, writePlot } from './_harness.js';

type Backend = 'ebpf' | 'nft' | 'iptables';
const BACKENDS: Backend[] = ['ebpf', 'nft', 'iptables'];

interface Params {
  backend: Backend;
  services: number;
  cgroup?: string;
  bpffs?: string;
}

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
  const sizes = nums(args, 'sizes', '1000,30000');
  const changes = num(args, 'changes', 300);
  const connections = num(args, 'connections', 2000);
  const rateMs = num(args, 'rate-ms', 2000);
  const spaces = new BenchNamespaces('ebpf', 'kpng-bench-ebpf');
  const cgroups: LabCgroup[] = [];
  type Run = { backend: Backend; services: number; ns: string; cgroup?: string; params: Params; cold?: ProxierCold; change: number[]; apply: number[]; probed: Probed; rss?: number };
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
      runs[i].cold = await c.ask<ProxierCold>({ op: 'cold' });
      console.error(`${runs[i].backend} ${runs[i].services}: programmed (${runs[i].cold!.coldApplyMs.toFixed(0)} ms)`);
    }
    // one change at a time, in turn (to-iptables is not asked: the comparison is to-ebpf's against to-nft's)
    const changing = runs.flatMap((r, j) => (r.backend === 'iptables' ? [] : [j]));
    const changed = await changesInTurn(changing.map((j) => children[j]), changes);
    changing.forEach((j, k) => ((runs[j].change = changed[k].ms), (runs[j].apply = changed[k].syncMs)));
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
    console.log(`to-${r.backend} | ${r.services} | ${f(r.cold!.coldComputeMs)} + ${f(r.cold!.coldApplyMs)} ms | ${change} | ${connectionColumns(r.probed, nft.probed)} | ${r.rss!.toFixed(0)} MiB`);
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
  const plots = plotDir(args);
  if (!plots) return;
  const rows = [...runs.map((r) => ({ name: `to-${r.backend}`, services: r.services, probed: r.probed })), ...sizes.map((services) => ({ name: 'no proxy', services, probed: direct.probed }))];
  await writePlot(plots, {
    name: 'ebpf-connect',
    title: "A first connection through a ClusterIP, compiled client (p50): connect() and connect + one request answered",
    subtitle: `Services x 5 endpoints; ${connections} connections per client, one at a time, from a pod address; "no proxy": straight to the endpoint's IP`,
    x: { title: 'backend' },
    y: { title: 'µs' },
    series: 'Services, measure',
    mark: 'bar',
    points: rows.flatMap((r) => [
      { series: `${r.services}: connect()`, x: r.name, y: pct(r.probed.connect, 50) },
      { series: `${r.services}: + answer`, x: r.name, y: pct(r.probed.answer, 50) },
    ]),
  });
}

/** in the namespace: one backend's proxier and its cluster, asked one step at a time */
async function child(p: Params) {
  prepareNamespace();
  const config = benchConfig();
  const log = benchLog();
  let datapath: Datapath | undefined;
  const proxier: ProxierUnderTest =
    p.backend === 'ebpf'
      ? new EbpfProxier({ nodeName: 'node-0', config, log, once: true, healthChecks: false, maps: () => (datapath ??= Datapath.open({ bpffs: p.bpffs!, cgroupPath: p.cgroup!, maxServicePorts: 65536, maxEndpoints: 262144, log })).maps })
      : p.backend === 'nft'
        ? new NftProxier({ nodeName: 'node-0', config, log, once: true, session: true, healthChecks: false })
        : new IptablesProxier({ nodeName: 'node-0', config, log, once: true, healthChecks: false, families: [4], mode: 'legacy' });
  return proxierChild(proxier, probedCluster(p.services), { closed: () => datapath?.close() });
}
