// nftables backend at scale, side by side for 1k / 10k / 30k Services x 5
// endpoints, each size in its own network namespace (real nft, real kernel):
//   npm run bench -- nft [--sizes 1000,10000,30000] [--changes 100] [--connections 3000]
// Reports: cold sync; one endpoint change from the source seeing it to the
// kernel having it (p50/p99); first-connection latency through a ClusterIP.
import { execFileSync } from 'node:child_process';
import { pino } from 'pino';
import { NftProxier } from '../src/backends/nft/proxier.js';
import { defaultConfig } from '../src/backends/shared/config.js';
import { BenchNamespaces, arg, measureSyncs, pct, prepareNamespace, rssMiB, runAsChild, syntheticCluster, vip } from './_scale.js';

interface Result {
  services: number;
  coldComputeMs: number;
  coldApplyMs: number;
  coldBytes: number;
  changeP50: number;
  changeP99: number;
  changeApplyP50: number;
  /** microseconds */
  connectP50: number;
  connectP99: number;
  rssMiB: number;
}

export default async function (args: string[]) {
  if (await runAsChild(child)) return;
  const sizes = arg(args, 'sizes', '1000,10000,30000').split(',').map(Number);
  const changes = Number(arg(args, 'changes', '100'));
  const connections = Number(arg(args, 'connections', '3000'));
  const results: Result[] = [];
  const spaces = new BenchNamespaces('nft', 'kpng-bench');
  const namespaces: string[] = [];
  try {
    for (const services of sizes) {
      const ns = spaces.add();
      namespaces.push(ns);
      results.push(await spaces.child<Result>(ns, { services, changes }, `benchmark for ${services}`));
      console.error(`${services} services programmed`);
    }
    // first-connection latency, side by side: the rules stay in each
    // namespace; rounds alternate between sizes so noise hits them alike
    const lat = namespaces.map(() => [] as number[]);
    const rounds = 5;
    for (let round = 0; round < rounds; round++) {
      for (const [i, ns] of namespaces.entries()) {
        const [us] = await spaces.probe(ns, [vip(0)], { n: Math.ceil(connections / rounds), close: 'destroy' }, `${results[i].services}`);
        lat[i].push(...us);
      }
    }
    results.forEach((r, i) => {
      r.connectP50 = pct(lat[i], 50);
      r.connectP99 = pct(lat[i], 99);
    });
  } finally {
    spaces.close();
  }
  const base = results[0];
  const f = (x: number) => x.toFixed(x < 10 ? 2 : 0);
  console.log(`nft benchmark: services x 5 endpoints, each size in a fresh network namespace; node ${process.version}, ${execFileSync('nft', ['--version'], { encoding: 'utf8' }).trim()}`);
  console.log('services | cold sync: compute + apply (transaction) | one endpoint change p50 / p99 (apply p50) | vs smallest (p99) | first connection p50 / p99 | vs smallest (p50) | RSS');
  for (const r of results) {
    console.log(
      `${r.services} | ${f(r.coldComputeMs)} + ${f(r.coldApplyMs)} ms (${(r.coldBytes / 2 ** 20).toFixed(1)} MiB) | ${f(r.changeP50)} / ${f(r.changeP99)} ms (${f(r.changeApplyP50)}) | ${(r.changeP99 / base.changeP99).toFixed(2)}x | ${r.connectP50.toFixed(0)} / ${r.connectP99.toFixed(0)} us | ${(r.connectP50 / base.connectP50).toFixed(2)}x | ${r.rssMiB.toFixed(0)} MiB`,
    );
  }
}

async function child(p: { services: number; changes: number }): Promise<Result> {
  prepareNamespace();
  const config = defaultConfig();
  config.clusterCIDRs = ['10.0.0.0/8'];
  config.nftables.minSyncPeriodMs = 0; // measure each change alone
  // once: no minSyncPeriod wait; session: changes go to a long-lived nft, as in a running kpng
  const proxier = new NftProxier({ nodeName: 'node-0', config, log: pino({ level: 'warn' }), once: true, session: true, healthChecks: false });
  // svc-0 is the probe Service (its one endpoint is the probe's server)
  const cluster = syntheticCluster({ probes: [{ namespace: 'bench', name: 'svc-0', clusterIP: vip(0), pod: 'probe' }], from: 1, to: p.services });
  let coldBytes = 0;
  const applies: number[] = [];
  const m = await measureSyncs(cluster, proxier, p.changes, {
    afterCold: () => (coldBytes = proxier.stats.lastTransactionBytes),
    afterChange: () => applies.push(proxier.stats.lastSyncMs),
  });
  await proxier.close();
  return {
    services: p.services,
    coldComputeMs: m.coldComputeMs,
    coldApplyMs: m.coldApplyMs,
    coldBytes,
    changeP50: pct(m.changeMs, 50),
    changeP99: pct(m.changeMs, 99),
    changeApplyP50: pct(applies, 50),
    connectP50: 0,
    connectP99: 0,
    rssMiB: rssMiB(),
  };
}
