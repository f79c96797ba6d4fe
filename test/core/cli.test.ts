// The CLI as users run it: real processes.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, rmSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parse } from 'yaml';
import { kpngSync, kpngSpawn, ROOT } from '../helpers/cli.js';
import { service, slice } from '../helpers/k8s.js';

const EXAMPLE = join(ROOT, 'examples/cluster.yaml');

test('kpng file --input examples/cluster.yaml to-file --output - prints the global state', () => {
  const r = kpngSync(['file', '--input', EXAMPLE, 'to-file', '--output', '-', '--once']);
  assert.equal(r.status, 0, r.stderr);
  const doc = parse(r.stdout);
  assert.deepEqual(doc.nodes.map((n: any) => n.Name), ['node-a', 'node-b']);
  assert.deepEqual(doc.services.map((s: any) => s.service.Name), ['api', 'echo', 'jobs', 'shop', 'web']);
  assert.equal(doc.services.find((s: any) => s.service.Name === 'web').endpoints.length, 3);
});

test('to-file --node-name writes that node\'s state, atomically to a file, as JSON', () => {
  const dir = mkdtempSync(join(tmpdir(), 'kpng-cli-'));
  try {
    const out = join(dir, 'state.json');
    const r = kpngSync(['file', '--input', EXAMPLE, 'to-file', '--output', out, '--format', 'json', '--node-name', 'node-b', '--once']);
    assert.equal(r.status, 0, r.stderr);
    const doc = JSON.parse(readFileSync(out, 'utf8'));
    assert.equal(doc.node.Name, 'node-b');
    const shop = doc.services.find((s: any) => s.service.Name === 'shop');
    // externalTrafficPolicy Local: node-b's own endpoint is the external one
    assert.deepEqual(shop.endpoints.filter((e: any) => e.Scopes.External).map((e: any) => e.IPs.V4[0]), ['10.244.2.30']);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('to-local to-log shows each change once, following the input', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'kpng-cli-'));
  const file = join(dir, 'c.json');
  const state = (ips: string[]) => JSON.stringify({ kind: 'List', items: [service('ns', 'web', { clusterIP: '10.96.0.1' }), slice('ns', 'web-1', 'web', ips.map((ip, i) => ({ ip, pod: `p${ip}` })))] });
  writeFileSync(file, state(['10.0.0.1']));
  const k = kpngSpawn(['file', '--input', dir, '--debounce', '20', 'to-local', 'to-log', '--node-name', 'n1']);
  try {
    await k.until('the first sync', () => k.stdout.includes('> sync'));
    writeFileSync(file, state(['10.0.0.1', '10.0.0.2']));
    await k.until('the second sync', () => k.stdout.split('> sync').length === 3);
    writeFileSync(file, state(['10.0.0.1', '10.0.0.2'])); // same again: nothing
    await new Promise((r) => setTimeout(r, 300));
    const lines = k.stdout.trim().split('\n');
    const after = lines.slice(lines.indexOf('> sync') + 1);
    assert.deepEqual(after.map((l) => l.split(' {')[0]), ['+ EndpointsSet ns/web/p10.0.0.2', '> sync']);
  } finally {
    await k.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('--help at every level, and version', () => {
  for (const args of [[], ['file'], ['file', '-i', 'x', 'to-file'], ['file', '-i', 'x', 'to-local'], ['file', '-i', 'x', 'to-local', 'to-log']]) {
    const r = kpngSync([...args, '--help']);
    assert.equal(r.status, 0, `${args.join(' ')} --help: ${r.stderr}`);
    assert.match(r.stdout, /Usage: kpng/);
  }
  const v = kpngSync(['version']);
  assert.equal(v.status, 0);
  assert.match(v.stdout, /^kpng \d+\.\d+\.\d+/);
});

test('an invalid --config is refused, naming the field', () => {
  const dir = mkdtempSync(join(tmpdir(), 'kpng-cli-'));
  try {
    const cfg = join(dir, 'kp.json');
    writeFileSync(cfg, JSON.stringify({ kind: 'KubeProxyConfiguration', apiVersion: 'kubeproxy.config.k8s.io/v1alpha1', clusterCIDR: 'nope' }));
    const r = kpngSync(['file', '--input', EXAMPLE, 'to-local', 'to-log', '--config', cfg, '--once']);
    assert.equal(r.status, 1);
    assert.match(r.stderr, /clusterCIDR/);
    assert.match(r.stderr, /"nope" is not a CIDR/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('--stats prints the original kpng columns', async () => {
  const k = kpngSpawn(['file', '--input', EXAMPLE, '--stats', 'to-local', 'to-log', '--node-name', 'node-a']);
  try {
    await k.until('a stats line', () => /stats:\t\d+\t\d+\t\d+/.test(k.stderr), { timeoutMs: 5000 });
    const header = k.stderr.split('\n').find((l) => l.startsWith('stats:\ttime'))!;
    assert.equal(header, 'stats:\ttime(ms)\tevents\trevisions\tusr-cpu(ms)\tsys-cpu(ms)\tcpu(%)\trss(MiB)\trevs/events(%)');
    const line = k.stderr.split('\n').find((l) => /^stats:\t\d/.test(l))!.split('\t');
    assert.equal(Number(line[2]), 13, 'events: one per object of the example (2 nodes, 1 ServiceCIDR, 5 services, 5 slices)');
    assert.ok(Number(line[7]) > 20, 'RSS in real MiB');
  } finally {
    await k.stop();
  }
});

test('to-local feeds several backends on one stream, each with its own flags (to-log and to-nft --dry-run)', () => {
  const r = kpngSync(['file', '--input', EXAMPLE, '--no-watch', 'to-local', 'to-log', '--node-name', 'node-a', 'to-nft', '--dry-run', '--once']);
  assert.equal(r.status, 0, r.stderr);
  // to-log's ops, then to-nft's transaction, from the same diff
  assert.match(r.stdout, /^\+ ServicesSet demo\/shop /m);
  assert.match(r.stdout, /^add element ip kpng service-ips \{.*10\.96\.0\.30 \. tcp \. 80 comment "demo\/shop:http"/m);
  assert.match(r.stderr, /to-local: starting node=node-a backends=log,nft/);
  // a backend named twice is not offered
  const twice = kpngSync(['file', '--input', EXAMPLE, 'to-local', 'to-nft', '--dry-run', 'to-nft']);
  assert.notEqual(twice.status, 0);
});

test('kpng trace refuses a port that is not written as one, in one line naming the flag (and one naming the help)', async () => {
  const cases: [string, string][] = [['--dport', '0x50'], ['--dport', '1e1'], ['--dport', 'http'], ['--dport', '80.5'], ['--dport', '70000'], ['--dport', '0'], ['--sport', '0x1']];
  const runs = cases.map(([flag, v]) => {
    const args = ['trace', '--src', '10.0.0.2', '--dst', '10.96.0.10', '--dport', '80', ...(flag === '--sport' ? ['--sport', v] : [])];
    if (flag === '--dport') args[args.indexOf('--dport') + 1] = v;
    const k = kpngSpawn(args);
    return k.exited.then((code) => ({ flag, v, code, stderr: k.stderr }));
  });
  for (const r of await Promise.all(runs)) {
    assert.equal(r.code, 1, `${r.flag} ${r.v}: ${r.stderr}`);
    const lines = r.stderr.trim().split('\n');
    assert.deepEqual(lines.slice(1), ['(see kpng trace --help)'], `${r.flag} ${r.v}: the error and the help's name, not\n${r.stderr}`);
    assert.match(lines[0], new RegExp(`option '${r.flag} <port>' argument '${r.v.replace('.', '\\.')}' is invalid\\. not a port`));
  }
});
