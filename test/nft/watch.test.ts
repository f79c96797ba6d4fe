// The drift check's kernel side, in a throwaway namespace: nftables' change
// events tell kpng's own transactions (by pid: nft's; by netlink port: what
// it sends over netlink itself) from anyone else's, a pause
// for a big load still notices a foreign transaction (by the generation
// count), and iptables-legacy's table sizes move with any change.
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { pino } from 'pino';
import { NftWatch } from '../../src/backends/shared/nftables/watch.js';
import { NftNetlink } from '../../src/kernel/nftables.js';
import { xtablesInfo } from '../../src/kernel/xtables.js';
import { SessionNft } from '../../src/backends/shared/nftables/nft.js';
import { Transaction, type TableRef } from '../../src/backends/shared/nftables/transaction.js';
import { FAMILIES, setDeclarations } from '../../src/backends/nft/ruleset.js';
import { canUseNetns, createNetns, type TestNetns } from '../helpers/netns.js';

describe('nftables change events', { skip: canUseNetns() }, () => {
  let ns: TestNetns;
  before(() => (ns = createNetns()));
  after(() => ns?.remove());

  /** kpng's nft (sessions; netlink too if asked) and a drift watch of one ip table that knows kpng's own by pid, port or both; both closed after */
  async function watching(table: string, by: { pid?: boolean; port?: boolean; netlink?: boolean }, fn: (nft: SessionNft, watch: NftWatch) => Promise<void>): Promise<void> {
    const nft = new SessionNft({ path: ns.wrapper('nft'), netlink: by.netlink ? { netns: ns.name } : undefined });
    const watch = new NftWatch({
      ours: (e) => e.table === table && e.family === 2,
      ownsPid: (pid) => (by.pid ?? true) && nft.ownsPid(pid),
      ownsPort: by.port ? (port) => nft.ownsPort(port) : undefined,
      netns: ns.name,
      log: pino({ level: 'silent' }),
    });
    try {
      watch.start();
      await fn(nft, watch);
    } finally {
      watch.close();
      nft.close();
    }
  }

  test('the generation moves by one per committed transaction', () => {
    const nl = new NftNetlink(ns.name);
    try {
      const g0 = nl.generation();
      ns.exec('nft', ['add table ip counting']);
      ns.exec('nft', ['add chain ip counting c; add chain ip counting d']);
      assert.equal(nl.generation(), g0 + 2);
    } finally {
      nl.close();
    }
  });

  test("kpng's own changes are not drift; anyone else's to its table are; others' tables are not", () =>
    watching('kpng', { pid: true }, async (nft, watch) => {
      await nft.run('add table ip kpng\nadd chain ip kpng c\nadd rule ip kpng c drop\n');
      assert.equal(watch.check(), undefined);
      ns.exec('nft', ['add table ip other; add chain ip other x']);
      assert.equal(watch.check(), undefined);
      ns.exec('nft', ['flush chain ip kpng c']);
      assert.match(watch.check() ?? '', /changed by process \d+ \(nft\)/);
      assert.equal(watch.check(), undefined, 'reported once');
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

  test("kpng's own nft is known by its netlink port too (in a container's pid namespace the pid the kernel names is not the one kpng sees)", () =>
    watching('kpngp', { pid: false, port: true }, async (nft, watch) => {
      await nft.run('add table ip kpngp\nadd chain ip kpngp c\nadd rule ip kpngp c drop\n');
      await nft.run('add rule ip kpngp c drop\n');
      assert.equal(watch.check(), undefined);
      ns.exec('nft', ['flush chain ip kpngp c']);
      assert.match(watch.check() ?? '', /changed by process \d+ \(nft\)/);
    }));

  test('in a pid namespace of its own (a pod without hostPID), kpng knows its nft by port: by pid alone, its own change read as drift', () => {
    const run = (by: string) => {
      const r = spawnSync('unshare', ['--pid', '--fork', '--mount-proc', process.execPath, '--import', 'tsx', fileURLToPath(new URL('../helpers/pidns-watch.ts', import.meta.url)), ns.name, ns.wrapper('nft'), by], { encoding: 'utf8', timeout: 60_000 });
      assert.equal(r.status, 0, r.stderr);
      ns.exec('nft', ['delete table ip kpngns']);
      return JSON.parse(r.stdout) as { drift: string | null; self: number };
    };
    const byPid = run('pid');
    // (the kernel names the host's pid of nft, not the one kpng saw at spawn)
    assert.match(byPid.drift ?? '', /changed by process \d+ \(nft\)/);
    assert.ok(byPid.self < 10, `the child is an early process of its own pid namespace (${byPid.self})`);
    assert.equal(run('port').drift, null);
  });

  test("element changes kpng sends over netlink, from this thread or the thread pool, are its own (by its socket's port)", () => {
    const table: TableRef = { family: 'ip', name: 'kpngw' };
    const ips = (from: number, n: number) => Array.from({ length: n }, (_, i) => ({ set: 'cluster-ips', key: `10.${(from + i) >> 16}.${((from + i) >> 8) & 255}.${(from + i) & 255}`, value: '', comment: '' }));
    return watching('kpngw', { pid: true, port: true, netlink: true }, async (nft, watch) => {
      const header = new Transaction().add({ kind: 'table', ...table }).add({ kind: 'set', table, name: 'cluster-ips', body: setDeclarations(FAMILIES[4])['cluster-ips'].body });
      await nft.run(header);
      const g0 = new NftNetlink(ns.name);
      const before = g0.generation();
      // a change's few elements (sent from here), then a sync's many (a batch past 16 KiB: from the pool)
      await nft.run(new Transaction().elements('add', table, ips(1, 3)));
      await nft.run(new Transaction().elements('add', table, ips(100, 3000)).elements('delete', table, ips(1, 1)));
      assert.equal(g0.generation(), before + 2, 'two transactions, neither through nft');
      g0.close();
      assert.match(ns.exec('nft', ['list', 'set', 'ip', 'kpngw', 'cluster-ips']), /10\.0\.8\.52/);
      assert.equal(watch.check(), undefined);
      ns.exec('nft', ['add element ip kpngw cluster-ips { 192.0.2.1 }']);
      assert.match(watch.check() ?? '', /changed by process \d+ \(nft\)/);
    });
  });
});

describe('iptables-legacy table sizes', { skip: canUseNetns() ?? (spawnSync('which', ['iptables-legacy']).status === 0 ? undefined : 'needs iptables-legacy') }, () => {
  let ns: TestNetns;
  before(() => (ns = createNetns()));
  after(() => ns?.remove());

  test('move with a rule added or deleted', () => {
    ns.exec('iptables-legacy', ['-t', 'nat', '-N', 'KUBE-TEST']);
    const a = xtablesInfo(4, 'nat', ns.name);
    ns.exec('iptables-legacy', ['-t', 'nat', '-A', 'KUBE-TEST', '-j', 'RETURN']);
    const b = xtablesInfo(4, 'nat', ns.name);
    assert.ok(a && b);
    assert.equal(b.entries, a.entries + 1);
    ns.exec('iptables-legacy', ['-t', 'nat', '-D', 'KUBE-TEST', '-j', 'RETURN']);
    assert.deepEqual(xtablesInfo(4, 'nat', ns.name), a);
  });
});
