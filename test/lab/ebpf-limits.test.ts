// to-ebpf at its limits, with real packets (the client pod in a cgroup the
// test creates, the programs attached to it only, pins in a bpffs mount of
// the test's own): a Service with 1,000 endpoints, programmed and spread
// over, one of them removed in a few map writes; kpng killed with SIGKILL
// right after a change and started again: it adopts the pinned maps and
// links (never a second attachment), the connection open across it keeps
// working, and the change gets programmed; an endpoint map too small for
// the Service (a clear error naming the map, counted, the Service left out
// and served by nftables); `kpng cleanup` leaves no program,
// map, link or pin behind (bpftool, on this test's cgroup and the ids it saw).
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { labCgroupUnsupported, describeOutcome, type LabCgroup, type Outcome } from '../../src/lab/index.js';
import { node, service, serviceCIDR, slice } from '../helpers/k8s.js';
import { backendConfig, backendLabUnsupported, createEbpfLab, pollUntil, restartEbpf, type EbpfLab, type EbpfNftBackend, type KpngLab } from '../helpers/lab-kpng.js';
import { skipOrFailInCI } from '../helpers/ci.js';
import { libbpfUnavailable } from '../../src/backends/ebpf/libbpf.js';

const VIP = '10.96.0.10';
const CLIENT = '10.244.1.5';
const NODE_IP = '192.168.0.2';
/** endpoint i: addresses of one pod (its server answers on every one) */
const EP = (i: number) => `10.244.${8 + Math.floor(i / 250)}.${1 + (i % 250)}`;
const range = (from: number, n: number) => Array.from({ length: n }, (_, i) => EP(from + i));

function state(endpoints: string[]) {
  return [
    node('node-a', undefined, [NODE_IP]),
    serviceCIDR('kubernetes', ['10.96.0.0/16']),
    service('demo', 'big', { clusterIP: VIP, ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }] }),
    slice('demo', 'big-1', 'big', endpoints.map((ip) => ({ ip, node: 'node-a' }))),
  ];
}

/** bpftool's JSON (an empty list when it printed nothing) */
function bpftool(args: string[]): { ok: boolean; json: any } {
  const r = spawnSync('bpftool', ['-j', ...args], { encoding: 'utf8' });
  return { ok: r.status === 0, json: r.stdout.trim() ? JSON.parse(r.stdout) : [] };
}

const why = skipOrFailInCI(labCgroupUnsupported() ?? libbpfUnavailable() ?? (spawnSync('bpftool', ['version']).status === 0 ? undefined : 'needs bpftool')) ?? (await backendLabUnsupported({ name: 'ebpf+nft', cgroupPath: '', bpffs: '' }));

describe('to-ebpf at its limits (pods in a test cgroup)', { skip: why, concurrency: 1 }, () => {
  let cg: LabCgroup;
  let kl: KpngLab;
  let backend: EbpfNftBackend;
  let lab: EbpfLab | undefined;
  const burst = (count: number) => kl.lab.burst({ from: CLIENT, to: VIP, port: 80, count });
  const endpointsSeen = (out: Outcome[]) => new Set(out.map((o) => (o.kind === 'answered' && o.by === 'big' ? o.local.split(':')[0] : o.kind)));
  const log = () => (kl.kpng ? kl.kpng.stdout + kl.kpng.stderr : '');
  /** the programs attached to this test's cgroup */
  const attached = () => bpftool(['cgroup', 'show', cg.path]).json as { id: number; name: string }[];

  before(async () => {
    lab = await createEbpfLab(
      {
        tag: 'ebpflim',
        node: { name: 'node-a', interfaces: [{ name: 'eth0', addresses: [`${NODE_IP}/24`] }] },
        pods: [
          { name: 'client', ips: [CLIENT] },
          { name: 'big', ips: range(0, 2000) },
        ],
      },
      state(range(0, 1000)),
      backendConfig({ name: 'nft' }, { clusterCIDR: '10.244.0.0/16', minSyncPeriod: '0s', syncPeriod: '1s' }),
      async (l) => {
        ({ kl, cg, backend } = l);
        cg.place(kl.lab.agent('client').pid!);
        await kl.lab.serve('big', { tcp: [8080] });
        await kl.startAndWait(() => kl.lab.connect({ from: CLIENT, to: VIP, port: 80 }), { pre: ['--log-level', 'debug'] });
      },
    );
  });

  after(() => lab?.close());

  it('a Service with 1,000 endpoints: programmed, connections spread over them; one removed is a few map writes', async () => {
    const out = await burst(60);
    assert.ok(out.every((o) => o.kind === 'answered' && o.by === 'big'), out.filter((o) => o.kind !== 'answered').map(describeOutcome).join('; '));
    // 60 picks among 1,000: a handful may repeat
    assert.ok(endpointsSeen(out).size >= 40, `${endpointsSeen(out).size} endpoints answered 60 connections`);
    const from = log().length;
    kl.setState(state(range(0, 1000).filter((_, i) => i !== 500)));
    const synced = await pollUntil(async () => log().slice(from), (l) => /ebpf: synced[^\n]*full=false/.test(l), 20_000);
    assert.ok(synced.ok, `no sync after the change\n${log().slice(-2000)}`);
    const writes = Number(/ebpf: synced[^\n]*full=false[^\n]*writes=(\d+)/.exec(synced.value)![1]);
    assert.ok(writes <= 3, `one endpoint removed: ${writes} map writes`);
    const after = await burst(60);
    assert.ok(!endpointsSeen(after).has(EP(500)), 'the removed endpoint still answers new connections');
  });

  it('SIGKILL right after a change, then a restart: maps and links adopted, never attached twice; the open connection stays; the change is programmed', async () => {
    const conn = await kl.lab.open({ from: CLIENT, to: VIP, port: 80 });
    try {
      assert.equal(conn.first.kind, 'answered', describeOutcome(conn.first));
      assert.equal(attached().length, 8);
      // every endpoint replaced: a long write, killed where it happens to be
      kl.setState(state(range(1000, 1000)));
      // about when the file source has read it (its debounce) and the sync writes
      await new Promise((r) => setTimeout(r, 150));
      kl.kpng!.process.kill('SIGKILL');
      await kl.kpng!.exited;
      assert.equal(attached().length, 8, 'the pinned links stay attached while kpng is down');
      assert.equal((await conn.send()).kind, 'answered', 'the open connection works while kpng is down');

      const { loaded } = await restartEbpf(kl);
      assert.deepEqual(loaded, { adoptedMaps: 6, adoptedLinks: 8, attached: 0 });
      assert.equal(attached().length, 8, 'attached once, not twice');
      const moved = await pollUntil(() => burst(40), (out) => out.every((o) => o.kind === 'answered' && o.by === 'big' && Number(o.local.split('.')[2]) >= 12), 20_000);
      assert.ok(moved.ok, `the change was not programmed after the restart: ${moved.value.map(describeOutcome).slice(0, 5).join('; ')}`);
      const again = await conn.send();
      assert.equal(again.kind, 'answered', `the connection open across the kill: ${describeOutcome(again)}`);
    } finally {
      await conn.close().catch(() => {});
    }
  });

  it('an endpoint map too small for the Service: a clear error naming the map, counted; left out, not half written, and nftables serves it', async () => {
    await kl.kpng!.stop();
    const k = kl.start({ pre: ['--log-level', 'debug'], extra: ['--max-endpoints', '500'] });
    await k.until('the Service left out', () => /skipping Service demo\/big/.test(k.stdout + k.stderr), { timeoutMs: 30_000 });
    const line = (k.stdout + k.stderr).split('\n').find((l) => l.includes('skipping Service demo/big'))!;
    assert.match(line, /eBPF map kpng_endpoints is full \(500 entries\): raise --max-endpoints/);
    const script = `fetch('http://127.0.0.1:10249/metrics').then(async (r) => console.log(await r.text()))`;
    const metrics = (await kl.lab.exec('node-a', [process.execPath, '-e', script])).stdout;
    assert.ok(Number(/^kpng_ebpf_map_full_total\{map="endpoints"\} (\d+)/m.exec(metrics)?.[1] ?? 0) >= 1, metrics.split('\n').filter((l) => l.includes('ebpf')).join('\n'));
    assert.match(metrics, /^kpng_sync_skipped_services 1$/m);
    // nothing of it in the map (made again at its new size): the connection goes on untranslated, to nftables
    const out = await burst(10);
    assert.ok(out.every((o) => o.kind === 'answered' && o.by === 'big'), out.map(describeOutcome).join('; '));
  });

  it('kpng cleanup: no program, map, link or pin is left (bpftool)', async () => {
    const progs = attached().map((p) => p.id);
    assert.equal(progs.length, 8);
    const pins = readdirSync(backend.bpffs);
    const maps = pins.filter((p) => p.startsWith('kpng_')).map((p) => (bpftool(['map', 'show', 'pinned', join(backend.bpffs, p)]).json as { id: number }).id);
    assert.equal(maps.length, 6, pins.join(' '));
    await kl.kpng!.stop();
    const k = kl.lab.startKpng(['cleanup'], { env: { KPNG_EBPF_BPFFS: backend.bpffs } });
    assert.equal(await k.wait(60_000), 0, k.stderr);
    assert.deepEqual(existsSync(backend.bpffs) ? readdirSync(backend.bpffs) : [], [], 'pins left');
    assert.deepEqual(attached(), [], 'programs still attached to the cgroup');
    // the kernel frees a program and its maps once nothing holds them (a moment after the last reference)
    const freed = await pollUntil(
      async () => [...progs.filter((id) => bpftool(['prog', 'show', 'id', String(id)]).ok).map((id) => `prog ${id}`), ...maps.filter((id) => bpftool(['map', 'show', 'id', String(id)]).ok).map((id) => `map ${id}`)],
      (left) => left.length === 0,
      10_000,
      200,
    );
    assert.ok(freed.ok, `still in the kernel: ${freed.value.join(', ')}`);
  });
});
