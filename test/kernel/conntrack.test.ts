// Conntrack over netlink against the kernel, in throwaway namespaces: a dump
// brings the entries of one family and protocol (and no other namespace's),
// with the event loop turning while it is read; deletes go in batches, name
// the entry (one made since with the same tuple stays) and its zone.
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { ConntrackNetlink, IPPROTO_TCP, IPPROTO_UDP, type ConntrackEntry } from '../../src/kernel/conntrack.js';
import { canUseNetns, createNetns, type TestNetns } from '../helpers/netns.js';

const v4 = (ip: string) => Buffer.from(ip.split('.').map(Number)).toString('hex');
const V6_CLIENT = 'fd000000000000000000000000000001';
const V6_VIP = 'fd000000000000000000000000000053';

/** client 10.9.x.y:sport -> vip:53, answered by endpoint */
function udp(n: number, o: { proto?: number; zone?: number; endpoint?: string } = {}): ConntrackEntry {
  const client = v4(`10.9.${n >> 8}.${n & 255}`);
  const sport = 10_000 + (n % 50_000);
  return { family: 4, proto: o.proto ?? IPPROTO_UDP, orig: { src: client, dst: v4('172.30.0.53'), sport, dport: 53 }, reply: { src: v4(o.endpoint ?? '10.2.0.1'), dst: client, sport: 5353, dport: sport }, zone: o.zone ?? 0 };
}

const key = (e: ConntrackEntry) => `${e.family} ${e.proto} ${e.zone} ${e.orig.src}:${e.orig.sport} -> ${e.orig.dst}:${e.orig.dport} / ${e.reply.src}:${e.reply.sport}`;

describe('conntrack over netlink', { skip: canUseNetns() }, () => {
  let ns: TestNetns;
  let other: TestNetns;
  let ct: ConntrackNetlink;
  before(() => {
    ns = createNetns();
    other = createNetns();
    ct = new ConntrackNetlink(ns.name);
  });
  after(() => {
    ct?.close();
    ns?.remove();
    other?.remove();
  });

  test('a dump brings one family and protocol, in this namespace only; select keeps what it takes', async () => {
    const mine = [udp(1), udp(2, { endpoint: '10.2.0.2' }), udp(3, { zone: 7 })];
    const tcp = udp(4, { proto: IPPROTO_TCP });
    const six: ConntrackEntry = { family: 6, proto: IPPROTO_UDP, orig: { src: V6_CLIENT, dst: V6_VIP, sport: 4000, dport: 53 }, reply: { src: V6_VIP, dst: V6_CLIENT, sport: 53, dport: 4000 }, zone: 0 };
    assert.deepEqual(await ct.create([...mine, tcp, six], 600), { done: 5, gone: 0, failed: 0 });
    const elsewhere = new ConntrackNetlink(other.name);
    try {
      assert.deepEqual(await elsewhere.list(4, IPPROTO_UDP, () => true), []);
    } finally {
      elsewhere.close();
    }
    const all = await ct.list(4, IPPROTO_UDP, () => true);
    assert.deepEqual(all.map(key).sort(), mine.map(key).sort());
    assert.ok(all.every((e) => typeof e.id === 'number'));
    assert.deepEqual((await ct.list(6, IPPROTO_UDP, () => true)).map(key), [key(six)]);
    assert.deepEqual((await ct.list(4, IPPROTO_TCP, () => true)).map(key), [key(tcp)]);
    const taken = await ct.list(4, IPPROTO_UDP, (e) => e.reply.src === v4('10.2.0.2'));
    assert.deepEqual(taken.map(key), [key(mine[1])]);
    // clean up for the next cases
    const left = [...all, ...(await ct.list(6, IPPROTO_UDP, () => true)), ...(await ct.list(4, IPPROTO_TCP, () => true))];
    assert.equal((await ct.delete(left)).done, 5);
  });

  test('a delete names the entry: in its zone, and not one made since with the same tuple', async () => {
    await ct.create([udp(1), udp(2, { zone: 7 })], 600);
    const [a, z] = (await ct.list(4, IPPROTO_UDP, () => true)).sort((x, y) => x.zone - y.zone);
    assert.equal(z.zone, 7);
    assert.deepEqual(await ct.delete([a, z]), { done: 2, gone: 0, failed: 0 });
    // the same tuple again: a new entry, which the old one's delete leaves alone
    await ct.create([udp(1)], 600);
    assert.deepEqual(await ct.delete([a]), { done: 0, gone: 1, failed: 0 });
    const again = await ct.list(4, IPPROTO_UDP, () => true);
    assert.deepEqual(again.map(key), [key(udp(1))]);
    assert.notEqual(again[0].id, a.id);
    assert.equal((await ct.delete(again)).done, 1);
  });

  test('thousands of entries: the event loop turns during the dump, the deletes go in batches', async () => {
    const n = 10_000;
    const made = await ct.create(Array.from({ length: n }, (_, i) => udp(i)), 600);
    assert.equal(made.done, n);
    let turns = 0;
    let reading = true;
    const turn = () => {
      turns++;
      if (reading) setImmediate(turn);
    };
    setImmediate(turn);
    const all = await ct.list(4, IPPROTO_UDP, () => true);
    reading = false;
    assert.equal(all.length, n);
    assert.ok(turns >= 5, `the event loop turned ${turns} times while ${n} entries were read`);
    assert.deepEqual(await ct.delete(all), { done: n, gone: 0, failed: 0 });
    assert.deepEqual(await ct.list(4, IPPROTO_UDP, () => true), []);
  });
});
