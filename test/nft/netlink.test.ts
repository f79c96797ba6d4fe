// Elements over netlink against nft itself: the same transaction applied as
// a netlink batch in one throwaway namespace and as nft's text in another
// must leave tables that nft lists the same; a batch the kernel refuses
// changes nothing; what netlink cannot say goes to nft.
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { layoutOf, NetlinkElements, NetlinkRefused } from '../../src/backends/shared/nftables/netlink.js';
import { ProcessNft } from '../../src/backends/shared/nftables/nft.js';
import { Transaction, type ElementData, type TableRef } from '../../src/backends/shared/nftables/transaction.js';
import { FAMILIES, setDeclarations } from '../../src/backends/nft/ruleset.js';
import { canUseNetns, createNetns, type TestNetns } from '../helpers/netns.js';

test('set layouts: the plain concatenations kpng declares, nothing with intervals or timeouts', () => {
  assert.deepEqual(layoutOf('type ipv4_addr . inet_proto . inet_service : verdict ;'), { key: ['ipv4', 'proto', 'port'], data: 'verdict' });
  assert.deepEqual(layoutOf('typeof ip6 daddr . meta l4proto . th dport . numgen random mod 1 : ip6 daddr . tcp dport ;'), { key: ['ipv6', 'proto', 'port', 'host32'], data: ['ipv6', 'port'] });
  assert.deepEqual(layoutOf('type ipv4_addr . ipv4_addr ;'), { key: ['ipv4', 'ipv4'] });
  assert.equal(layoutOf('type ipv4_addr ; flags interval ;'), undefined);
  assert.equal(layoutOf('type ipv4_addr ; flags dynamic,timeout ; timeout 1d ;'), undefined);
  assert.equal(layoutOf('type ether_addr ;'), undefined);
  assert.equal(layoutOf('typeof ip daddr : meta mark ;'), undefined);
  // every declaration of kpng's table has a layout, but the interval sets
  for (const f of [FAMILIES[4], FAMILIES[6]]) {
    for (const [name, d] of Object.entries(setDeclarations(f))) assert.equal(layoutOf(d.body) === undefined, d.body.includes('interval'), name);
  }
});

describe('elements over netlink, against nft', { skip: canUseNetns() }, () => {
  let viaNetlink: TestNetns;
  let viaText: TestNetns;
  before(() => {
    viaNetlink = createNetns();
    viaText = createNetns();
  });
  after(() => {
    viaNetlink?.remove();
    viaText?.remove();
  });

  const v4: TableRef = { family: 'ip', name: 'kpngnl' };
  const v6: TableRef = { family: 'ip6', name: 'kpngnl' };
  /** the tables, their sets and maps, and a chain for verdicts */
  const header = () => {
    const tx = new Transaction();
    for (const [table, f] of [[v4, FAMILIES[4]], [v6, FAMILIES[6]]] as const) {
      tx.add({ kind: 'table', ...table });
      for (const name of ['lb-cluster-tcp-2', 'external-policy-local']) tx.add({ kind: 'chain', table, name });
      for (const [name, d] of Object.entries(setDeclarations(f))) tx.add({ kind: d.kind, table, name, body: d.body });
    }
    return tx;
  };
  const el = (set: string, key: string, value = '', comment = ''): ElementData => ({ set, key, value, comment });
  /** elements of every kind of set kpng fills, both families, odd addresses too */
  const elements = (): [ElementData[], ElementData[]] => {
    const a: ElementData[] = [];
    const b: ElementData[] = [];
    for (let i = 0; i < 300; i++) {
      const ip = `172.30.${i >> 8}.${i & 255}`;
      a.push(el('cluster-ips', ip));
      a.push(el('service-ips', `${ip} . tcp . 80`, 'goto lb-cluster-tcp-2', `ns/svc-${i}:http`));
      a.push(el('cluster-endpoints-tcp', `${ip} . tcp . 80 . 0`, `10.1.${i >> 8}.${i & 255} . 8080`));
      a.push(el('cluster-endpoints-tcp', `${ip} . tcp . 80 . 1`, `10.2.${i >> 8}.${i & 255} . 65535`));
      a.push(el('nodeport-local-endpoints-udp', `udp . ${30000 + i} . 4294967295`, `10.3.0.${i & 255} . 53`));
      a.push(el('no-endpoint-services', `${ip} . udp . 53`, 'drop', 'ns/x:dns'));
      a.push(el('firewall-ips', `${ip} . sctp . 9`));
      a.push(el('hairpin', `10.1.0.${i & 255} . 10.1.0.${i & 255}`));
      const ip6 = `fd00::${i.toString(16)}`;
      b.push(el('cluster-ips', ip6));
      b.push(el('service-ips', `${ip6} . tcp . 443`, 'goto external-policy-local', `ns/v6-${i}:https`));
      b.push(el('local-endpoints-tcp', `${ip6} . tcp . 443 . ${i}`, `2001:db8:0:1:2:3:4:${i.toString(16)} . 8443`));
      b.push(el('service-nodeports', `tcp . ${31000 + i}`, 'jump lb-cluster-tcp-2'));
    }
    b.push(el('cluster-ips', '::ffff:192.0.2.1'), el('cluster-ips', '::'), el('hairpin', '64:ff9b::c633:6407 . fe80::1'));
    return [a, b];
  };
  const listing = (ns: TestNetns) =>
    ['ip', 'ip6']
      .map((f) => ns.exec('nft', ['list', 'table', f, 'kpngnl']))
      .join('')
      .split('\n')
      .sort()
      .join('\n');

  test('a batch of adds, then one of deletes, leave what nft leaves', async () => {
    const nl = new NetlinkElements(viaNetlink.name);
    try {
      const h = header();
      viaNetlink.exec('nft', ['-f', '-'], h.render());
      viaText.exec('nft', ['-f', '-'], h.render());
      nl.learn(h);
      const [a, b] = elements();
      const adds = new Transaction().elements('add', v4, a).elements('add', v6, b);
      assert.ok(nl.takes(adds));
      assert.ok((await nl.run(adds)) > 0);
      viaText.exec('nft', ['-f', '-'], adds.render());
      const full = listing(viaText);
      assert.match(full, /172\.30\.1\.43 \. tcp \. 80 comment "ns\/svc-299:http" : goto lb-cluster-tcp-2/);
      assert.equal(listing(viaNetlink), full);
      const deletes = new Transaction().elements('delete', v4, a.filter((_, i) => i % 3 === 0)).elements('delete', v6, b.filter((_, i) => i % 2 === 1));
      await nl.run(deletes);
      viaText.exec('nft', ['-f', '-'], deletes.render());
      const after = listing(viaText);
      assert.notEqual(after, full);
      assert.equal(listing(viaNetlink), after);
    } finally {
      nl.close();
    }
  });

  test("whether a table is there, asked without nft, in the namespace's own family; ProcessNft's listing of a missing table runs no nft", async () => {
    const ns = createNetns();
    const nl = new NetlinkElements(ns.name);
    const dir = mkdtempSync(join(tmpdir(), 'kpng-nl-'));
    try {
      assert.equal(await nl.hasTable('ip', 'kpngq'), false);
      ns.exec('nft', ['add', 'table', 'ip', 'kpngq']);
      assert.equal(await nl.hasTable('ip', 'kpngq'), true);
      assert.equal(await nl.hasTable('ip6', 'kpngq'), false);
      assert.equal(await nl.hasTable('inet', 'kpngq'), false);
      const elsewhere = new NetlinkElements(viaText.name);
      assert.equal(await elsewhere.hasTable('ip', 'kpngq'), false, 'asked in its own namespace');
      elsewhere.close();
      // an nft that counts its runs
      const path = join(dir, 'nft');
      writeFileSync(path, `#!/bin/sh\necho >> ${path}.runs\nexec ${ns.wrapper('nft')} "$@"\n`);
      chmodSync(path, 0o755);
      const runs = () => (existsSync(`${path}.runs`) ? readFileSync(`${path}.runs`, 'utf8').length : 0);
      const p = new ProcessNft({ path, netlink: { netns: ns.name } });
      try {
        assert.equal(await p.list('ip6', 'kpngq'), undefined);
        assert.equal(runs(), 0);
        assert.deepEqual((await p.list('ip', 'kpngq'))?.chains, new Set());
        assert.equal(runs(), 1);
      } finally {
        p.close();
      }
    } finally {
      nl.close();
      ns.remove();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test('a batch the kernel refuses changes nothing; what netlink cannot say is refused before sending', async () => {
    const nl = new NetlinkElements(viaNetlink.name);
    try {
      nl.learn(header());
      const before = listing(viaNetlink);
      // the last element jumps to a chain that is not there: the whole batch goes
      const bad = new Transaction().elements('add', v4, [el('cluster-ips', '198.51.100.1'), el('service-ips', '198.51.100.1 . tcp . 1', 'goto no-such-chain')]);
      await assert.rejects(nl.run(bad), NetlinkRefused);
      assert.equal(listing(viaNetlink), before);
      for (const key of ['198.51.100.256 . tcp . 1', '198.51.100.2 . tcp', '198.51.100.2 . tcp . 1 . 2', '198.51.100.2 . tcp . 65536', 'fd00::1 . tcp . 1']) {
        await assert.rejects(nl.run(new Transaction().elements('add', v4, [el('service-ips', key, 'drop')])), NetlinkRefused, key);
      }
      // not for it: unknown sets, interval sets, anything but elements
      assert.equal(nl.takes(new Transaction().elements('add', v4, [el('elsewhere', '1.2.3.4')])), false);
      assert.equal(nl.takes(new Transaction().elements('add', v4, [el('service-cidrs', '10.0.0.0/8')])), false);
      assert.equal(nl.takes(new Transaction().elements('add', v4, [el('cluster-ips', '1.2.3.4')]).add({ kind: 'chain', table: v4, name: 'x' })), false);
      assert.equal(listing(viaNetlink), before);
    } finally {
      nl.close();
    }
  });

  test("ProcessNft: element-only transactions over netlink (a bulk load's big ones, a sync's any); the rest, and refusals, through nft", async () => {
    const ns = createNetns();
    const warnings: string[] = [];
    // nft, counting what it is given
    const calls = join(mkdtempSync(join(tmpdir(), 'kpng-nl-')), 'calls');
    const counting = `${calls}.sh`;
    writeFileSync(counting, `#!/bin/sh\necho "$@" >> ${calls}\nexec ${ns.wrapper('nft')} "$@"\n`);
    chmodSync(counting, 0o755);
    const runs = () => (existsSync(calls) ? readFileSync(calls, 'utf8').split('\n').length - 1 : 0);
    const nft = new ProcessNft({ path: counting, netlink: { netns: ns.name }, onNetlinkFallback: (m) => warnings.push(m) });
    try {
      await nft.run(header());
      assert.equal(runs(), 1);
      const [a, b] = elements();
      // 2,400 elements in one go, part of a bulk load: no nft
      await nft.run(new Transaction().elements('add', v4, a), { bulk: true });
      assert.equal(runs(), 1);
      // a few: nft (a batch of its own costs more than nft's parsing of them)
      await nft.run(new Transaction().elements('add', v4, [el('cluster-ips', '198.51.100.3')]), { bulk: true });
      assert.equal(runs(), 2);
      // a sync's element changes, few or many: netlink
      await nft.run(new Transaction().elements('add', v6, b));
      await nft.run(new Transaction().elements('delete', v4, [el('cluster-ips', '198.51.100.3')]).elements('add', v4, [el('cluster-ips', '198.51.100.4')]));
      assert.equal(runs(), 2);
      assert.match(ns.exec('nft', ['list', 'set', 'ip', 'kpngnl', 'cluster-ips']), /198\.51\.100\.4/);
      assert.doesNotMatch(ns.exec('nft', ['list', 'set', 'ip', 'kpngnl', 'cluster-ips']), /198\.51\.100\.3/);
      assert.match(ns.exec('nft', ['list', 'map', 'ip6', 'kpngnl', 'local-endpoints-tcp']), /fd00::12b \. tcp \. 443 \. 299 : 2001:db8:0:1:2:3:4:12b \. 8443/);
      // anything but elements: nft
      await nft.run(new Transaction().elements('add', v4, [el('cluster-ips', '198.51.100.5')]).add({ kind: 'chain', table: v4, name: 'extra' }));
      assert.equal(runs(), 3);
      assert.match(ns.exec('nft', ['list', 'map', 'ip', 'kpngnl', 'service-ips']), /172\.30\.0\.7 \. tcp \. 80 comment "ns\/svc-7:http" : goto lb-cluster-tcp-2/);
      // refused over netlink: nft tells why, and the error is nft's
      const bad = new Transaction().elements('add', v4, [...a.map((e) => ({ ...e, key: e.key.replace('172.30.', '172.31.') })), el('service-ips', '198.51.100.1 . tcp . 1', 'goto no-such-chain')]);
      await assert.rejects(nft.run(bad, { bulk: true }), /no-such-chain|No such file or directory/);
      assert.equal(runs(), 4);
      assert.doesNotMatch(ns.exec('nft', ['list', 'set', 'ip', 'kpngnl', 'cluster-ips']), /172\.31\./);
      assert.deepEqual(warnings, []);
    } finally {
      nft.close();
      ns.remove();
      rmSync(dirname(calls), { recursive: true, force: true });
    }
  });
});
