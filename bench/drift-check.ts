// The periodic drift check at scale, measured as a user runs kpng: two real
// `kpng file ... to-local to-nft` processes side by side, each in its own
// network namespace with the same synthetic cluster (Services x 5
// endpoints), one checking every second (syncPeriod 1s), the other never in
// the window (syncPeriod 1h). Once both have programmed their node, their
// CPU time over the same idle window is compared: the difference is what the
// checks cost.
//   npm run bench -- drift-check [--services 30000] [--seconds 60]
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { node, service, slice } from '../test/helpers/k8s.js';
import { BenchNamespaces, vip } from './_scale.js';
import { ROOT, num, procStat, sleep } from './_harness.js';

/** utime + stime of a process, in ms */
const cpuMs = (pid: number) => procStat(pid).cpu * 1000;

export default async function (args: string[]) {
  const services = num(args, 'services', 30000);
  const seconds = num(args, 'seconds', 60);
  const dir = mkdtempSync(join(tmpdir(), 'kpng-bench-drift-'));
  const spaces = new BenchNamespaces('drift-check', 'kpng-bench');
  const procs: ChildProcess[] = [];
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
      writeFileSync(config, JSON.stringify({ apiVersion: 'kubeproxy.config.k8s.io/v1alpha1', kind: 'KubeProxyConfiguration', mode: 'nftables', nftables: { syncPeriod, minSyncPeriod: '1s' } }));
      const t0 = Date.now();
      const p = spawn('ip', ['netns', 'exec', ns, process.execPath, `${ROOT}bin/kpng.js`, '--log-level', 'debug', 'file', '--input', input, '--no-watch', '--node-name', 'node-0', 'to-local', 'to-nft', '--config', config, '--no-health-checks'], { stdio: ['ignore', 'ignore', 'pipe'] });
      procs.push(p);
      let stderr = '';
      let checks = 0;
      const programmed = new Promise<number>((resolve, reject) => {
        p.stderr!.on('data', (d) => {
          stderr = (stderr + d).slice(-20_000);
          if (/nft: synced/.test(stderr)) resolve(Date.now() - t0);
          checks += (String(d).match(/repairing it/g) ?? []).length;
        });
        p.on('exit', (code) => reject(new Error(`kpng (${name}) exited ${code}:\n${stderr}`)));
      });
      return { name, syncPeriod, ns, p, programmed, repairs: () => checks };
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
    console.log(`drift check at ${services} Services x 5 endpoints, ${seconds} s idle window, CPU time of the kpng process:`);
    for (const [i, r] of runs.entries()) console.log(`  syncPeriod ${r.syncPeriod.padEnd(3)}: ${used[i].toFixed(0)} ms CPU (${((used[i] / (seconds * 1000)) * 100).toFixed(2)} % of a core), RSS ${procStat(pids[i]).rss.toFixed(0)} MiB, repairs ${r.repairs()}`);
    const per = (used[0] - used[1]) / seconds;
    console.log(`  one check costs ${per.toFixed(2)} ms CPU (difference / ${seconds} checks)`);
  } finally {
    for (const p of procs) p.kill('SIGKILL');
    spaces.close();
    rmSync(dir, { recursive: true, force: true });
  }
}
