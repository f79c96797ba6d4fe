// to-userspace at its limits, with real packets: 5,000 connections held at
// once (all relayed; half-closed at the end, every socket freed); kpng under
// `ulimit -n 1024` filled by slowloris clients (a byte a second, never done):
// what it cannot take is refused and counted, its syncs and /healthz go on,
// and it serves again once they leave; an endpoint that vanishes without a
// word under an open connection (its namespace drops everything): the client
// is reset and both sockets freed, as kube-proxy's userspace proxy did
// (TCP keepalive).
import { it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { KPNG_BIN, describeOutcome } from '../../src/lab/index.js';
import { node, service, serviceCIDR, slice } from '../helpers/k8s.js';
import { KpngLab, backendConfig, describeBackends, kpngArgs, pollUntil } from '../helpers/lab-kpng.js';

const VIP = '10.96.0.20';
const CLIENT = '10.244.1.50';
const PEER = fileURLToPath(new URL('./stream-peer.mjs', import.meta.url));
/** the peers hold thousands of sockets */
const PEER_FILES = 16_384;

const objects = (extra: Record<string, any>[] = []) => [
  node('node-a', undefined, ['192.168.0.2']),
  serviceCIDR('kubernetes', ['10.96.0.0/16']),
  service('demo', 'many', {
    clusterIP: VIP,
    ports: [
      { name: 'probe', port: 80, protocol: 'TCP', targetPort: 8080 },
      { name: 'echo', port: 81, protocol: 'TCP', targetPort: 9000 },
      // the same server for the next case: its connections must not meet the first case's
      // conntrack entries (TIME_WAIT, NATed to the listener of the kpng stopped since)
      { name: 'echo-again', port: 82, protocol: 'TCP', targetPort: 9000 },
    ],
  }),
  slice('demo', 'many-1', 'many', [{ ip: '10.244.1.10', node: 'node-a' }], [
    { name: 'probe', port: 8080 },
    { name: 'echo', port: 9000 },
    { name: 'echo-again', port: 9000 },
  ]),
  ...extra,
];

await describeBackends(
  'to-userspace at its limits',
  () => {
    let kl: KpngLab;
    const procs: ChildProcess[] = [];
    /** a process in an agent's namespace, with an open files limit */
    const inNs = (agent: string, files: number, argv: string[], stdin: 'pipe' | 'ignore' = 'ignore') => {
      const p = spawn('ip', ['netns', 'exec', kl.lab.ns(agent), 'sh', '-c', `ulimit -n ${files} && exec "$@"`, 'sh', ...argv], { stdio: [stdin, 'pipe', 'pipe'] });
      procs.push(p);
      let out = '';
      p.stdout!.on('data', (d) => (out += d));
      p.stderr!.on('data', (d) => (out += d));
      return { p, out: () => out };
    };
    /** the peer's JSON lines so far */
    const lines = (out: string) => out.split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l) as Record<string, number>);
    const until = async (what: string, cond: () => boolean, ms: number) => {
      for (const end = Date.now() + ms; !cond(); ) {
        if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
        await new Promise((r) => setTimeout(r, 100));
      }
    };
    /** kpng to-userspace in the node's namespace, under an open files limit */
    const startKpng = async (files: number) => {
      const k = inNs('node-a', files, [process.execPath, KPNG_BIN, ...kpngArgs(kl.backend, kl.statePath, 'node-a', kl.configPath, { extra: ['--metrics-bind-address', '127.0.0.1:10249'] })]);
      const ready = await pollUntil(() => kl.lab.connect({ from: CLIENT, to: VIP, port: 80 }), (o) => o.kind === 'answered' && o.by !== 'world', 30_000);
      assert.ok(ready.ok, `kpng never served the Service: ${describeOutcome(ready.value)}\n${k.out().slice(-3000)}`);
      return k;
    };
    const stopKpng = async (k: { p: ChildProcess }) => {
      if (k.p.exitCode !== null) return;
      const exited = new Promise((r) => k.p.once('exit', r));
      k.p.kill('SIGTERM');
      await exited;
    };
    const get = async (url: string) => {
      const script = `fetch(${JSON.stringify(url)}).then(async (r) => console.log(r.status + '\\n' + (await r.text())), (e) => console.log('error ' + e.message))`;
      return (await kl.lab.exec('node-a', [process.execPath, '-e', script])).stdout;
    };
    const metric = async (re: RegExp) => Number(re.exec(await get('http://127.0.0.1:10249/metrics'))?.[1] ?? NaN);
    const files = (pid: number) => readdirSync(`/proc/${pid}/fd`).length;

    before(async () => {
      kl = await KpngLab.create(
        { name: 'userspace' },
        {
          tag: 'uslim',
          node: { name: 'node-a', interfaces: [{ name: 'eth0', addresses: ['192.168.0.2/24'] }] },
          pods: [
            { name: 'web-1', ips: ['10.244.1.10'] },
            { name: 'client', ips: [CLIENT] },
          ],
        },
        objects(),
        backendConfig({ name: 'userspace' }, { clusterCIDR: '10.244.0.0/16', syncPeriod: '2s', minSyncPeriod: '0s' }),
      );
      await kl.lab.serve('web-1', { tcp: [8080] });
      const echo = inNs('web-1', PEER_FILES, [process.execPath, PEER, 'echo', '9000']);
      await until('the echo server', () => echo.out().includes('ready'), 10_000);
    });
    after(async () => {
      for (const p of procs) if (p.exitCode === null) p.kill('SIGKILL');
      await kl?.close();
    });

    it('5,000 connections at once: every one relayed; half-closed, every socket is freed', { timeout: 240_000 }, async () => {
      const k = await startKpng(PEER_FILES);
      try {
        const pid = k.p.pid!;
        const idle = files(pid);
        const c = inNs('client', PEER_FILES, [process.execPath, PEER, 'many', VIP, '81', '5000'], 'pipe');
        await until('5,000 connections', () => lines(c.out()).length > 0, 120_000);
        assert.deepEqual(lines(c.out())[0], { ok: 5000, reset: 0, refused: 0, timeout: 0, other: 0 }, k.out().slice(-2000));
        assert.equal(await metric(/^kpng_userspace_sockets (\d+)/m), 10_000);
        c.p.stdin!.end();
        await until('the half-closed connections to close', () => lines(c.out()).some((l) => 'closed' in l), 60_000);
        assert.equal(lines(c.out()).find((l) => 'closed' in l)!.closed, 5000);
        const freed = await pollUntil(async () => metric(/^kpng_userspace_sockets (\d+)/m), (n) => n === 0, 30_000, 250);
        assert.ok(freed.ok, `kpng still holds ${freed.value} sockets of closed connections`);
        assert.ok(files(pid) <= idle + 2, `kpng has ${files(pid)} open files, ${idle} before`);
      } finally {
        await stopKpng(k);
      }
    });

    it('ulimit -n 1024, slowloris clients: what kpng cannot take is refused and counted; syncs and /healthz go on; served again once they leave', { timeout: 240_000 }, async () => {
      const k = await startKpng(1024);
      try {
        const pid = k.p.pid!;
        // more clients than kpng can hold, each trickling a byte a second
        const slow = inNs('client', PEER_FILES, [process.execPath, PEER, 'many', VIP, '82', '1500', 'trickle'], 'pipe');
        await until('the slowloris clients', () => lines(slow.out()).length > 0, 120_000);
        const got = lines(slow.out())[0];
        assert.ok(files(pid) < 1024 - 100, `kpng holds ${files(pid)} of its 1024 open files: none left for its own work`);
        assert.ok(got.ok > 0 && got.ok + got.reset === 1500, `refused ones are reset: ${JSON.stringify(got)}`);
        assert.equal(await metric(/^kpng_userspace_errors_total\{service="demo\/many",protocol="tcp",reason="capacity"\} (\d+)/m), got.reset);
        assert.match(k.out(), /userspace proxy: at capacity/);
        const max = await metric(/^kpng_userspace_sockets_max (\d+)/m);
        assert.ok(max > 0 && max < 1024, `kpng_userspace_sockets_max ${max}`);
        assert.equal(got.ok, Math.floor(max / 2), JSON.stringify(got));
        // kpng's own work goes on: a new Service is programmed, /healthz answers
        kl.setState(objects([service('demo', 'late', { clusterIP: '10.96.0.21', ports: [{ name: 'probe', port: 80, protocol: 'TCP', targetPort: 8080 }] }), slice('demo', 'late-1', 'late', [{ ip: '10.244.1.10', node: 'node-a' }], [{ name: 'probe', port: 8080 }])]));
        const table = await pollUntil(() => kl.lab.exec('node-a', ['nft', 'list', 'table', 'inet', 'kpng-userspace']), (r) => r.stdout.includes('10.96.0.21'), 30_000);
        assert.ok(table.ok, `the new Service was not programmed while at capacity\n${k.out().slice(-3000)}`);
        assert.match(await get('http://127.0.0.1:10256/healthz'), /^200\n/);
        assert.equal(k.p.exitCode, null);
        // they leave: served again
        slow.p.stdin!.end();
        await until('the slowloris clients to close', () => lines(slow.out()).some((l) => 'closed' in l), 60_000);
        const again = await pollUntil(() => kl.lab.connect({ from: CLIENT, to: VIP, port: 80 }), (o) => o.kind === 'answered' && o.by === 'web-1', 15_000);
        assert.ok(again.ok, describeOutcome(again.value));
      } finally {
        await stopKpng(k);
      }
    });

    it('an endpoint that vanishes without a word under an open connection: the client is reset, both sockets freed', { timeout: 120_000 }, async () => {
      const k = await startKpng(PEER_FILES);
      const pid = k.p.pid!;
      const held = await kl.lab.open({ from: CLIENT, to: VIP, port: 80 });
      try {
        assert.equal(held.first.kind, 'answered', describeOutcome(held.first));
        // a relayed connection: two sockets
        const withIt = files(pid);
        // the endpoint's namespace (the test's) drops everything: no FIN, no reset ever comes
        const drop = await kl.lab.exec('web-1', ['nft', '-f', '-'], { input: 'table inet vanish {\n chain in { type filter hook input priority -300; policy drop; }\n chain out { type filter hook output priority -300; policy drop; }\n}\n' });
        assert.equal(drop.code, 0, drop.stderr);
        const freed = await pollUntil(async () => files(pid), (n) => n <= withIt - 2, 60_000, 500);
        assert.ok(freed.ok, `kpng still holds the connection's sockets (${freed.value} open files, ${withIt} with it), 60 s after the endpoint vanished`);
        assert.equal(await metric(/^kpng_userspace_sockets (\d+)/m), 0);
        const after = await held.send(2000);
        assert.notEqual(after.kind, 'answered', `the client's connection still answers: ${describeOutcome(after)}`);
      } finally {
        await kl.lab.exec('web-1', ['nft', 'delete', 'table', 'inet', 'vanish']);
        await held.close().catch(() => {});
        await stopKpng(k);
      }
    });
  },
  [{ name: 'userspace' }],
);
