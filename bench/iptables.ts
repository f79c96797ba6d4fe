// iptables vs nftables at scale, side by side in one run: to-iptables (with
// iptables-nft and iptables-legacy) and to-nft, for 1k / 10k / 30k Services x
// 5 endpoints, each backend and size in its own network namespace (real
// tools, real kernel):
//   npm run bench -- iptables [--sizes 1000,10000,30000] [--changes 20] [--connections 2000]
//                             [--backends nft,iptables-nft,iptables-legacy] [--runs 1] [--iptables-nft-max 10000]
//                             [--plot DIR]
// For each size, one child per backend stays alive: their cold syncs, then
// the endpoint changes in turn (backend 1, backend 2, ..., backend 1, ...),
// then the first-connection probes alternating between backends in rounds,
// so the machine's noise hits every backend alike. Reports, per size, the
// absolute numbers and, next to them, each iptables mode's ratio to nft
// (what the README quotes): cold sync; one endpoint change from the store
// seeing it to the kernel having it (p50/p99); first-connection latency
// through a ClusterIP whose rule is first in KUBE-SERVICES and one whose rule
// is last, measured by a small separate process (the big one's GC pauses
// would pollute p99).
// --plot DIR draws iptables-change.svg (one endpoint change, p50, against
// the number of Services, per backend) and iptables-cold.svg (the cold sync).
// iptables-nft runs up to --iptables-nft-max Services: its cold restore grows
// faster than linearly (about 40 s at 10k here, not done after 10 min at 30k).
import { spawnSync } from 'node:child_process';
import { NftProxier } from '../src/backends/nft/proxier.js';
import { IptablesProxier } from '../src/backends/iptables/proxier.js';
import { BenchNamespaces, benchConfig, benchLog, changesInTurn, prepareNamespace, proxierChild, serveAsChild, syntheticCluster, type ProxierCold, type ProxierUnderTest } from './_scale.js';
import { arg, median, num, nums, pct, plotDir, writePlot, type Point } from './_harness.js';

type Backend = 'nft' | 'iptables-nft' | 'iptables-legacy';

interface Measured {
  coldComputeMs: number;
  coldApplyMs: number;
  changeMs: number[];
  rssMiB: number;
  /** microseconds */
  first: number[];
  last: number[];
}

// probe Services: their KUBE-SERVICES rules sort first ("aaa/...") and last ("zzz/...")
const PROBE_FIRST = '172.31.255.1';
const PROBE_LAST = '172.31.255.2';

export default async function (args: string[]) {
  if (await serveAsChild(child)) return;
  const sizes = nums(args, 'sizes', '1000,10000,30000');
  const changes = num(args, 'changes', 20);
  const connections = num(args, 'connections', 2000);
  const runs = num(args, 'runs', 1);
  const backends = arg(args, 'backends', 'nft,iptables-nft,iptables-legacy').split(',') as Backend[];
  const nftModeMax = num(args, 'iptables-nft-max', 10000);
  /** "size backend" -> one Measured per run */
  const results = new Map<string, Measured[]>();

  const spaces = new BenchNamespaces('iptables', 'kpng-bench-ipt');
  try {
    for (let run = 0; run < runs; run++) {
      for (const services of sizes) {
        const here = backends.filter((b) => !(b === 'iptables-nft' && services > nftModeMax));
        const kept = here.map((backend) => {
          const ns = spaces.add();
          return { backend, ns, c: spaces.keep(ns, { backend, services }, `${backend} ${services}`), m: { changeMs: [], first: [], last: [] } as unknown as Measured };
        });
        try {
          for (const k of kept) Object.assign(k.m, await k.c.ask<ProxierCold>({ op: 'cold' }));
          // one change at a time, in turn
          const changed = await changesInTurn(kept.map((k) => k.c), changes);
          kept.forEach((k, i) => (k.m.changeMs = changed[i].ms));
          for (const k of kept) {
            k.m.rssMiB = await k.c.ask<number>({ op: 'finish' });
            await k.c.end();
          }
          // the rules stay in each namespace: probes alternate between backends in rounds
          const rounds = 10;
          for (let round = 0; round < rounds; round++) {
            for (const k of kept) {
              const [first, last] = await spaces.probe(k.ns, [PROBE_FIRST, PROBE_LAST], { n: Math.ceil(connections / rounds), warmup: 20, close: 'destroy' }, `${k.backend} ${services}`);
              k.m.first.push(...first);
              k.m.last.push(...last);
            }
          }
          for (const k of kept) {
            const key = `${services} ${k.backend}`;
            results.set(key, [...(results.get(key) ?? []), k.m]);
          }
          console.error(`run ${run + 1}/${runs}: ${services} services done (${here.join(', ')})`);
        } finally {
          for (const k of kept) spaces.remove(k.ns);
        }
      }
    }
  } finally {
    spaces.close();
  }

  const f = (x: number) => (x < 10 ? x.toFixed(2) : x.toFixed(0));
  const us = (x: number) => x.toFixed(0);
  const x = (r: number) => `${r < 10 ? r.toFixed(1) : r.toFixed(0)}x`;
  const tools = ['nft --version', 'iptables-nft --version', 'iptables-legacy --version'].map((c) => spawnSync('sh', ['-c', c], { encoding: 'utf8' }).stdout.trim()).join(', ');
  console.log(`iptables vs nftables, side by side: services x 5 endpoints, each backend and size in its own network namespace, kept alive together; ${changes} changes each, in turn; ${runs} run(s): medians of the runs' values; node ${process.version}; ${tools}`);
  /** one number of a backend at a size: the median over runs */
  const val = (services: number, b: Backend, pick: (m: Measured) => number) => {
    const r = results.get(`${services} ${b}`);
    return r ? median(r.map(pick)) : undefined;
  };
  const cold = (m: Measured) => m.coldComputeMs + m.coldApplyMs;
  const change50 = (m: Measured) => pct(m.changeMs, 50);
  const change99 = (m: Measured) => pct(m.changeMs, 99);
  const first50 = (m: Measured) => pct(m.first, 50);
  const last50 = (m: Measured) => pct(m.last, 50);
  console.log('services | backend | cold sync | one endpoint change p50 / p99 | first connection, rule first: p50 / p99 | rule last: p50 / p99 | RSS');
  if (backends.includes('nft') && backends.length > 1) console.log("(Nx): this backend's value / nft's at the same size, measured side by side");
  for (const services of sizes) {
    for (const b of backends) {
      if (!results.has(`${services} ${b}`)) {
        if (b === 'iptables-nft' && services > nftModeMax) console.log(`${services} | ${b} | not run (more than --iptables-nft-max ${nftModeMax} Services) | | | |`);
        continue;
      }
      const v = (pick: (m: Measured) => number) => val(services, b, pick)!;
      /** the ratio to nft, next to the number it divides */
      const r = (pick: (m: Measured) => number) => {
        const n = b === 'nft' ? undefined : val(services, 'nft', pick);
        return n === undefined ? '' : ` (${x(v(pick) / n)})`;
      };
      console.log(
        `${services} | ${b} | ${f(v(cold))} ms${r(cold)} | ${f(v(change50))}${r(change50)} / ${f(v(change99))}${r(change99)} ms | ${us(v(first50))} / ${us(v((m) => pct(m.first, 99)))} us | ${us(v(last50))}${r(last50)} / ${us(v((m) => pct(m.last, 99)))} us | ${f(v((m) => m.rssMiB))} MiB`,
      );
    }
  }
  const plots = plotDir(args);
  if (!plots) return;
  const points = (pick: (m: Measured) => number): Point[] =>
    sizes.flatMap((services) => backends.flatMap((b) => (results.has(`${services} ${b}`) ? [{ series: b === 'nft' ? 'to-nft' : `to-iptables (${b})`, x: services, y: val(services, b, pick)! }] : [])));
  const subtitle = `Services x 5 endpoints, each backend in its own network namespace, side by side; ${changes} changes each`;
  await writePlot(plots, { name: 'iptables-change', title: 'One endpoint change, store to kernel (p50)', subtitle, x: { title: 'Services', log: true }, y: { title: 'ms (log scale)', log: true }, series: 'backend', mark: 'line', points: points(change50) });
  await writePlot(plots, { name: 'iptables-cold', title: 'Cold sync: every Service into an empty node', subtitle, x: { title: 'Services', log: true }, y: { title: 'ms (log scale)', log: true }, series: 'backend', mark: 'line', points: points(cold) });
}

/** in the backend's namespace: the proxier and its cluster, asked one step at a time */
async function child(p: { backend: Backend; services: number }) {
  prepareNamespace();
  const o = { nodeName: 'node-0', config: benchConfig(), log: benchLog(), once: true, healthChecks: false, families: [4] as const };
  const proxier: ProxierUnderTest =
    p.backend === 'nft'
      ? new NftProxier({ ...o, session: true }) // session: as in a running kpng
      : new IptablesProxier({ ...o, mode: p.backend === 'iptables-nft' ? 'nft' : 'legacy' });
  const cluster = syntheticCluster({
    probes: [
      { namespace: 'aaa', name: 'probe', clusterIP: PROBE_FIRST, pod: 'probe-aaa' },
      { namespace: 'zzz', name: 'probe', clusterIP: PROBE_LAST, pod: 'probe-zzz' },
    ],
    from: 0,
    to: p.services - 2,
  });
  return proxierChild(proxier, cluster);
}
