// The drift check's kernel side, in a throwaway namespace: nftables' change
// events tell kpng's own transactions (those between the generations read
// around each commit it makes: an nft session's, its netlink batches) from
// anyone else's, also one committed while kpng commits; a pause for a big
// load still notices a foreign transaction (by the generation count); and
// iptables-legacy's table digests move with any change to the rules.
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { pino } from 'pino';
import { NftWatch } from '../../src/backends/shared/nftables/watch.js';
import { NftNetlink } from '../../src/kernel/nftables.js';
import { xtablesDigest } from '../../src/kernel/xtables.js';
import { SessionNft } from '../../src/backends/shared/nftables/nft.js';
import { Transaction, type TableRef } from '../../src/backends/shared/nftables/transaction.js';
import { FAMILIES, setDeclarations } from '../../src/backends/nft/ruleset.js';
import { canUseNetns, createNetns, type TestNetns } from '../helpers/netns.js';

describe('nftables change events', { skip: canUseNetns() }, () => {
  let ns: TestNetns;
  before(() => (ns = createNetns()));
  after(() => ns?.remove());

  /** kpng's nft (sessions; netlink too if asked), its commits noted by a drift watch of one ip table; both closed after */
  async function watching(table: string, by: { netlink?: boolean }, fn: (nft: SessionNft, watch: NftWatch) => Promise<void>): Promise<void> {
    const nft = new SessionNft({ path: ns.wrapper('nft'), netlink: by.netlink ? { netns: ns.name } : undefined });
    const watch = new NftWatch({ ours: (e) => e.table === table && e.family === 2, netns: ns.name, log: pino({ level: 'silent' }) });
    nft.commitsTo(watch);
    try {
      watch.start();
      await fn(nft, watch);
    } finally {
      watch.close();
      nft.close();
    }
  }

  test('each commit kpng makes is one transaction: the generation moves by one', async () => {
    const nl = new NftNetlink(ns.name);
    const nft = new SessionNft({ path: ns.wrapper('nft'), netlink: { netns: ns.name } });
    const table: TableRef = { family: 'ip', name: 'counting' };
    try {
      const commits: [string, () => Promise<unknown> | unknown][] = [
        ['nft -f', () => ns.exec('nft', ['-f', '-'], 'add table ip counting\nadd chain ip counting c\nadd chain ip counting d\n')],
        ['a session line', () => nft.run('add rule ip counting c drop\nadd rule ip counting d drop\n')],
        ['a session include (a big transaction)', () => nft.run(Array.from({ length: 3000 }, (_, i) => `add rule ip counting c ip daddr 10.0.${i >> 8}.${i & 255} drop`).join('\n') + '\n')],
        ['a declaration', () => nft.run(new Transaction().add({ kind: 'set', table, name: 'cluster-ips', body: setDeclarations(FAMILIES[4])['cluster-ips'].body }))],
        ['a netlink batch', () => nft.run(new Transaction().elements('add', table, [{ set: 'cluster-ips', key: '10.9.0.1', value: '', comment: '' }]))],
        ['iptables-nft-restore', () => ns.exec('iptables-nft-restore', ['--noflush', '-w', '5'], '*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -j RETURN\nCOMMIT\n')],
      ];
      for (const [what, commit] of commits) {
        const g0 = nl.generation();
        await commit();
        assert.equal(nl.generation(), g0 + 1, what);
      }
    } finally {
      nft.close();
      nl.close();
    }
  });

  test("kpng's own changes are not drift; anyone else's to its table are; others' tables are not", () =>
    watching('kpng', {}, async (nft, watch) => {
      await nft.run('add table ip kpng\nadd chain ip kpng c\nadd rule ip kpng c drop\n');
      assert.equal(watch.check(), undefined);
      ns.exec('nft', ['add table ip other; add chain ip other x']);
      assert.equal(watch.check(), undefined);
      ns.exec('nft', ['flush chain ip kpng c']);
      assert.match(watch.check() ?? '', /^rule deleted in table ip kpng chain c by nft, generation \d+$/);
      assert.equal(watch.check(), undefined, 'reported once');
      // many of kpng's own (a session's process replaced too): still none
      for (let i = 0; i < 80; i++) await nft.run(`add rule ip kpng c counter\n${i % 20 === 0 ? 'add chain ip kpng bad { type filter hook nowhere priority 0 ; }\n' : ''}`).catch(() => {});
      assert.equal(watch.check(), undefined);
      // a big load of kpng's own, paused: a foreign transaction meanwhile is noticed by the count
      watch.pause();
      await nft.run('add rule ip kpng c drop\n');
      ns.exec('nft', ['add chain ip other y']);
      watch.resume(1);
      assert.match(watch.check() ?? '', /1 transaction\(s\) by another process/);
      watch.start(); // what the read-back does
      watch.pause();
      await nft.run('add rule ip kpng c drop\n');
      watch.resume(1);
      assert.equal(watch.check(), undefined);
    }));

  test("a foreign transaction to kpng's table while kpng commits is drift; one to another table is not", () =>
    watching('kpngw', {}, async (nft, watch) => {
      await nft.run('add table ip kpngw\nadd chain ip kpngw c\n');
      // between the generations read around kpng's commit: two transactions touched kpng's table, kpng made one
      await watch.own(async () => {
        ns.exec('nft', ['add rule ip kpngw c accept']);
        ns.exec('nft', ['add rule ip kpngw c drop']);
      });
      assert.match(watch.check() ?? '', /^1 transaction\(s\) by another process among kpng's own 1 \(generations \d+-\d+\), one of: rule added in table ip kpngw chain c by nft, generation \d+; rule added/);
      await watch.own(async () => {
        ns.exec('nft', ['add table ip elsewhere']);
        ns.exec('nft', ['add rule ip kpngw c drop']);
      });
      assert.equal(watch.check(), undefined);
      // a commit of kpng's that failed is no transaction of its own
      await assert.rejects(
        watch.own(async () => {
          ns.exec('nft', ['add rule ip kpngw c drop']);
          throw new Error('refused');
        }),
      );
      assert.match(watch.check() ?? '', /^1 transaction\(s\) by another process among kpng's own 0/);
    }));

  test('element changes kpng sends over netlink, from this thread or the thread pool, are its own', () => {
    const table: TableRef = { family: 'ip', name: 'kpngn' };
    const ips = (from: number, n: number) => Array.from({ length: n }, (_, i) => ({ set: 'cluster-ips', key: `10.${(from + i) >> 16}.${((from + i) >> 8) & 255}.${(from + i) & 255}`, value: '', comment: '' }));
    return watching('kpngn', { netlink: true }, async (nft, watch) => {
      const header = new Transaction().add({ kind: 'table', ...table }).add({ kind: 'set', table, name: 'cluster-ips', body: setDeclarations(FAMILIES[4])['cluster-ips'].body });
      await nft.run(header);
      const g0 = new NftNetlink(ns.name);
      const before = g0.generation();
      // a change's few elements (sent from here), then a sync's many (a batch past 16 KiB: from the pool)
      await nft.run(new Transaction().elements('add', table, ips(1, 3)));
      await nft.run(new Transaction().elements('add', table, ips(100, 3000)).elements('delete', table, ips(1, 1)));
      assert.equal(g0.generation(), before + 2, 'two transactions, neither through nft');
      g0.close();
      assert.match(ns.exec('nft', ['list', 'set', 'ip', 'kpngn', 'cluster-ips']), /10\.0\.8\.52/);
      assert.equal(watch.check(), undefined);
      ns.exec('nft', ['add element ip kpngn cluster-ips { 192.0.2.1 }']);
      assert.match(watch.check() ?? '', /^element added in table ip kpngn set cluster-ips by nft, generation \d+$/);
    });
  });
});

describe('iptables-legacy table digests', { skip: canUseNetns() ?? (spawnSync('which', ['iptables-legacy']).status === 0 ? undefined : 'needs iptables-legacy') }, () => {
  let ns: TestNetns;
  before(() => (ns = createNetns()));
  after(() => ns?.remove());

  test('move with a rule added or deleted, and with a rule replaced by one of the same size; not with its counters', async () => {
    const ipt = (...args: string[]) => ns.exec('iptables-legacy', ['-w', '5', '-t', 'nat', ...args]);
    ipt('-N', 'KUBE-SEP-TEST');
    ipt('-A', 'KUBE-SEP-TEST', '-s', '10.1.0.1/32', '-j', 'MARK', '--set-xmark', '0x4000/0x4000');
    ipt('-A', 'KUBE-SEP-TEST', '-p', 'tcp', '-j', 'DNAT', '--to-destination', '10.1.0.1:8080');
    const a = await xtablesDigest(4, 'nat', ns.name);
    assert.ok(a);
    ipt('-A', 'KUBE-SEP-TEST', '-j', 'RETURN');
    const b = await xtablesDigest(4, 'nat', ns.name);
    assert.equal(b?.entries, a.entries + 1);
    ipt('-D', 'KUBE-SEP-TEST', '-j', 'RETURN');
    assert.deepEqual(await xtablesDigest(4, 'nat', ns.name), a);
    // the same size, another destination
    ipt('-R', 'KUBE-SEP-TEST', '2', '-p', 'tcp', '-j', 'DNAT', '--to-destination', '10.66.6.66:8080');
    const c = await xtablesDigest(4, 'nat', ns.name);
    assert.deepEqual([c?.entries, c?.size], [a.entries, a.size]);
    assert.notEqual(c?.digest, a.digest);
    // packets through the chain move its counters, not the digest
    ns.exec('ip', ['link', 'set', 'lo', 'up']);
    ipt('-A', 'OUTPUT', '-j', 'KUBE-SEP-TEST');
    const d = await xtablesDigest(4, 'nat', ns.name);
    // (a connection attempt to a closed port: a packet through the nat table's OUTPUT)
    spawnSync('ip', ['netns', 'exec', ns.name, 'bash', '-c', 'exec 3<>/dev/tcp/127.0.0.1/1'], { timeout: 5000 });
    assert.match(ipt('-L', 'OUTPUT', '-v', '-n', '-x'), /^\s+[1-9]\d*\s+\d+\s+KUBE-SEP-TEST/m);
    assert.deepEqual(await xtablesDigest(4, 'nat', ns.name), d);
    assert.equal(await xtablesDigest(4, 'no-such-table', ns.name), undefined);
    assert.ok(await xtablesDigest(6, 'nat', ns.name));
  });
});
