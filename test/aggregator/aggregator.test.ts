// The aggregator's sessions without a kernel (a recording dataplane): a
// tenant's changes make kpng sync at most once per minChangeIntervalMs, a
// new session of a tenant takes over from the old one, and a Hello the
// allow-list or the name rules refuse ends the stream with the reason.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { pino } from 'pino';
import { create, type MessageInitShape } from '@bufbuild/protobuf';
import { Outcome, TenantRequestSchema } from '../../src/api/gen/kpng/aggregator/v1/aggregator_pb.js';
import { Aggregator, type ReplyInit } from '../../src/aggregator/aggregator.js';
import { defaultAggregatorConfig, parseAggregatorConfig } from '../../src/aggregator/config.js';
import type { TenantDataplane } from '../../src/aggregator/dataplane.js';
import { pollUntil } from '../helpers/lab-kpng.js';

const quiet = pino({ level: 'silent' });

function session(agg: Aggregator) {
  const replies: ReplyInit[] = [];
  const closed: { how: string; message: string }[] = [];
  const s = agg.open({ send: (r) => replies.push(r), close: (how, message) => closed.push({ how, message }) }, 'test');
  let id = 0n;
  const send = async (request: MessageInitShape<typeof TenantRequestSchema>['request']) => {
    const mine = ++id;
    s.request(create(TenantRequestSchema, { id: mine, request }));
    const r = await pollUntil(async () => replies.find((x) => x.id === mine), (x) => !!x, 5000, 5);
    assert.ok(r.ok, `no reply to ${mine}`);
    return r.value!;
  };
  /** a request whose reply waits for a sync (which this dataplane never runs) */
  const post = (request: MessageInitShape<typeof TenantRequestSchema>['request']) => s.request(create(TenantRequestSchema, { id: ++id, request }));
  return { send, post, closed };
}

const declare = { case: 'declare' as const, value: { nftables: { tables: [{ family: 'inet', name: 'f', sets: [{ name: 's', type: 'ipv4_addr' }], chains: [{ name: 'c', rules: [{ rule: 'ip saddr @s drop' }] }] }] } } };
const add = (key: string) => ({ case: 'elements' as const, value: { changes: [{ family: 'inet', table: 'f', set: 's', add: [{ key }] }] } });

test("one tenant's changes make kpng sync at most once per minChangeIntervalMs", async () => {
  const agg = new Aggregator({ ...defaultAggregatorConfig(), minChangeIntervalMs: 300 }, quiet);
  const calls: number[] = [];
  const dp: TenantDataplane = { family: 'nftables', reservedMark: 0x4000, check: async () => {}, changed: () => calls.push(Date.now()) };
  assert.ok(agg.attach(dp));
  const t = session(agg);
  await t.send({ case: 'hello', value: { tenant: 'a' } });
  // staged and released at once
  t.post(declare);
  await pollUntil(async () => calls.length, (n) => n === 1, 2000, 5);
  // the Declare is staged: the next change is checked against it
  const b = session(agg);
  await b.send({ case: 'hello', value: { tenant: 'b' } });
  t.post(add('10.0.0.1'));
  b.post(declare);
  const second = await pollUntil(async () => calls.length, (n) => n >= 3, 2000, 5);
  assert.ok(second.ok, 'both tenants asked for a sync');
  const [first, other, later] = [calls[0]!, calls[1]!, calls[2]!];
  assert.ok(other - first < 250, "another tenant's change is not held by this one's limit");
  assert.ok(later - first >= 290, `a's second change waited for its interval (${later - first} ms)`);
  agg.close();
});

test('a new session of a tenant takes over; the allow-list and name rules end a Hello with why', async () => {
  const agg = new Aggregator(parseAggregatorConfig({ allow: [{ name: 'a' }] }), quiet);
  const one = session(agg);
  assert.equal((await one.send({ case: 'hello', value: { tenant: 'a' } })).outcome, Outcome.APPLIED);
  const two = session(agg);
  assert.equal((await two.send({ case: 'hello', value: { tenant: 'a' } })).outcome, Outcome.APPLIED);
  assert.deepEqual(one.closed, [{ how: 'replaced', message: 'a new session of tenant a took over' }]);
  const stranger = session(agg);
  const r = await stranger.send({ case: 'hello', value: { tenant: 'b' } });
  assert.equal(r.outcome, Outcome.REFUSED);
  assert.deepEqual(stranger.closed, [{ how: 'denied', message: 'allow-list: tenant b is not allowed on this node' }]);
  const bad = session(agg);
  await bad.send({ case: 'hello', value: { tenant: 'Not_A_Label' } });
  assert.equal(bad.closed[0]?.how, 'invalid');
  assert.match(bad.closed[0]?.message ?? '', /a DNS label/);
  const early = session(agg);
  assert.match((await early.send(add('10.0.0.1'))).error ?? '', /say Hello first/);
  // no backend writes tenants' content on this node: said, not hung
  assert.match((await two.send(declare)).error ?? '', /no backend on this node writes tenants' content/);
  agg.close();
});
