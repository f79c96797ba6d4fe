// A tenant's content between its requests and the kernel, without a kernel:
// staged changes coalesce, a sync takes them whole, the kernel's refusal puts
// back the last good content and nothing else (changes staged meanwhile
// stay), element timeouts are forgotten once passed, and the aggregator's
// config is parsed strictly.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { create } from '@bufbuild/protobuf';
import { NftablesContentSchema } from '../../src/api/gen/kpng/aggregator/v1/aggregator_pb.js';
import { declareNft, type TenantElement } from '../../src/aggregator/nft-content.js';
import { Tenant, type PendingRequest } from '../../src/aggregator/tenant.js';
import { DEFAULT_QUOTAS, parseAggregatorConfig } from '../../src/aggregator/config.js';
import { ConfigError } from '../../src/runtime/errors.js';

const SET = 'inet kpng.t.f s';
const decl = (keys: string[], rule = 'ip daddr @s drop', opts: { timeoutMs?: number } = {}) =>
  declareNft(
    create(NftablesContentSchema, {
      tables: [{ family: 'inet', name: 'f', sets: [{ name: 's', type: 'ipv4_addr', flags: opts.timeoutMs ? ['timeout'] : [], timeoutMs: opts.timeoutMs ?? 0, elements: keys.map((key) => ({ key })) }], chains: [{ name: 'c', rules: [{ rule }] }] }],
    }),
    { tenant: 't', quotas: DEFAULT_QUOTAS, reservedMark: 0x4000 },
  );
const answers: string[] = [];
const req = (id: number): PendingRequest => ({ id: BigInt(id), at: 0, answer: (o, d) => answers.push(`${id} ${o}${d.error ? ` ${d.error}` : ''}`) });
const el = (key: string, timeoutMs = 0): TenantElement => ({ key, value: '', timeoutMs });
const keys = (t: Tenant) => [...(t.desired.elements.get(SET)?.keys() ?? [])].sort();

test('staged changes coalesce and a sync takes them whole; desired changes only then', () => {
  const t = new Tenant('t');
  t.stageDeclaration(decl(['10.0.0.1']), req(1));
  t.stageElements([{ id: SET, deletes: [], adds: [el('10.0.0.2'), el('10.0.0.3')] }], req(2));
  t.stageElements([{ id: SET, deletes: ['10.0.0.3'], adds: [] }], req(3));
  assert.equal(t.projectedElements, 2);
  assert.equal(t.known, false, 'nothing is desired before a sync takes it');
  assert.deepEqual(keys(t), []);
  t.take(1000);
  assert.equal(t.known, true);
  assert.deepEqual(keys(t), ['10.0.0.1', '10.0.0.2']);
  // the dataplane compares exactly the keys that changed
  assert.deepEqual([...t.desired.touched.get(SET)!].sort(), ['10.0.0.1', '10.0.0.2', '10.0.0.3']);
  assert.deepEqual(t.applied().map((r) => r.id), [1n, 2n, 3n]);
});

test("the kernel's refusal puts back the last good content; what was staged meanwhile stays staged", () => {
  const t = new Tenant('t');
  t.stageDeclaration(decl(['10.0.0.1']), req(1));
  t.take(0);
  t.applied();
  const good = t.desired.tables;
  t.stageDeclaration(decl(['10.0.0.1', '10.0.0.9'], 'ip daddr @s frobnicate'), req(2));
  t.stageElements([{ id: SET, deletes: ['10.0.0.1'], adds: [] }], req(3));
  t.take(0);
  t.stageElements([{ id: SET, deletes: [], adds: [el('10.0.0.5')] }], req(4));
  assert.deepEqual(keys(t), ['10.0.0.9']);
  assert.deepEqual(t.refused().map((r) => r.id), [2n, 3n]);
  assert.equal(t.desired.tables, good, 'the structure the kernel took');
  assert.deepEqual(keys(t), ['10.0.0.1'], 'the elements the kernel took');
  assert.ok(t.desired.touched.get(SET)!.has('10.0.0.9'), 'the dataplane compares what was put back');
  assert.equal(t.projectedElements, 2, 'the good content and the staged add');
  t.take(0);
  assert.deepEqual(keys(t), ['10.0.0.1', '10.0.0.5']);
  assert.deepEqual(t.applied().map((r) => r.id), [4n]);
});

test('elements that expire are forgotten once their timeout passed (the kernel removed them)', () => {
  const t = new Tenant('t');
  t.stageDeclaration(decl([], 'ip daddr @s drop', { timeoutMs: 1000 }), req(1));
  t.take(0);
  t.stageElements([{ id: SET, deletes: [], adds: [el('10.0.0.1', 50_000), el('10.0.0.2')] }], req(2));
  t.take(10_000);
  assert.deepEqual(keys(t), ['10.0.0.1', '10.0.0.2']);
  t.take(20_000);
  assert.deepEqual(keys(t), ['10.0.0.1'], "the set's own timeout (1 s) passed");
  t.take(70_000);
  assert.deepEqual(keys(t), [], "the element's own (50 s) too");
});

test('Unregister (and the end of the grace) removes everything, and the tenant is empty once applied', () => {
  const t = new Tenant('t');
  t.stageDeclaration(decl(['10.0.0.1']), req(1));
  t.take(0);
  t.applied();
  t.stageRemoval({ id: 2n, at: 0, removal: true });
  t.take(0);
  assert.equal(t.desired.tables.size, 0);
  assert.deepEqual(keys(t), []);
  assert.ok(t.desired.touched.get(SET)!.has('10.0.0.1'));
  t.applied();
  assert.equal(t.empty, true);
});

test("the aggregator's config: defaults, the allow-list, and strict fields named in errors", () => {
  const d = parseAggregatorConfig(undefined);
  assert.equal(d.graceMs, 300_000);
  assert.equal(d.allow, undefined);
  const c = parseAggregatorConfig({ graceSeconds: 2, quotas: { chains: 10 }, allow: [{ name: 'netpol', hooks: ['postrouting', 'input'] }, { name: 'calico', quotas: { elements: 7 } }] });
  assert.equal(c.graceMs, 2000);
  assert.deepEqual([...c.allow!.get('netpol')!.hooks!], ['postrouting', 'input']);
  assert.equal(c.allow!.get('netpol')!.quotas.chains, 10);
  assert.equal(c.allow!.get('calico')!.quotas.elements, 7);
  assert.equal(c.allow!.get('calico')!.quotas.chains, 10, 'a tenant quota starts from the general ones');
  const fails = (doc: unknown, field: string) => assert.throws(() => parseAggregatorConfig(doc), (e: unknown) => e instanceof ConfigError && e.field === field);
  fails({ grace: 1 }, 'grace');
  fails({ quotas: { chain: 1 } }, 'quotas.chain');
  fails({ allow: [{ name: 'Bad_Name' }] }, 'allow[0].name');
  fails({ allow: [{ name: 'a', hooks: ['ingress'] }] }, 'allow[0].hooks');
  fails({ allow: [{ name: 'a' }, { name: 'a' }] }, 'allow[1].name');
  fails({ minChangeIntervalMs: -1 }, 'minChangeIntervalMs');
  assert.ok(answers.length === 0, 'no request was answered by the tenant itself');
});
