// kpng trace lists, at each hook the packet passes, every table's base
// chains by priority: kpng's, its tenants' (kpng.<tenant>.*), anyone else's.
// Without root: kpng's table as a lab node held it (test/fixtures/trace),
// and a chain listing with a tenant and a firewall beside kpng.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { trace, formatTrace, type Exec } from '../../src/trace/index.js';

const FIX = fileURLToPath(new URL('../fixtures/trace/', import.meta.url));
const read = (f: string) => readFileSync(FIX + f, 'utf8');

const chain = (family: string, table: string, name: string, hook: string, prio: number, type = 'filter') => ({ chain: { family, table, name, handle: 1, type, hook, prio, policy: 'accept' } });
const chains = JSON.stringify({
  nftables: [
    { metainfo: { version: '1.0.6' } },
    chain('ip', 'kpng', 'nat-prerouting', 'prerouting', -100, 'nat'),
    chain('ip', 'kpng', 'filter-forward', 'forward', 0),
    chain('ip', 'kpng', 'nat-postrouting', 'postrouting', 100, 'nat'),
    chain('inet', 'kpng.netpol.policy', 'postrouting', 'postrouting', 95),
    chain('inet', 'firewalld', 'filter_FORWARD', 'forward', 10),
    chain('ip6', 'kpng', 'nat-postrouting', 'postrouting', 100, 'nat'),
    { chain: { family: 'inet', table: 'kpng.netpol.policy', name: 'check', handle: 2 } },
  ],
});

const tools: Exec = async (argv) => {
  const files: Record<string, string> = {
    'nft -j list table ip kpng': read('etp-local.nft.json'),
    'nft -a list table ip kpng': read('etp-local.nft.txt'),
    'ip -j -4 route show table local': read('etp-local.routes.json'),
    'nft -j list chains': chains,
  };
  const out = files[argv.join(' ')];
  return out === undefined ? { code: 1, stdout: '', stderr: 'no such table' } : { code: 0, stdout: out, stderr: '' };
};

test("kpng trace lists the tenants' and others' base chains around kpng's own, at each hook the packet passes", async () => {
  const t = await trace({ src: '203.0.113.2', dst: '1.2.3.4', dport: 80 }, tools);
  const post = t.hooks?.find((h) => h.hook === 'postrouting');
  assert.deepEqual(
    post?.chains.map((c) => `${c.priority} ${c.family} ${c.table} ${c.chain} ${c.owner}`),
    ['95 inet kpng.netpol.policy postrouting tenant netpol', '100 ip kpng nat-postrouting kpng'],
    'by priority, IPv4 and inet tables only, regular chains left out',
  );
  const fwd = t.hooks?.find((h) => h.hook === 'forward');
  assert.deepEqual(fwd?.chains.map((c) => c.owner), ['kpng', 'other']);
  assert.deepEqual(t.hooks?.map((h) => h.hook).slice(0, 1), ['prerouting'], 'in the order the packet passes them');
  const text = formatTrace(t);
  assert.match(text, /postrouting:\n\s+95 {2}inet kpng\.netpol\.policy postrouting\s+filter\s+tenant netpol\n\s+100 {2}ip kpng nat-postrouting\s+nat\s+kpng/);
});
