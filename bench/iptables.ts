// iptables vs nftables at scale, side by side in one run: to-iptables (with
// iptables-nft and iptables-legacy) and to-nft, for 1k / 10k / 30k Services x
// 5 endpoints, each backend and size in its own network namespace (real
// tools, real kernel):
//   npm run bench -- iptables [--sizes 1000,10000,30000] [--changes 20] [--connections 2000]
//                             [--backends nft,iptables-nft,iptables-legacy] [--runs 1] [--iptables-nft-max 10000]
// Reports: cold sync; one endpoint change from the store seeing it to the
// kernel having it (p50/p99); first-connection latency through a ClusterIP
// whose rule is first in KUBE-SERVICES and one whose rule is last, measured
// by a small separate process once the big one has exited (its GC pauses
// would pollute p99). iptables-nft runs up to --iptables-nft-max Services: its
// cold restore grows faster than linearly (37 s at 10k here, not done after
// 10 min at 30k).
import { spawnSync } from 'node:child_process';
import { pino } from 'pino';
import type { DecoderHandler } from '../src/diff/decoder.js';
import { NftProxier } from '../src/backends/nft/proxier.js';
import { IptablesProxier } from '../src/backends/iptables/proxier.js';
import { defaultConfig } from '../src/backends/shared/config.js';
import { BenchNamespaces, arg, measureSyncs, median, pct, prepareNamespace, rssMiB, runAsChild, syntheticCluster } from './_scale.js';

type Backend = 'nft' | 'iptables-nft' | 'iptables-legacy';

interface SyncResult {
  backend: Backend;
  services: number;
  coldComputeMs: number;
  coldApplyMs: number;
  changeP50: number;
  changeP99: number;
  rssMiB: number;
}

interface Latency {
  /** microseconds */
  first: number[];
  last: number[];
}

// probe Services: their KUBE-SERVICES rules sort first ("aaa/...") and last ("zzz/...")
const PROBE_FIRST = '172.31.255.1';
const PROBE_LAST = '172.31.255.2';

export default async function (args: string[]) {
  if (await runAsChild(child)) return;
  const sizes = arg(args, 'sizes', '1000,10000,30000').split(',').map(Number);
  const changes = Number(arg(args, 'changes', '20'));
  const connections = Number(arg(args, 'connections', '2000'));
  const runs = Number(arg(args, 'runs', '1'));
  const backends = arg(args, 'backends', 'nft,iptables-nft,iptables-legacy').split(',') as Backend[];
  const nftModeMax = Number(arg(args, 'iptables-nft-max', '10000'));
  const results = new Map<string, { sync: SyncResult[]; lat: Latency[] }>();

  const spaces = new BenchNamespaces('iptables', 'kpng-bench-ipt');
  try {
    for (let run = 0; run < runs; run++) {
      for (const services of sizes) {
        for (const backend of backends) {
          if (backend === 'iptables-nft' && services > nftModeMax) continue;
          const ns = spaces.add();
          try {
            const sync = await spaces.child<SyncResult>(ns, { backend, services, changes }, `${backend} ${services}`);
            // the rules stay in the namespace: a small process measures connections through them
            const [first, last] = await spaces.probe(ns, [PROBE_FIRST, PROBE_LAST], { n: connections, close: 'destroy' }, `${backend} ${services}`);
            const k = `${services} ${backend}`;
            if (!results.has(k)) results.set(k, { sync: [], lat: [] });
            results.get(k)!.sync.push(sync);
            results.get(k)!.lat.push({ first, last });
            console.error(`run ${run + 1}/${runs}: ${services} services, ${backend} done`);
          } finally {
            spaces.remove(ns);
          }
        }
      }
    }
  } finally {
    spaces.close();
  }

  const f = (x: number) => (x < 10 ? x.toFixed(2) : x.toFixed(0));
  const us = (x: number) => x.toFixed(0);
  const tools = ['nft --version', 'iptables-nft --version', 'iptables-legacy --version'].map((c) => spawnSync('sh', ['-c', c], { encoding: 'utf8' }).stdout.trim()).join(', ');
  console.log(`iptables vs nftables: services x 5 endpoints, each backend and size in a fresh network namespace; ${runs} run(s): medians of the runs' values (min in brackets when runs > 1); node ${process.version}; ${tools}`);
  console.log('services | backend | cold sync: compute + apply | one endpoint change p50 / p99 | first connection, rule first: p50 / p99 | rule last: p50 / p99 | RSS');
  for (const services of sizes) {
    for (const backend of backends) {
      const r = results.get(`${services} ${backend}`);
      if (!r) {
        if (backend === 'iptables-nft' && services > nftModeMax) console.log(`${services} | ${backend} | not run (more than --iptables-nft-max ${nftModeMax} Services) | | | |`);
        continue;
      }
      const m = (pick: (s: SyncResult) => number) => {
        const xs = r.sync.map(pick);
        return runs > 1 ? `${f(median(xs))} [${f(Math.min(...xs))}]` : f(xs[0]);
      };
      const l = (pick: (l: Latency) => number[], p: number) => {
        const xs = r.lat.map((x) => pct(pick(x), p));
        return runs > 1 ? `${us(median(xs))} [${us(Math.min(...xs))}]` : us(xs[0]);
      };
      console.log(
        `${services} | ${backend} | ${m((s) => s.coldComputeMs)} + ${m((s) => s.coldApplyMs)} ms | ${m((s) => s.changeP50)} / ${m((s) => s.changeP99)} ms | ${l((x) => x.first, 50)} / ${l((x) => x.first, 99)} us | ${l((x) => x.last, 50)} / ${l((x) => x.last, 99)} us | ${m((s) => s.rssMiB)} MiB`,
      );
    }
  }
}

async function child(p: { backend: Backend; services: number; changes: number }): Promise<SyncResult> {
  prepareNamespace();
  const config = defaultConfig();
  config.clusterCIDRs = ['10.0.0.0/8'];
  config.nftables.minSyncPeriodMs = config.iptables.minSyncPeriodMs = 0; // measure each change alone
  const log = pino({ level: 'warn' });
  const proxier: DecoderHandler & { close(): Promise<void> } =
    p.backend === 'nft'
      ? new NftProxier({ nodeName: 'node-0', config, log, once: true, session: true, healthChecks: false, families: [4] }) // session: as in a running kpng
      : new IptablesProxier({ nodeName: 'node-0', config, log, once: true, healthChecks: false, families: [4], mode: p.backend === 'iptables-nft' ? 'nft' : 'legacy' });
  const cluster = syntheticCluster({
    probes: [
      { namespace: 'aaa', name: 'probe', clusterIP: PROBE_FIRST, pod: 'probe-aaa' },
      { namespace: 'zzz', name: 'probe', clusterIP: PROBE_LAST, pod: 'probe-zzz' },
    ],
    from: 0,
    to: p.services - 2,
  });
  const m = await measureSyncs(cluster, proxier, p.changes);
  await proxier.close();
  return { backend: p.backend, services: p.services, coldComputeMs: m.coldComputeMs, coldApplyMs: m.coldApplyMs, changeP50: pct(m.changeMs, 50), changeP99: pct(m.changeMs, 99), rssMiB: rssMiB() };
}
