// to-userspace against to-nft through a ClusterIP, side by side in one run:
//   npm run bench -- userspace [--rounds 3] [--seconds 5] [--concurrency 16] [--hold 1000]
// Two labs (network namespaces: a client pod, a server pod, the node in
// between), one running kpng with to-nft, one with to-userspace, measured in
// turn, round after round, so the machine's noise hits both alike. Reports
// the throughput of one bulk TCP stream (MB/s), the rate of short
// connections (connect, one byte back, close; per second), and kpng's RSS
// idle and with N connections held open through the Service.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Lab, labUnsupported, poll, type KpngProcess } from '../src/lab/index.js';
import { median, num, procStat, sleep } from './_harness.js';
import { node, service, serviceCIDR, slice } from '../test/helpers/k8s.js';

const PEER = fileURLToPath(new URL('./_userspace-peer.mjs', import.meta.url));
const VIP = '10.96.0.10';
const CLIENT = '10.244.1.50';
const SERVER = '10.244.1.10';

interface Side {
  readonly backend: 'nft' | 'userspace';
  readonly lab: Lab;
  readonly kpng: KpngProcess;
  readonly dir: string;
}

function peer(lab: Lab, agent: string, args: string[], until: RegExp = /^\{/m): { p: ChildProcess; done: Promise<string> } {
  const p = spawn('ip', ['netns', 'exec', lab.ns(agent), process.execPath, PEER, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  const done = new Promise<string>((resolve, reject) => {
    p.stdout!.on('data', (d) => {
      out += d;
      if (until.test(out)) resolve(out);
    });
    p.stderr!.on('data', (d) => (out += d));
    p.on('exit', (code) => (until.test(out) ? resolve(out) : reject(new Error(`${args.join(' ')} exited ${code}: ${out}`))));
  });
  return { p, done };
}

const lastJSON = (s: string) => JSON.parse(s.split('\n').filter((l) => l.startsWith('{')).pop()!);

async function side(backend: 'nft' | 'userspace', i: number): Promise<Side> {
  const lab = await Lab.create({
    tag: `bus${i}`,
    node: { name: 'node-a', interfaces: [{ name: 'eth0', addresses: ['192.168.0.2/24'] }] },
    pods: [
      { name: 'server', ips: [SERVER] },
      { name: 'client', ips: [CLIENT] },
    ],
  });
  const dir = mkdtempSync(join(tmpdir(), 'kpng-bench-us-'));
  try {
    const objects = [
      node('node-a', undefined, ['192.168.0.2']),
      serviceCIDR('kubernetes', ['10.96.0.0/16']),
      service('bench', 'svc', {
        clusterIP: VIP,
        ports: [
          { name: 'bulk', port: 80, protocol: 'TCP', targetPort: 9000 },
          { name: 'one', port: 81, protocol: 'TCP', targetPort: 9001 },
          { name: 'probe', port: 82, protocol: 'TCP', targetPort: 8080 },
        ],
      }),
      slice('bench', 'svc-1', 'svc', [{ ip: SERVER, node: 'node-a' }], [{ name: 'bulk', port: 9000 }, { name: 'one', port: 9001 }, { name: 'probe', port: 8080 }]),
    ];
    writeFileSync(join(dir, 'state.json'), JSON.stringify({ apiVersion: 'v1', kind: 'List', items: objects }));
    const mode = backend === 'nft' ? 'nftables' : 'userspace';
    writeFileSync(join(dir, 'config.json'), JSON.stringify({ apiVersion: 'kubeproxy.config.k8s.io/v1alpha1', kind: 'KubeProxyConfiguration', mode, clusterCIDR: '10.244.0.0/16' }));
    await peer(lab, 'server', ['serve', '9000', '9001'], /ready/).done;
    await lab.serve('server', { tcp: [8080] });
    const kpng = lab.startKpng(['--log-level', 'warn', 'file', '--input', join(dir, 'state.json'), '--node-name', 'node-a', 'to-local', `to-${backend}`, '--config', join(dir, 'config.json')]);
    const ready = await poll(() => lab.connect({ from: CLIENT, to: VIP, port: 82 }), (o) => o.kind === 'answered' && o.by === 'server', { timeoutMs: 30_000 });
    if (!ready.ok) throw new Error(`${backend}: kpng never programmed the Service\n${kpng.stderr.slice(-2000)}`);
    return { backend, lab, kpng, dir };
  } catch (e) {
    await lab.close();
    rmSync(dir, { recursive: true, force: true });
    throw e;
  }
}

export default async function (args: string[]) {
  const why = labUnsupported();
  if (why) throw new Error(`bench userspace needs network namespaces: ${why}`);
  const rounds = num(args, 'rounds', 3);
  const seconds = num(args, 'seconds', 5);
  const conc = num(args, 'concurrency', 16);
  const hold = num(args, 'hold', 1000);
  const sides: Side[] = [];
  const res = new Map<string, { mbs: number[]; rate: number[]; errors: number; idle: number; held: number }>();
  try {
    sides.push(await side('nft', 0), await side('userspace', 1));
    for (const k of ['direct', 'nft', 'userspace']) res.set(k, { mbs: [], rate: [], errors: 0, idle: 0, held: 0 });
    // direct: the server pod's own address, no Service (in the to-nft lab): the path's ceiling
    const runs = [
      { key: 'direct', lab: sides[0].lab, to: SERVER, bulk: '9000', one: '9001' },
      { key: 'nft', lab: sides[0].lab, to: VIP, bulk: '80', one: '81' },
      { key: 'userspace', lab: sides[1].lab, to: VIP, bulk: '80', one: '81' },
    ];
    for (let r = 0; r < rounds; r++) {
      for (const s of runs) {
        const push = lastJSON(await peer(s.lab, 'client', ['push', s.to, s.bulk, String(seconds * 1000)]).done);
        if (push.error) throw new Error(`${s.key} push: ${push.error}`);
        res.get(s.key)!.mbs.push(push.bytes / 2 ** 20 / (push.ms / 1000));
        const rate = lastJSON(await peer(s.lab, 'client', ['rate', s.to, s.one, String(seconds * 1000), String(conc)]).done);
        res.get(s.key)!.rate.push(rate.conns / (rate.ms / 1000));
        res.get(s.key)!.errors += rate.errors;
        console.error(`round ${r + 1}/${rounds} ${s.key}: ${(push.bytes / 2 ** 20 / (push.ms / 1000)).toFixed(0)} MB/s, ${(rate.conns / (rate.ms / 1000)).toFixed(0)} connections/s`);
      }
    }
    // RSS: idle, then with `hold` connections open through the Service
    for (const s of sides) {
      const pid = s.kpng.process.pid!;
      const r = res.get(s.backend)!;
      r.idle = procStat(pid).rss;
      const h = peer(s.lab, 'client', ['hold', VIP, '80', String(hold)], /ready|error/);
      try {
        const out = await h.done;
        if (!out.includes('ready')) throw new Error(`${s.backend} hold: ${out}`);
        await sleep(1000);
        r.held = procStat(pid).rss;
      } finally {
        h.p.kill('SIGKILL');
      }
    }
  } finally {
    for (const s of sides) {
      await s.kpng.stop();
      await s.lab.close();
      rmSync(s.dir, { recursive: true, force: true });
    }
  }
  const direct = res.get('direct')!;
  const nft = res.get('nft')!;
  const us = res.get('userspace')!;
  const f = (x: number, w: number) => x.toFixed(0).padStart(w);
  console.log(`\nthrough a ClusterIP, one client pod -> one server pod on the node (medians of ${rounds} rounds of ${seconds} s, in turn)`);
  console.log('                                   direct (no Service)   to-nft   to-userspace   userspace/nft');
  console.log(`bulk TCP stream (MB/s)             ${f(median(direct.mbs), 19)}  ${f(median(nft.mbs), 7)}  ${f(median(us.mbs), 13)}  ${(median(us.mbs) / median(nft.mbs)).toFixed(2).padStart(14)}`);
  console.log(`short connections/s (${String(conc).padStart(2)} at once)   ${f(median(direct.rate), 19)}  ${f(median(nft.rate), 7)}  ${f(median(us.rate), 13)}  ${(median(us.rate) / median(nft.rate)).toFixed(2).padStart(14)}`);
  console.log(`kpng RSS idle (MB)                 ${''.padStart(19)}  ${nft.idle.toFixed(1).padStart(7)}  ${us.idle.toFixed(1).padStart(13)}`);
  console.log(`kpng RSS, ${hold} connections open (MB) ${''.padStart(14)}  ${nft.held.toFixed(1).padStart(7)}  ${us.held.toFixed(1).padStart(13)}   (+${(us.held - us.idle).toFixed(1)} MB: ${(((us.held - us.idle) * 1024) / hold).toFixed(1)} KiB per connection)`);
  const errs = [...res].filter(([, v]) => v.errors).map(([k, v]) => `${k} ${v.errors}`);
  if (errs.length) console.log(`failed short connections: ${errs.join(', ')}`);
}
