// to-ipvs against to-nft, side by side in one kernel-lab VM (this machine's
// kernel has no IPVS, so both run under Debian's kernel in QEMU, and the
// ratio is fair even though TCG makes every number slower than on a node):
//   npm run bench -- ipvs [--sizes 1000,10000] [--changes 100] [--ways ipvs,nft,ipvsadm]
// For each size (Services x 5 endpoints), each in its own network namespace:
// the cold sync, and one endpoint change from the store to the kernel
// (p50/p99), for
//   - to-ipvs (IPVS over netlink from the process, nftables around it),
//   - to-nft,
//   - ipvsadm: the same virtual servers through Debian's ipvsadm, the way
//     an IPVS proxier without netlink would do it (`ipvsadm -R` of the
//     whole set cold; one `ipvsadm -R` of the change's lines per change):
//     the alternative docs/ipvs.md weighs netlink against.
// The changes go round the namespaces in turn so noise hits all alike.
import { execFileSync, spawnSync } from 'node:child_process';
import { IpvsProxier } from '../src/backends/ipvs/proxier.js';
import { NftProxier } from '../src/backends/nft/proxier.js';
import { runInVm } from '../src/lab/vm/run.js';
import { BenchNamespaces, benchConfig, benchLog, changesInTurn, prepareNamespace, proxierChild, serveAsChild, probedCluster, vip, type ProxierCold, type ProxierRequest } from './_scale.js';
import { ROOT, arg, now, num, nums, pct } from './_harness.js';

const f0 = (x: number) => x.toFixed(0);
const WAYS = ['ipvs', 'nft', 'ipvsadm'] as const;
type Way = (typeof WAYS)[number];

export default async function (args: string[]) {
  if (await serveAsChild(child)) return;
  if (!process.env.KPNG_VMLAB) return host(args);
  const sizes = nums(args, 'sizes', '1000,10000');
  const changes = num(args, 'changes', 100);
  const ways = arg(args, 'ways', WAYS.join(',')).split(',') as Way[];
  execFileSync('modprobe', ['ip_vs']);
  const spaces = new BenchNamespaces('ipvs', 'kpng-bench');
  const rows: { size: number; way: Way; coldMs: number; detail: string; change: number[]; changeDetail: string; rss: number }[] = [];
  try {
    // a warm-up of each way, not reported: the guest's first nft, netlink and
    // module loads cost seconds under QEMU and would land on the first size
    for (const way of ways) {
      const c = spaces.keep(spaces.add(), { services: 10, way }, `${way} warm-up`);
      await c.ask({ op: 'cold' });
      for (let i = 0; i < 5; i++) await c.ask({ op: 'change', i });
      await c.ask({ op: 'finish' });
      await c.end();
    }
    for (const size of sizes) {
      const kept = ways.map((way) => ({ way, c: spaces.keep(spaces.add(), { services: size, way }, `${way} at ${size}`) }));
      const colds: { ms: number; detail: string }[] = [];
      for (const { way, c } of kept) {
        colds.push(await c.ask<{ ms: number; detail: string }>({ op: 'cold' }));
        console.error(`${size} services: ${way} programmed`);
      }
      const change = await changesInTurn(kept.map((k) => k.c), changes);
      for (const [k, { way, c }] of kept.entries()) {
        const changeDetail = await c.ask<string>({ op: 'detail' });
        rows.push({ size, way, coldMs: colds[k].ms, detail: colds[k].detail, change: change[k].ms, changeDetail, rss: await c.ask<number>({ op: 'finish' }) });
        await c.end();
      }
    }
  } finally {
    spaces.close();
  }
  const f = (x: number) => x.toFixed(x < 10 ? 2 : 0);
  const kernel = execFileSync('uname', ['-r'], { encoding: 'utf8' }).trim();
  console.log(`ipvs benchmark: services x 5 endpoints, IPv4, each way in a fresh namespace of one VM (kernel ${kernel}, QEMU TCG); ${changes} changes per size; node ${process.version}`);
  console.log('services | way | cold sync | vs to-nft | one endpoint change p50 / p99 | vs to-nft (p50) | RSS');
  for (const r of rows) {
    const nft = rows.find((x) => x.size === r.size && x.way === 'nft') ?? r;
    const rss = r.way === 'ipvsadm' ? '-' : `${r.rss.toFixed(0)} MiB`;
    console.log(`${r.size} | ${r.way} | ${f(r.coldMs)} ms${r.detail ? ` (${r.detail})` : ''} | ${(r.coldMs / nft.coldMs).toFixed(2)}x | ${f(pct(r.change, 50))} / ${f(pct(r.change, 99))} ms${r.changeDetail ? ` (p50s: ${r.changeDetail})` : ''} | ${(pct(r.change, 50) / pct(nft.change, 50)).toFixed(2)}x | ${rss}`);
  }
}

/** on the host: the same benchmark in a kernel-lab VM */
async function host(args: string[]): Promise<void> {
  console.error('ipvs benchmark: booting the kernel lab (QEMU TCG); this takes minutes');
  const r = await runInVm([process.execPath, '--expose-gc', '--import', 'tsx', `${ROOT}bench/run.ts`, 'ipvs', ...args], { cwd: ROOT, timeoutMs: 60 * 60_000, memoryMiB: 4096 });
  process.stdout.write(r.output);
  if (r.status !== 0) throw new Error(`the benchmark in the kernel lab ended with status ${r.status}${r.timedOut ? ' (timed out)' : ''}`);
}

/** in the way's namespace: a proxier (or ipvsadm) and its cluster, asked one step at a time */
async function child(p: { services: number; way: Way }) {
  prepareNamespace();
  const cluster = probedCluster(p.services);
  if (p.way === 'ipvsadm') return ipvsadmChild(p.services);
  // once: each change synced alone; session: one long-lived nft, as in a running kpng
  const o = { nodeName: 'node-0', config: benchConfig(), log: benchLog(), once: true, session: true, healthChecks: false, families: [4] as const };
  const proxier = p.way === 'ipvs' ? new IpvsProxier(o) : new NftProxier(o);
  const changePhases: IpvsProxier['stats']['lastPhases'][] = [];
  // the median of each phase over the changes
  const med = (k: keyof IpvsProxier['stats']['lastPhases']) => pct(changePhases.map((x) => x[k]), 50);
  return proxierChild(proxier, cluster, {
    cold: (cold: ProxierCold) => {
      const ph = proxier instanceof IpvsProxier ? proxier.stats.lastPhases : undefined;
      const detail = ph ? `diff ${f0(cold.coldComputeMs)}, compute ${ph.computeMs}, nft ${ph.nftMs}, IPVS ${ph.ipvsMs}, kube-ipvs0 ${ph.addressMs}` : '';
      return { ms: cold.coldComputeMs + cold.coldApplyMs, detail };
    },
    changed: () => proxier instanceof IpvsProxier && changePhases.push(proxier.stats.lastPhases),
    detail: () => (changePhases.length ? `compute ${med('computeMs')}, nft ${med('nftMs')}, IPVS ${med('ipvsMs')}, kube-ipvs0 ${med('addressMs')}` : ''),
  });
}

/**
 * The same virtual servers and changes as syntheticCluster's, through
 * ipvsadm processes: the cold sync one `ipvsadm -R`, each change one
 * `ipvsadm -R` adding the new endpoint and deleting the old.
 */
async function ipvsadmChild(services: number) {
  const ip = (i: number) => `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`;
  const first = new Map<number, string>();
  const restore = (lines: string[]) => {
    const r = spawnSync('ipvsadm', ['-R'], { input: lines.join('\n') + '\n', encoding: 'utf8' });
    if (r.status !== 0) throw new Error(`ipvsadm -R: ${r.stderr}`);
  };
  return async (r: ProxierRequest): Promise<unknown> => {
    switch (r.op) {
      case 'cold': {
        const t = now();
        const lines: string[] = [];
        for (let s = 0; s < services; s++) {
          lines.push(`-A -t ${vip(s)}:80 -s rr`);
          for (let e = 0; e < 5; e++) lines.push(`-a -t ${vip(s)}:80 -r ${ip(s * 5 + e)}:8080 -m -w 1`);
          first.set(s, ip(s * 5));
        }
        restore(lines);
        return { ms: now() - t, detail: '' };
      }
      case 'change': {
        // syntheticCluster's i-th change: the first endpoint of one Service replaced
        const s = 1 + ((r.i * 7919) % (services - 1));
        const next = ip(s * 5 + (r.i + 1) * 1_000_000);
        const t = now();
        restore([`-a -t ${vip(s)}:80 -r ${next}:8080 -m -w 1`, `-d -t ${vip(s)}:80 -r ${first.get(s)}:8080`]);
        first.set(s, next);
        return [now() - t, 0];
      }
      case 'detail':
        return '';
      case 'finish':
        return 0;
    }
  };
}
