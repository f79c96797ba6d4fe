// What the command line says when the operator erred, as real processes: a
// usage error is two lines (the error, where the help is); a mistyped
// backend is matched against the real names and kube-proxy's; a backend
// named where a sink goes says where it goes; every missing required flag
// at once; a failure printed once, without timestamp or stack; kpng get with
// no kpng running says so; wrong setups (a missing --input read once, a
// config mode another backend runs, a node name no Node has) are said.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { KPNG, kpngSync, ROOT } from '../helpers/cli.js';

const EXAMPLE = join(ROOT, 'examples/cluster.yaml');
const lines = (s: string) => s.trimEnd().split('\n');

function usageError(args: string[]): string[] {
  const r = kpngSync(args);
  assert.equal(r.status, 1, `kpng ${args.join(' ')}: ${r.stderr}`);
  assert.equal(r.stdout, '');
  const out = lines(r.stderr);
  assert.equal(out.length, 2, `kpng ${args.join(' ')}:\n${r.stderr}`);
  return out;
}

/** a failure: one line "error: ...", no timestamp, no stack */
function failure(args: string[]): string {
  const r = kpngSync(args);
  assert.equal(r.status, 1, `kpng ${args.join(' ')}: ${r.stderr}`);
  const out = lines(r.stderr);
  assert.equal(out.length, 1, `kpng ${args.join(' ')}:\n${r.stderr}`);
  assert.match(out[0]!, /^error: /);
  return out[0]!;
}

test('a mistyped backend is matched against the real names and kube-proxy modes; the help is named, not printed', () => {
  assert.deepEqual(usageError(['file', '-i', EXAMPLE, 'to-local', 'to-nftables']), ["error: unknown command 'to-nftables'; did you mean to-nft?", '(see kpng file to-local --help)']);
  assert.deepEqual(usageError(['file', '-i', EXAMPLE, 'to-local', 'to-iptabels']), ["error: unknown command 'to-iptabels'; did you mean to-iptables?", '(see kpng file to-local --help)']);
  // beside another backend too
  assert.deepEqual(usageError(['file', '-i', EXAMPLE, 'to-local', 'to-ebpf', 'to-nftables']), ["error: unknown command 'to-nftables'; did you mean to-nft?", '(see kpng file to-local to-ebpf --help)']);
  const [bogus] = usageError(['file', '-i', EXAMPLE, 'to-local', 'to-bogus']);
  assert.equal(bogus, "error: unknown command 'to-bogus'");
});

test('a backend where a sink goes says it goes under to-local', () => {
  assert.deepEqual(usageError(['kube', 'to-nft']), ["error: unknown command 'to-nft'; to-nft is a backend, it goes under to-local: kpng kube to-local to-nft", '(see kpng kube --help)']);
  assert.match(usageError(['to-iptables'])[0]!, /to-iptables is a backend: kpng kube to-local to-iptables, or kpng local --api ADDRESS to-iptables/);
});

test('usage errors are two lines: a missing flag, a missing sink, an unknown flag', () => {
  assert.deepEqual(usageError(['file', 'to-file']), ["error: required option '-i, --input <path>' not specified", '(see kpng file --help)']);
  assert.deepEqual(usageError(['kube']), ['error: kpng kube needs one of: to-file, to-local, to-api', '(see kpng kube --help)']);
  assert.deepEqual(usageError(['file', '-i', EXAMPLE, 'to-local', 'to-log', '--bogus']), ["error: unknown option '--bogus'", '(see kpng file to-local to-log --help)']);
});

test('kpng trace names every missing required flag at once', () => {
  assert.deepEqual(usageError(['trace']), ["error: required options '--src <ip>', '--dst <ip>', '--dport <port>' not specified", '(see kpng trace --help)']);
  assert.deepEqual(usageError(['trace', '--src', '10.0.0.1']), ["error: required options '--dst <ip>', '--dport <port>' not specified", '(see kpng trace --help)']);
});

test('--dport that is not a port is refused: the error, then where the help is', () => {
  assert.deepEqual(usageError(['trace', '--src', '10.0.0.1', '--dst', '10.0.0.2', '--dport', 'http']), ["error: option '--dport <port>' argument 'http' is invalid. not a port (a decimal number, 1-65535)", '(see kpng trace --help)']);
});

test('a failure is printed once, without timestamp or stack', () => {
  assert.equal(failure(['cleanup', '--backend', 'nftables']), 'error: unknown backend nftables; did you mean nft? (backends: nft, iptables, ipvs, userspace, ebpf)');
  assert.equal(failure(['demo', '--backend', 'iptables']), 'error: kpng demo: --backend "iptables": one of nft, userspace, ebpf');
  // --log-format json: one record, no stack
  const r = kpngSync(['--log-format', 'json', 'cleanup', '--backend', 'nftables']);
  assert.equal(r.status, 1);
  const records = lines(r.stderr).map((l) => JSON.parse(l));
  assert.equal(records.length, 1);
  assert.equal(records[0].level, 50);
  assert.match(records[0].msg, /^unknown backend nftables/);
  assert.equal(records[0].stack, undefined);
});

test('kpng get with no kpng running says so, and where it looked', () => {
  // a private mount namespace with an empty /run: no kpng's socket whatever runs on this host;
  // the default run directory, not the one the test runner gives kpng
  const env = { ...process.env, KPNG_RUN_DIR: '' };
  const r = spawnSync('unshare', ['--mount', '--propagation', 'private', 'sh', '-c', `mount -t tmpfs tmpfs /run && exec "$@"`, 'sh', ...KPNG, 'get', 'services'], { cwd: ROOT, encoding: 'utf8', timeout: 30_000, env });
  assert.equal(r.status, 1, r.stderr);
  assert.equal(r.stderr, 'error: no kpng is running here (looked at /run/kpng/node.sock and /run/kpng/brain.sock); start one or use --socket/--api\n');
  const dir = mkdtempSync(join(tmpdir(), 'kpng-get-'));
  try {
    assert.equal(failure(['get', 'services', '--socket', join(dir, 'node.sock')]), `error: nothing answers at unix://${join(dir, 'node.sock')} (no such socket): no kpng runs there`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('kpng --version', () => {
  for (const flag of ['--version', '-V']) {
    const r = kpngSync([flag]);
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /^kpng \d+\.\d+\.\d+ \(node v\d+/);
  }
});

test('an --input that does not exist, read once, is an error', () => {
  const missing = join(tmpdir(), 'kpng-no-such-input.yaml');
  for (const args of [
    ['file', '--input', missing, 'to-local', 'to-log', '--once'],
    ['file', '--input', missing, 'to-file', '--output', '-', '--once'],
    ['file', '--input', missing, '--no-watch', 'to-file', '--output', '-'],
  ]) {
    assert.equal(failure(args), `error: invalid configuration: --input: ${missing}: no such file or directory`);
  }
});

test('a configuration mode another backend runs is said once, with the fix', () => {
  const dir = mkdtempSync(join(tmpdir(), 'kpng-mode-'));
  try {
    const cfg = join(dir, 'kube-proxy.yaml');
    writeFileSync(cfg, 'apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ipvs\n');
    const r = kpngSync(['file', '--input', EXAMPLE, 'to-local', 'to-nft', '--dry-run', '--once', '--node-name', 'node-a', '--config', cfg]);
    assert.equal(r.status, 0, r.stderr);
    const warns = lines(r.stderr).filter((l) => / WARN /.test(l) && /mode/.test(l));
    assert.deepEqual(warns.map((l) => l.replace(/^\S+ WARN /, '')), [`--config ${cfg}: mode: ipvs is ignored (this process runs to-nft); the backend is chosen on the command line: to-ipvs`]);
    // the mode the backend runs: nothing said
    writeFileSync(cfg, 'apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\n');
    const ok = kpngSync(['file', '--input', EXAMPLE, 'to-local', 'to-nft', '--dry-run', '--once', '--node-name', 'node-a', '--config', cfg]);
    assert.doesNotMatch(ok.stderr, /mode/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a node name no Node has is said once the state is complete, with the fix', () => {
  const r = kpngSync(['file', '--input', EXAMPLE, 'to-local', 'to-nft', '--dry-run', '--once', '--node-name', 'nodee-a']);
  assert.equal(r.status, 0, r.stderr);
  const warns = lines(r.stderr).filter((l) => /nodee-a: the cluster has no Node of this name; check --node-name/.test(l));
  assert.equal(warns.length, 1, r.stderr);
  const known = kpngSync(['file', '--input', EXAMPLE, 'to-local', 'to-nft', '--dry-run', '--once', '--node-name', 'node-a']);
  assert.doesNotMatch(known.stderr, /no Node of this name/);
});
