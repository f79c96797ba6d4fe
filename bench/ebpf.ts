// to-ebpf against to-nft and to-iptables (iptables-legacy: iptables-nft-restore
// does not take a 30k load here), side by side in one
// run, at 1k and 30k Services x 5 endpoints, each backend and size in its own
// network namespace (real kernel; to-ebpf's programs on a cgroup of the
// benchmark's own, pinned in a bpffs mount of its own):
//   npm run bench -- ebpf [--sizes 1000,30000] [--changes 300] [--connections 2000] [--rate-ms 2000]
// Reports: one endpoint change from the store to the kernel (p50/p99, to-ebpf
// and to-nft); first-connection latency through a ClusterIP (connect() to
// established, from a Node client, and the blocking connect() system call
// alone, from a Python one: the kernel's part); short-connection rate (connect, one request, answer, close)
// through a ClusterIP. Changes alternate between backends and sizes, and so
// do the connection rounds, so the machine's noise hits them alike.
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import { pino } from 'pino';
import type { DecoderHandler } from '../src/diff/decoder.js';
import { NftProxier } from '../src/backends/nft/proxier.js';
import { IptablesProxier } from '../src/backends/iptables/proxier.js';
import { EbpfProxier } from '../src/backends/ebpf/proxier.js';
import { Datapath } from '../src/backends/ebpf/datapath.js';
import { defaultConfig } from '../src/backends/shared/config.js';
import { LabCgroup } from '../src/lab/cgroup.js';
import { BenchNamespaces, ENDPOINT, arg, coldSync, pct, prepareNamespace, rssMiB, serveAsChild, probedCluster, vip } from './_scale.js';

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
const { host, ms, conc, endpoint } = JSON.parse(process.argv[1]);
const one = () => new Promise((resolve, reject) => {
  const c = net.connect({ host, port: 80 }, () => c.write('x\\n'));
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

export default async function (args: string[]) {
  if (await serveAsChild(child)) return;
  const sizes = arg(args, 'sizes', '1000,30000').split(',').map(Number);
  const changes = Number(arg(args, 'changes', '300'));
  const connections = Number(arg(args, 'connections', '2000'));
  const rateMs = Number(arg(args, 'rate-ms', '2000'));
  const spaces = new BenchNamespaces('ebpf', 'kpng-bench-ebpf');
  const cgroups: LabCgroup[] = [];
  type Run = { backend: Backend; services: number; ns: string; cgroup?: string; cold?: { computeMs: number; applyMs: number }; change: number[]; apply: number[]; lat: number[]; sys: number[]; rate: number[]; rss?: number };
  const runs: Run[] = [];
  try {
    for (const services of sizes) {
      for (const backend of BACKENDS) {
        const ns = spaces.add();
        let params: Params = { backend, services };
        if (backend === 'ebpf') {
          const cg = LabCgroup.create('bench');
          cgroups.push(cg);
          params = { ...params, cgroup: cg.path, bpffs: join(cg.bpffs, 'kpng') };
        }
        runs.push({ backend, services, ns, cgroup: params.cgroup, change: [], apply: [], lat: [], sys: [], rate: [] });
        void params;
        (runs.at(-1) as Run & { params?: Params }).params = params;
      }
    }
    const children = runs.map((r) => spaces.keep(r.ns, (r as Run & { params: Params }).params, `${r.backend} ${r.services}`));
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
    for (let round = 0; round < rounds; round++) {
      for (const r of runs) {
        const [us] = await spaces.probe(r.ns, [vip(0)], { n: Math.ceil(connections / rounds), warmup: 50, close: 'destroy', cgroup: r.cgroup }, `${r.backend} ${r.services}`);
        r.lat.push(...us);
        r.sys.push(...(await spaces.connectProbe(r.ns, vip(0), { n: Math.ceil(connections / rounds), warmup: 50, cgroup: r.cgroup }, `${r.backend} ${r.services}`)));
        r.rate.push(await spaces.script<number>(r.ns, RATE, { host: vip(0), ms: rateMs / rounds, conc: 4, endpoint: ENDPOINT }, `rate ${r.backend} ${r.services}`, r.cgroup));
      }
    }
  } finally {
    spaces.close();
    for (const cg of cgroups) cg.close();
  }
  const f = (x: number) => x.toFixed(x < 10 ? 2 : 0);
  const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
  console.log(`ebpf benchmark: services x 5 endpoints, each backend and size in a fresh network namespace; ${changes} changes; ${connections} first connections; short connections ${rateMs} ms x 4 at once; node ${process.version}, kernel ${execFileSync('uname', ['-r'], { encoding: 'utf8' }).trim()}, ${execFileSync('nft', ['--version'], { encoding: 'utf8' }).trim()}`);
  console.log('backend | services | cold sync (compute + apply) | one endpoint change p50 / p99 (the sync alone: p50 / p99) | first connection p50 / p99 | vs to-nft (p50) | connect() alone p50 / p99 | vs to-nft (p50) | short connections/s | vs to-nft | RSS');
  for (const r of runs) {
    const nft = runs.find((x) => x.backend === 'nft' && x.services === r.services)!;
    const p50 = pct(r.lat, 50);
    console.log(
      `to-${r.backend} | ${r.services} | ${f(r.cold!.computeMs)} + ${f(r.cold!.applyMs)} ms | ${r.change.length ? `${f(pct(r.change, 50))} / ${f(pct(r.change, 99))} ms (${f(pct(r.apply, 50))} / ${f(pct(r.apply, 99))})` : '-'} | ${p50.toFixed(0)} / ${pct(r.lat, 99).toFixed(0)} us | ${(p50 / pct(nft.lat, 50)).toFixed(2)}x | ${pct(r.sys, 50).toFixed(1)} / ${pct(r.sys, 99).toFixed(1)} us | ${(pct(r.sys, 50) / pct(nft.sys, 50)).toFixed(2)}x | ${mean(r.rate).toFixed(0)} | ${(mean(r.rate) / mean(nft.rate)).toFixed(2)}x | ${r.rss!.toFixed(0)} MiB`,
    );
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
