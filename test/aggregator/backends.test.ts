// Every nftables backend this machine runs (to-nft, to-userspace; to-ipvs
// needs IPVS: the kernel lab) writes tenants' tables through the shared
// code (src/backends/shared/nftables/tenants.ts), in a namespace the test
// makes: a tenant's declared table and an element change reach the kernel
// beside kpng's own table, a table flushed by hand is written back by the
// periodic check (and the tenant told), and Unregister removes it. Rule text
// the kernel refuses is refused at the Declare (a check-only transaction);
// a tenant gone for longer than its grace loses its tables.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { pino } from 'pino';
import { create, type MessageInitShape } from '@bufbuild/protobuf';
import { Outcome, TenantRequestSchema } from '../../src/api/gen/kpng/aggregator/v1/aggregator_pb.js';
import { Aggregator, type ReplyInit } from '../../src/aggregator/aggregator.js';
import { defaultAggregatorConfig } from '../../src/aggregator/config.js';
import { NftProxier } from '../../src/backends/nft/proxier.js';
import { UserspaceProxier } from '../../src/backends/userspace/proxier.js';
import { defaultConfig } from '../../src/backends/shared/config.js';
import type { DataplaneOptions } from '../../src/backends/shared/backend.js';
import type { ProxierBase } from '../../src/backends/shared/proxier.js';
import { DecoderSink } from '../../src/diff/decoder.js';
import { LocalDiff } from '../../src/diff/local-diff.js';
import { ServiceViews } from '../../src/localstate/views.js';
import { LocalSet } from '../../src/api/model.js';
import { node, syncedStore } from '../helpers/k8s.js';
import { canUseNetns, createNetns, type TestNetns } from '../helpers/netns.js';
import { pollUntil } from '../helpers/lab-kpng.js';
import { ConntrackNetlink } from '../../src/kernel/conntrack.js';
import { until } from '../helpers/until.js';

const skip = canUseNetns();
const quiet = pino({ level: 'silent' });
const SYNC_PERIOD_MS = 1500;

const backends: [string, (o: DataplaneOptions & { nftPath: string }) => ProxierBase, string][] = [
  ['to-nft', (o) => new NftProxier({ ...o, session: false }), 'ip kpng'],
  ['to-userspace', (o) => new UserspaceProxier(o), 'inet kpng-userspace'],
];

/** a tenant's session without a socket: its replies, and how it ended */
function session(agg: Aggregator) {
  const replies: ReplyInit[] = [];
  const closed: string[] = [];
  const s = agg.open({ send: (r) => replies.push(r), close: (how) => closed.push(how) }, 'test');
  let id = 0n;
  const send = async (request: MessageInitShape<typeof TenantRequestSchema>['request']): Promise<ReplyInit> => {
    const mine = ++id;
    s.request(create(TenantRequestSchema, { id: mine, request }));
    const r = await pollUntil(async () => replies.find((x) => x.id === mine), (x) => !!x, 15_000, 20);
    assert.ok(r.ok, `no reply to request ${mine}`);
    return r.value!;
  };
  return { send, replies, closed, end: () => s.ended() };
}

/** a proxier in a namespace of its own, fed the node's first state, writing the aggregator's tenants */
async function started(make: (o: DataplaneOptions & { nftPath: string }) => ProxierBase, agg: Aggregator): Promise<{ ns: TestNetns; list: () => string }> {
  const ns: TestNetns = createNetns('kpng-agg');
  const config = defaultConfig();
  config.nftables.syncPeriodMs = SYNC_PERIOD_MS;
  config.nftables.minSyncPeriodMs = 0;
  const proxier = make({ nodeName: 'n1', config, log: quiet, nftPath: ns.wrapper('nft'), conntrack: new ConntrackNetlink(ns.name), healthChecks: false, netns: ns.name, tenants: agg });
  after(async () => {
    await proxier.close();
    agg.close();
    ns.remove();
  });
  const store = syncedStore([node('n1', undefined, ['192.168.0.2'])]);
  const decoder = new DecoderSink(proxier);
  for (const op of new LocalDiff(store, new ServiceViews(store), 'n1', { sets: [LocalSet.NodesSet, LocalSet.ServiceCIDRsSet] }).next()) await decoder.send(op);
  return { ns, list: () => ns.exec('nft', ['list', 'ruleset']) };
}

test('to-nft: rule text the kernel refuses is refused at the Declare; a tenant away longer than its grace loses its tables', { skip, timeout: 60_000 }, async () => {
  const agg = new Aggregator({ ...defaultAggregatorConfig(), minChangeIntervalMs: 0, graceMs: 1000 }, quiet);
  const { list } = await started(backends[0]![1], agg);
  const t = session(agg);
  await t.send({ case: 'hello', value: { tenant: 'tmp' } });
  const table = (rule: string) => ({ case: 'declare' as const, value: { nftables: { tables: [{ family: 'inet', name: 'f', chains: [{ name: 'c', hook: { hook: 'input', priority: 0 }, rules: [{ rule }] }] }] } } });
  const bad = await t.send(table('ip daddr 192.0.2.1 frobnicate'));
  assert.equal(bad.outcome, Outcome.REFUSED);
  assert.match(bad.error ?? '', /^the kernel refuses it: .*frobnicate/);
  assert.doesNotMatch(list(), /kpng\.tmp\./, 'nothing of it reached the kernel');
  assert.equal((await t.send(table('ip daddr 192.0.2.1 counter drop'))).outcome, Outcome.APPLIED);
  assert.match(list(), /table inet kpng\.tmp\.f/);
  t.end();
  const gone = await pollUntil(async () => list(), (s) => !/kpng\.tmp\./.test(s), 8000, 100);
  assert.ok(gone.ok, `still there after the grace:\n${gone.value}`);
  // forgotten once the sync that removed its tables has reported
  await until('the tenant forgotten', () => agg.tenant('tmp') === undefined, { timeoutMs: 2 * SYNC_PERIOD_MS });
});

for (const [name, make, ownTable] of backends) {
  test(`${name} writes a tenant's table beside its own, repairs it, and removes it on Unregister`, { skip, timeout: 60_000 }, async () => {
    const agg = new Aggregator({ ...defaultAggregatorConfig(), minChangeIntervalMs: 0 }, quiet);
    const { ns, list } = await started(make, agg);

    const fw = session(agg);
    assert.equal((await fw.send({ case: 'hello', value: { tenant: 'fw' } })).outcome, Outcome.APPLIED);
    const declared = await fw.send({
      case: 'declare',
      value: {
        nftables: {
          tables: [
            {
              family: 'inet',
              name: 'filter',
              sets: [{ name: 'banned', type: 'ipv4_addr . inet_service', elements: [{ key: '203.0.113.7 . 22' }] }],
              chains: [{ name: 'input', hook: { hook: 'input', priority: 10 }, rules: [{ rule: 'ip saddr . tcp dport @banned drop' }] }],
            },
          ],
        },
      },
    });
    assert.equal(declared.outcome, Outcome.APPLIED, declared.error);
    assert.match(list(), /table inet kpng\.fw\.filter \{[\s\S]*elements = \{ 203\.0\.113\.7 \. 22 \}[\s\S]*ip saddr \. tcp dport @banned drop/);
    assert.match(list(), new RegExp(`table ${ownTable} \\{`), "kpng's own table is there too");

    const more = await fw.send({ case: 'elements', value: { changes: [{ family: 'inet', table: 'filter', set: 'banned', add: [{ key: '203.0.113.8 . 22' }] }] } });
    assert.equal(more.outcome, Outcome.APPLIED, more.error);
    assert.equal(more.changes, 1);

    ns.exec('nft', ['flush', 'table', 'inet', 'kpng.fw.filter']);
    const repaired = await pollUntil(async () => list(), (s) => /203\.0\.113\.8 \. 22/.test(s) && /@banned drop/.test(s), SYNC_PERIOD_MS + 4000, 100);
    assert.ok(repaired.ok, `not written back:\n${repaired.value}`);
    // the notice follows the sync that wrote the table back
    await until('the tenant told of the repair', () => fw.replies.some((r) => r.id === 0n && r.outcome === Outcome.REPAIRED), { timeoutMs: 2 * SYNC_PERIOD_MS });

    const gone = await fw.send({ case: 'unregister', value: {} });
    assert.equal(gone.outcome, Outcome.APPLIED, gone.error);
    assert.doesNotMatch(list(), /kpng\.fw\./);
    assert.match(list(), new RegExp(`table ${ownTable} \\{`));
    assert.deepEqual(fw.closed, ['ok'], 'the session ends after Unregister');
    assert.equal(agg.tenant('fw'), undefined, 'the tenant is forgotten');
  });
}
