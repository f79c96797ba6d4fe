// nftables backend at scale, side by side for 1k / 10k / 30k Services x 5
// endpoints, each size in its own network namespace (real nft, real kernel):
//   npm run bench -- nft [--sizes 1000,10000,30000] [--changes 500] [--connections 3000]
// Reports: cold sync; one endpoint change from the source seeing it to the
// kernel having it (p50/p99); first-connection latency through a ClusterIP.
// The sizes' proxiers stay alive side by side and take their changes in
// turn, and the latency probes alternate between sizes in rounds, so the
// machine's noise hits every size alike.
import { execFileSync } from 'node:child_process';
import { NftProxier } from '../src/backends/nft/proxier.js';
import { BenchNamespaces, benchConfig, changesInTurn, benchLog, prepareNamespace, proxierChild, serveAsChild, probedCluster, vip, type ProxierCold } from './_scale.js';
import { num, nums, pct } from './_harness.js';

interface Cold extends ProxierCold {
  coldBytes: number;
}

export default async function (args: string[]) {
  if (await serveAsChild(child)) return;
  const sizes = nums(args, 'sizes', '1000,10000,30000');
  const changes = num(args, 'changes', 500);
  const connections = num(args, 'connections', 3000);
  const spaces = new BenchNamespaces('nft', 'kpng-bench');
  const namespaces: string[] = [];
  const colds: Cold[] = [];
  let changed: { ms: number[]; syncMs: number[] }[] = [];
  const rss: number[] = [];
  const lat = sizes.map(() => [] as number[]);
  try {
    const children = [];
    for (const services of sizes) {
      const ns = spaces.add();
      namespaces.push(ns);
      const c = spaces.keep(ns, { services }, `benchmark for ${services}`);
      colds.push(await c.ask<Cold>({ op: 'cold' }));
      children.push(c);
      console.error(`${services} services programmed`);
    }
    // one change at a time, in turn: size 1, size 2, ..., size 1, ...
    changed = await changesInTurn(children, changes);
    for (const c of children) {
      rss.push(await c.ask<number>({ op: 'finish' }));
      await c.end();
    }
    // first-connection latency: the rules stay in each namespace; rounds
    // alternate between sizes
    const rounds = 10;
    for (let round = 0; round < rounds; round++) {
      for (const [i, ns] of namespaces.entries()) {
        const [us] = await spaces.probe(ns, [vip(0)], { n: Math.ceil(connections / rounds), warmup: 50, close: 'destroy' }, `${sizes[i]}`);
        lat[i].push(...us);
      }
    }
  } finally {
    spaces.close();
  }
  const f = (x: number) => x.toFixed(x < 10 ? 2 : 0);
  const changeMs = changed.map((c) => c.ms);
  const applyMs = changed.map((c) => c.syncMs);
  const p99 = changeMs.map((xs) => pct(xs, 99));
  const connect50 = lat.map((xs) => pct(xs, 50));
  console.log(`nft benchmark: services x 5 endpoints, each size in a fresh network namespace; ${changes} changes per size; node ${process.version}, ${execFileSync('nft', ['--version'], { encoding: 'utf8' }).trim()}`);
  console.log('services | cold sync: compute + apply (transaction) | one endpoint change p50 / p99 (apply p50) | vs smallest (p99) | first connection p50 / p99 | vs smallest (p50) | RSS');
  sizes.forEach((services, s) => {
    const c = colds[s];
    console.log(
      `${services} | ${f(c.coldComputeMs)} + ${f(c.coldApplyMs)} ms (${(c.coldBytes / 2 ** 20).toFixed(1)} MiB) | ${f(pct(changeMs[s], 50))} / ${f(p99[s])} ms (${f(pct(applyMs[s], 50))}) | ${(p99[s] / p99[0]).toFixed(2)}x | ${connect50[s].toFixed(0)} / ${pct(lat[s], 99).toFixed(0)} us | ${(connect50[s] / connect50[0]).toFixed(2)}x | ${rss[s].toFixed(0)} MiB`,
    );
  });
}

/** in the size's namespace: the proxier and its cluster, asked one step at a time */
async function child(p: { services: number }) {
  prepareNamespace();
  // once: no minSyncPeriod wait; session: changes go to a long-lived nft, as in a running kpng
  const proxier = new NftProxier({ nodeName: 'node-0', config: benchConfig(), log: benchLog(), once: true, session: true, healthChecks: false });
  return proxierChild(proxier, probedCluster(p.services), { cold: () => ({ coldBytes: proxier.stats.lastTransactionBytes }) });
}
