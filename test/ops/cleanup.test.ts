// kpng cleanup removes what kpng installed, and nothing else.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { canUseNetns, createNetns } from '../helpers/netns.js';
import { KPNG, ROOT } from '../helpers/cli.js';

test('kpng cleanup in a namespace leaves a foreign table untouched', { skip: canUseNetns() }, () => {
  const ns = createNetns();
  try {
    const kpng = (...args: string[]) => spawnSync('ip', ['netns', 'exec', ns.name, ...KPNG, ...args], { cwd: ROOT, encoding: 'utf8', timeout: 60_000 });
    const foreign = 'table inet foreign {\n\tchain input {\n\t\ttype filter hook input priority filter; policy accept;\n\t\ttcp dport 22 accept\n\t}\n}\n';
    ns.exec('nft', ['-f', '-'], foreign);
    const applied = kpng('file', '--input', join(ROOT, 'examples/cluster.yaml'), '--node-name', 'node-a', 'to-local', 'to-nft', '--once');
    assert.equal(applied.status, 0, applied.stderr);
    assert.match(ns.exec('nft', ['list', 'tables']), /table ip kpng/);

    const r = kpng('cleanup');
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /removed nftables table ip kpng/);
    assert.match(r.stdout, /removed nftables table ip6 kpng/);
    assert.equal(ns.exec('nft', ['list', 'tables']).trim(), 'table inet foreign');
    assert.equal(ns.exec('nft', ['list', 'table', 'inet', 'foreign']), foreign);
    // and a second cleanup finds nothing to do
    const again = kpng('cleanup');
    assert.equal(again.status, 0, again.stderr);
    assert.doesNotMatch(again.stdout, /removed/);
  } finally {
    ns.remove();
  }
});

test('kpng cleanup removes the iptables backend chains and jumps, not foreign or kubelet chains', { skip: canUseNetns() }, () => {
  const ns = createNetns();
  try {
    const kpng = (...args: string[]) => spawnSync('ip', ['netns', 'exec', ns.name, ...KPNG, ...args], { cwd: ROOT, encoding: 'utf8', timeout: 60_000 });
    // a foreign chain jumped to from INPUT, and kubelet's KUBE-FIREWALL
    for (const args of [['-N', 'FOREIGN'], ['-A', 'INPUT', '-j', 'FOREIGN'], ['-N', 'KUBE-FIREWALL'], ['-A', 'OUTPUT', '-j', 'KUBE-FIREWALL']]) ns.exec('iptables-nft', args);
    const applied = kpng('file', '--input', join(ROOT, 'examples/cluster.yaml'), '--node-name', 'node-a', 'to-local', 'to-iptables', '--iptables-mode', 'nft', '--once');
    assert.equal(applied.status, 0, applied.stderr);
    assert.match(ns.exec('iptables-nft-save', []), /-A KUBE-SERVICES/);

    const r = kpng('cleanup', '--backend', 'iptables');
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /removed iptables-nft chains .*nat\/KUBE-SERVICES/);
    const after = ns.exec('iptables-nft-save', []);
    assert.doesNotMatch(after, /KUBE-(SERVICES|NODEPORTS|POSTROUTING|MARK-MASQ|SVC-|SEP-|EXT-|FORWARD|EXTERNAL-SERVICES|PROXY-FIREWALL|PROXY-CANARY)/);
    assert.match(after, /-A INPUT -j FOREIGN/);
    assert.match(after, /-A OUTPUT -j KUBE-FIREWALL/);
  } finally {
    ns.remove();
  }
});
