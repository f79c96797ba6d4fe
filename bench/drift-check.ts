// The periodic drift check at scale, measured as a user runs kpng: two real
// `kpng file ... to-local to-nft` (or to-iptables) processes side by side,
// each in its own network namespace with the same synthetic cluster
// (Services x 5 endpoints), one checking every second (syncPeriod 1s), the
// other never in the window (syncPeriod 1h). Once both have programmed their
// node, their CPU time over the same idle window is compared: the difference
// is what the checks cost. With iptables-legacy, one check's table digests
// (xtablesDigest: each table copied out of the kernel and hashed) are also
// timed on their own, in the checking process's namespace.
//   npm run bench -- drift-check [--services 30000] [--seconds 60] [--backend nft|iptables-legacy|iptables-nft]
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { node, service, slice } from '../test/helpers/k8s.js';
import { xtablesDigest } from '../src/kernel/xtables.js';
import { BenchNamespaces, vip } from './_scale.js';
import { ROOT, arg, median, now, procStat, sleep } from './_harness.js';


/** utime + stime of a process, in ms */
const cpuMs = (pid: number) => procStat(pid).cpu * 1000;

export default async function (args: string[]) {
  const services = Number(arg(args, 'services', '30000'));
  const seconds = Number(arg(args, 'seconds', '60'));
  const backend = arg(args, 'backend', 'nft');
  if (!['nft', 'iptables-legacy', 'iptables-nft'].includes(backend)) throw new Error(`--backend ${backend}: nft, iptables-legacy or iptables-nft`);
  const mode = backend === 'nft' ? 'nftables' : 'iptables';
  const to = backend === 'nft' ? ['to-nft'] : ['to-iptables', '--iptables-mode', backend.slice('iptables-'.length)];
  const dir = mkdtempSync(join(tmpdir(), 'kpng-bench-drift-'));
  const spaces = new BenchNamespaces('drift-check', 'kpng-bench');
  const procs: ChildProcess[] = [];
  let stopping = false;
  try {
    const items: object[] = [node('node-0', undefined, ['10.255.0.1'])];
    for (let s = 0; s < services; s++) {
      items.push(service('bench', `s${s}`, { clusterIP: vip(s) }));
      items.push(slice('bench', `s${s}-1`, `s${s}`, Array.from({ length: 5 }, (_, e) => ({ ip: `10.${1 + (s >> 16)}.${(s >> 8) & 255}.${((s & 255) * 5 + e) % 250 + 1}`, node: `node-${e}` }))));
    }
    const input = join(dir, 'cluster.json');
    writeFileSync(input, JSON.stringify({ apiVersion: 'v1', kind: 'List', items }));
    console.error(`${services} services written`);
    const configs = { checking: '1s', quiet: '1h' };
    const runs = Object.entries(configs).map(([name, syncPeriod]) => {
      const ns = spaces.add();
      const config = join(dir, `${name}.json`);
      writeFileSync(config, JSON.stringify({ apiVersion: 'kubeproxy.config.k8s.io/v1alpha1', kind: 'KubeProxyConfiguration', mode, [mode]: { syncPeriod, minSyncPeriod: '1s' } }));
      // each agent its own state socket, and node lock beside it: they share this host's /run
      mkdirSync(join(dir, name));
      const socket = `unix://${join(dir, name, 'node.sock')}`;
      const t0 = Date.now();
      // each namespace's iptables with a lock of its own: the host's (/run/xtables.lock) is every namespace's, and two 30k loads, or other jobs, would time out on it
      const env = { ...process.env, XTABLES_LOCKFILE: join(dir, `${name}.xtables.lock`) };
      const p = spawn('ip', ['netns', 'exec', ns, process.execPath, `${ROOT}bin/kpng.js`, '--log-level', 'debug', 'file', '--input', input, '--no-watch', '--node-name', 'node-0', 'to-local', '--state-socket', socket, ...to, '--config', config, '--no-health-checks'], { stdio: ['ignore', 'ignore', 'pipe'], env });
      procs.push(p);
      let stderr = '';
      let repairs = 0;
      const programmed = new Promise<number>((resolve, reject) => {
        p.stderr!.on('data', (d) => {
          stderr = (stderr + d).slice(-20_000);
          if (/(nft|iptables): synced/.test(stderr)) resolve(Date.now() - t0);
          repairs += (String(d).match(/repairing it/g) ?? []).length;
          for (const line of String(d).split('\n')) if (/sync failed/.test(line)) console.error(`${name}: ${line.slice(0, 400)}`);
        });
        p.on('exit', (code, signal) => {
          const e = new Error(`kpng (${name}) exited ${code ?? signal}:\n${stderr.slice(-4000)}`);
          if (!stopping) console.error(e.message);
          reject(e);
        });
      });
      return { name, syncPeriod, ns, p, programmed, repairs: () => repairs };
    });
    const times = await Promise.all(runs.map((r) => r.programmed));
    for (const [i, r] of runs.entries()) console.error(`${r.name}: programmed ${services} services in ${times[i]} ms`);
    // ip netns exec execs kpng: the same pid
    const pids = runs.map((r) => r.p.pid!);
    await sleep(5000); // settle after the load
    const before = pids.map(cpuMs);
    await sleep(seconds * 1000);
    const after = pids.map(cpuMs);
    const used = after.map((a, i) => a - before[i]);
    console.log(`drift check (${backend}) at ${services} Services x 5 endpoints, ${seconds} s idle window, CPU time of the kpng process:`);
    for (const [i, r] of runs.entries()) console.log(`  syncPeriod ${r.syncPeriod.padEnd(3)}: ${used[i].toFixed(0)} ms CPU (${((used[i] / (seconds * 1000)) * 100).toFixed(2)} % of a core), RSS ${Math.round(procStat(pids[i]).rss)} MiB, repairs ${r.repairs()}`);
    const per = (used[0] - used[1]) / seconds;
    console.log(`  one check costs ${per.toFixed(2)} ms CPU (difference / ${seconds} checks)`);
    if (backend === 'iptables-legacy') await legacyDigests(runs[0].ns);
  } finally {
    stopping = true;
    for (const p of procs) p.kill('SIGKILL');
    spaces.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

/** one check's digests (the tables kpng writes, both families), timed on their own: median of 10 */
async function legacyDigests(ns: string): Promise<void> {
  const tables = ['filter', 'nat', 'mangle'];
  const ms: number[] = [];
  let bytes = 0;
  let rules = 0;
  for (let i = 0; i < 10; i++) {
    const t = now();
    bytes = rules = 0;
    for (const family of [4, 6] as const)
      for (const table of tables) {
        const d = await xtablesDigest(family, table, ns);
        bytes += d?.size ?? 0;
        rules += d?.entries ?? 0;
      }
    ms.push(now() - t);
  }
  console.log(`  the digests of one check alone: ${median(ms).toFixed(0)} ms (median of 10; ${rules} rules, ${(bytes / 2 ** 20).toFixed(1)} MiB of tables copied and hashed)`);
}
