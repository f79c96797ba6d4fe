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
