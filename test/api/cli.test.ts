// The commands as a user runs them, as processes: `kpng file ... to-api`
// on a unix socket (directory created, mode 0660, a stale socket replaced,
// a live one not taken over, removed on exit), `kpng local ... to-log`,
// `kpng api ... to-file`, mTLS through their --tls-* flags, /metrics of the
// brain, and the refusal of a non-loopback listener
// without TLS. Every process is killed at the end, also on failure.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { TLS_DIR, TempDirs, exampleClusterYaml } from './helpers.js';
import { freePort } from '../helpers/port.js';
import { until } from '../helpers/until.js';

const KPNG = fileURLToPath(new URL('../../bin/kpng.js', import.meta.url));
const dirs = new TempDirs();
const procs = new Set<ChildProcess>();
after(() => {
  for (const p of procs) p.kill('SIGKILL');
  dirs.cleanup();
});

interface Run {
  proc: ChildProcess;
  out: () => string;
  err: () => string;
  exit: Promise<number | null>;
}

function kpng(...args: string[]): Run {
  const proc = spawn(process.execPath, [KPNG, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  procs.add(proc);
  let out = '';
  let err = '';
  proc.stdout!.on('data', (d) => (out += d));
  proc.stderr!.on('data', (d) => (err += d));
  const exit = new Promise<number | null>((resolve) => proc.on('exit', (code) => (procs.delete(proc), resolve(code))));
  return { proc, out: () => out, err: () => err, exit };
}

async function exited(r: Run, timeoutMs = 20_000): Promise<number | null> {
  const t = setTimeout(() => r.proc.kill('SIGKILL'), timeoutMs);
  try {
    return await r.exit;
  } finally {
    clearTimeout(t);
  }
}


test('brain and node processes over a unix socket', { timeout: 60_000 }, async () => {
  const dir = dirs.make();
  const input = join(dir, 'cluster.yaml');
  writeFileSync(input, exampleClusterYaml());
  const sock = join(dir, 'run', 'kpng', 'kpng.sock');

  // the first brain creates the directory and the socket, then crashes
  const crashed = kpng('file', '-i', input, 'to-api', '--listen', `unix://${sock}`);
  await until('the first brain to serve', () => crashed.err().includes('to-api: serving'), { timeoutMs: 20_000 });
  assert.equal(statSync(join(dir, 'run', 'kpng')).mode & 0o777, 0o750);
  crashed.proc.kill('SIGKILL');
  await exited(crashed);
  assert.ok(statSync(sock).isSocket(), 'a stale socket is left behind');

  // the next brain replaces the stale socket
  const brain = kpng('file', '-i', input, 'to-api', '--listen', `unix://${sock}`);
  await until('the brain to serve', () => brain.err().includes('to-api: serving'), { timeoutMs: 20_000 });
  assert.equal(statSync(sock).mode & 0o777, 0o660);

  // a second brain does not take a live socket over
  const second = kpng('file', '-i', input, 'to-api', '--listen', `unix://${sock}`);
  assert.notEqual(await exited(second), 0);
  assert.match(second.err(), /another server is listening there/);

  const node = kpng('local', '--api', `unix://${sock}`, 'to-log', '--node-name', 'node-a', '--once');
  assert.equal(await exited(node), 0, node.err());
  assert.deepEqual(
    node.out().trim().split('\n').map((l) => l.split(' {')[0]),
    ['~ reset', '+ ServicesSet demo/web', '+ EndpointsSet demo/web/web-1', '> sync'],
  );

  const chained = kpng('api', '--api', `unix://${sock}`, 'to-file', '--once', '--format', 'json');
  assert.equal(await exited(chained), 0, chained.err());
  const state = JSON.parse(chained.out());
  assert.deepEqual(state.nodes.map((n: any) => n.Name), ['node-a']);
  assert.equal(state.services[0].service.Name, 'web');
  assert.equal(state.services[0].endpoints[0].PodName, 'web-1');

  brain.proc.kill('SIGTERM');
  assert.equal(await exited(brain), 0);
  assert.ok(!existsSync(sock), 'the socket is removed on exit');
});

test('a non-loopback listener without TLS does not start', { timeout: 30_000 }, async () => {
  const dir = dirs.make();
  const input = join(dir, 'cluster.yaml');
  writeFileSync(input, exampleClusterYaml());
  const r = kpng('file', '-i', input, 'to-api', '--listen', 'tcp://0.0.0.0:12090');
  assert.equal(await exited(r), 1);
  assert.match(r.err(), /refusing to serve the API on tcp:\/\/0\.0\.0\.0:12090 without TLS/);
});

test('a --heap-growth that is not a percentage does not start', { timeout: 30_000 }, async () => {
  const dir = dirs.make();
  const input = join(dir, 'cluster.yaml');
  writeFileSync(input, exampleClusterYaml());
  for (const bad of ['lots', '-5', '12.5']) {
    const r = kpng('file', '-i', input, 'to-api', '--listen', `unix://${join(dir, 'kpng.sock')}`, '--heap-growth', bad);
    assert.equal(await exited(r), 1, bad);
    assert.match(r.err(), /--heap-growth/, bad);
    assert.ok(!r.err().includes('to-api: serving'), bad);
  }
});

test('a --max-connections or --handshake-timeout that is not a whole number does not start', { timeout: 30_000 }, async () => {
  const dir = dirs.make();
  const input = join(dir, 'cluster.yaml');
  writeFileSync(input, exampleClusterYaml());
  for (const [flag, bad] of [['--max-connections', '0'], ['--handshake-timeout', '1.5s']]) {
    const r = kpng('file', '-i', input, 'to-api', '--listen', `unix://${join(dir, 'kpng.sock')}`, flag, bad);
    assert.equal(await exited(r), 1, bad);
    assert.match(r.err(), new RegExp(flag), bad);
    assert.ok(!r.err().includes('to-api: serving'), bad);
  }
});

test('the brain serves /metrics: its watchers and the time its diffs take', { timeout: 60_000 }, async () => {
  const dir = dirs.make();
  const input = join(dir, 'cluster.yaml');
  writeFileSync(input, exampleClusterYaml());
  const sock = join(dir, 'kpng.sock');
  const port = await freePort();
  const brain = kpng('file', '-i', input, 'to-api', '--listen', `unix://${sock}`, '--metrics-bind-address', `127.0.0.1:${port}`);
  await until('the brain to serve', () => brain.err().includes('to-api: serving'), { timeoutMs: 20_000 });
  const node = kpng('local', '--api', `unix://${sock}`, 'to-log', '--node-name', 'node-a');
  await until('the node to sync', () => node.out().includes('> sync'), { timeoutMs: 20_000 });
  const m = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
  assert.match(m, /^kpng_api_watchers\{api="local"\} 1$/m);
  assert.match(m, /^kpng_api_diff_duration_seconds_count\{api="local"\} [1-9]/m);
  assert.match(m, /^kpng_api_messages_total\{api="local"\} 4$/m);
  assert.match(m, /^kpng_api_connections 1$/m);
  assert.match(m, /^process_resident_memory_bytes /m);
  node.proc.kill('SIGTERM');
  await exited(node);
  brain.proc.kill('SIGTERM');
  assert.equal(await exited(brain), 0);
});

test('mTLS through the command line: to-api, kpng local and kpng api with their --tls-* flags; a node without a client certificate is refused', { timeout: 90_000 }, async () => {
  const dir = dirs.make();
  const input = join(dir, 'cluster.yaml');
  writeFileSync(input, exampleClusterYaml());
  const tls = (f: string) => join(TLS_DIR, f);
  const port = await freePort();
  const api = `tcp://127.0.0.1:${port}`;
  const brain = kpng('file', '-i', input, 'to-api', '--listen', api, '--tls-cert', tls('server.crt'), '--tls-key', tls('server.key'), '--tls-ca', tls('ca.crt'), '--metrics-bind-address', '');
  await until('the brain to serve', () => brain.err().includes('to-api: serving'), { timeoutMs: 20_000 });

  const node = kpng('local', '--api', api, '--tls-ca', tls('ca.crt'), '--tls-cert', tls('client.crt'), '--tls-key', tls('client.key'), 'to-log', '--node-name', 'node-a', '--once');
  assert.equal(await exited(node), 0, node.err());
  assert.match(node.out(), /\+ ServicesSet demo\/web/);

  const chained = kpng('api', '--api', api, '--tls-ca', tls('ca.crt'), '--tls-cert', tls('client.crt'), '--tls-key', tls('client.key'), 'to-file', '--once', '--format', 'json');
  assert.equal(await exited(chained), 0, chained.err());
  assert.equal(JSON.parse(chained.out()).services[0].service.Name, 'web');

  // no client certificate, or one from another CA: never served (kpng local keeps retrying; stopped after a while)
  for (const [what, flags] of [
    ['no client certificate', ['--tls-ca', tls('ca.crt')]],
    ['a certificate from another CA', ['--tls-ca', tls('ca.crt'), '--tls-cert', tls('other-client.crt'), '--tls-key', tls('other-client.key')]],
  ] as const) {
    const refused = kpng('local', '--api', api, ...flags, 'to-log', '--node-name', 'node-a', '--once');
    await until(`${what}: the refusal logged`, () => /watch failed/.test(refused.err()), { timeoutMs: 20_000 });
    await new Promise((r) => setTimeout(r, 1000));
    assert.equal(refused.out(), '', `${what}: got ops`);
    assert.equal(refused.proc.exitCode, null, `${what}: it keeps trying`);
    refused.proc.kill('SIGTERM');
    await exited(refused);
  }
  brain.proc.kill('SIGTERM');
  assert.equal(await exited(brain), 0);
});
