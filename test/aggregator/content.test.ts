// What kpng takes of a tenant's nftables content, without a kernel: names,
// rule text that could end its command or reach beyond its table, marks
// that would change kpng's masquerade bit, hooks outside the allow-list,
// quotas; and elements in the form nft lists them. Each refusal names what
// is wrong.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { create, type MessageInitShape } from '@bufbuild/protobuf';
import { NftablesContentSchema } from '../../src/api/gen/kpng/aggregator/v1/aggregator_pb.js';
import { declareNft, nameHint, TenantError, type NftPolicy } from '../../src/aggregator/nft-content.js';
import { kernelTableName, tenantOfTable } from '../../src/aggregator/names.js';
import { DEFAULT_QUOTAS } from '../../src/aggregator/config.js';

type Content = MessageInitShape<typeof NftablesContentSchema>;
const policy = (p: Partial<NftPolicy> = {}): NftPolicy => ({ tenant: 'netpol', quotas: DEFAULT_QUOTAS, reservedMark: 0x4000, ...p });
const declare = (c: Content, p?: Partial<NftPolicy>) => declareNft(create(NftablesContentSchema, c), policy(p));

/** a table with one base chain (postrouting) running these rules, and a set "s" and regular chain "sub" to refer to */
const withRules = (...rules: string[]): Content => ({
  tables: [
    {
      family: 'inet',
      name: 'filter',
      sets: [{ name: 's', type: 'ipv4_addr' }],
      chains: [{ name: 'post', hook: { hook: 'postrouting', priority: 95 }, rules: rules.map((rule) => ({ rule })) }, { name: 'sub' }],
    },
  ],
});

const refused = (c: Content, message: RegExp, p?: Partial<NftPolicy>) => assert.throws(() => declare(c, p), (e: unknown) => e instanceof TenantError && message.test(e.message));

test("a tenant's tables are named kpng.<tenant>.<table>: nobody else's name, read back to the tenant", () => {
  assert.equal(kernelTableName('netpol', 'filter'), 'kpng.netpol.filter');
  assert.deepEqual(tenantOfTable('kpng.netpol.filter'), { tenant: 'netpol', table: 'filter' });
  for (const other of ['kpng', 'kpng-ipvs', 'kpng.x', 'kpng.Bad.t', 'filter']) assert.equal(tenantOfTable(other), undefined, other);
  refused({ tables: [{ family: 'inet', name: 'a.b' }] }, /table name "a\.b"/);
  refused({ tables: [{ family: 'bridge', name: 't' }] }, /family "bridge": inet, ip or ip6/);
});

test('rules: one command of the tenant own table; separators, comments and variables are refused', () => {
  const d = declare(withRules('ct state new jump sub', 'ip daddr @s counter drop', 'meta iifname "a;b#c" accept', '@nh,16,8 0x1 drop', 'tcp dport { 80, 443 } accept'));
  const post = d.tables.get('inet filter')!.chains.get('post')!;
  assert.equal(post.rules.length, 5);
  assert.match(post.rules[0]!, /^ct state new jump sub comment "kpng:[0-9a-f]{12}"$/);
  refused(withRules('ip daddr 1.2.3.4 drop; delete table ip kpng'), /";" is not allowed/);
  refused(withRules('drop # flush ruleset'), /"#" is not allowed/);
  refused(withRules('ip daddr $x drop'), /"\$" is not allowed/);
  refused(withRules('drop\nflush ruleset'), /printable ASCII on one line/);
  refused(withRules('ip daddr { 1.2.3.4 drop'), /not closed/);
  refused(withRules('meta iifname "eth0 drop'), /quote is not closed/);
  refused(withRules('drop comment "x"'), /NftRule\.comment/);
  refused(withRules('jump post'), /jump post: not a regular chain of this table/);
  refused(withRules('goto elsewhere'), /goto elsewhere: not a regular chain/);
  refused(withRules('tcp dport vmap { 80 : jump nowhere }'), /jump nowhere/);
  refused(withRules('ip daddr @other drop'), /@other: no such set or map in this table/);
});

test("marks: a tenant's rules change only their own bits, never kpng's masquerade bit", () => {
  declare(withRules('meta mark set meta mark or 0x10000', 'meta mark set meta mark and 0xfffeffff', 'mark set mark and 0xffff4fff or 0x20000', 'ct mark set 0x1'));
  for (const r of ['meta mark set 0x10', 'meta mark set meta mark or 0x4000', 'meta mark set meta mark and 0xffff0000', 'meta mark set meta mark xor 0x4001', 'meta mark set ip saddr map { 1.2.3.4 : 0x1 }']) {
    refused(withRules(r), /leaving kpng's mark bits \(0x4000\)/);
  }
});

test('hooks: base chains of the types nft has, at the hooks the allow-list gives', () => {
  const at = (hook: string, type = 'filter') => ({ tables: [{ family: 'inet', name: 't', chains: [{ name: 'c', hook: { type, hook, priority: 0 } }] }] });
  declare(at('postrouting'), { hooks: new Set(['postrouting']) });
  refused(at('prerouting'), /allow-list: tenant netpol may not hook prerouting \(it may hook postrouting\)/, { hooks: new Set(['postrouting']) });
  refused(at('ingress'), /hook "ingress"/);
  refused(at('input', 'route'), /route chain hooks output only/);
  refused(at('forward', 'nat'), /nat chain cannot hook forward/);
});

test('quotas: tables, chains, rules, sets and elements, each named in the refusal', () => {
  const quotas = { tables: 1, chains: 2, rules: 3, sets: 1, elements: 2 };
  const t = (x: object) => ({ family: 'inet', ...x });
  refused({ tables: [t({ name: 'a' }), t({ name: 'b' })] }, /quota: 2 tables, at most 1 for tenant netpol/, { quotas });
  refused({ tables: [t({ name: 'a', chains: [{ name: 'x' }, { name: 'y' }, { name: 'z' }] })] }, /quota: 3 chains, at most 2/, { quotas });
  refused({ tables: [t({ name: 'a', chains: [{ name: 'x', rules: [{ rule: 'accept' }, { rule: 'accept' }, { rule: 'accept' }, { rule: 'accept' }] }] })] }, /quota: 4 rules, at most 3/, { quotas });
  refused({ tables: [t({ name: 'a', sets: [{ name: 'x', type: 'ipv4_addr' }, { name: 'y', type: 'ipv4_addr' }] })] }, /quota: 2 sets, at most 1/, { quotas });
  refused({ tables: [t({ name: 'a', sets: [{ name: 'x', type: 'ipv4_addr', elements: [{ key: '10.0.0.1' }, { key: '10.0.0.2' }, { key: '10.0.0.3' }] }] })] }, /quota: 3 elements, at most 2/, { quotas });
});

test('elements: in the form nft lists them (what a read-back is compared with)', () => {
  const d = declare({
    tables: [
      {
        family: 'inet',
        name: 't',
        chains: [{ name: 'c' }],
        sets: [
          { name: 'v6', type: 'ipv6_addr', elements: [{ key: '2001:DB8:0:0::1' }] },
          { name: 'nets', type: 'ipv4_addr', flags: ['interval'], elements: [{ key: '10.0.0.1/32' }, { key: '10.1.0.0/16' }, { key: '10.2.0.1-10.2.0.9' }] },
          { name: 'svc', type: 'ipv4_addr . inet_proto . inet_service', elements: [{ key: '10.96.0.1  .  tcp . 0080' }] },
          { name: 'vm', type: 'inet_service', map: 'verdict', elements: [{ key: '80', value: 'jump c' }] },
          { name: 'timed', type: 'typeof ip saddr', flags: ['timeout'], timeoutMs: 30_000, elements: [{ key: '10.0.0.7', timeoutMs: 1000 }] },
        ],
      },
    ],
  });
  const keys = (set: string) => [...d.elements.get(`inet kpng.netpol.t ${set}`)!.keys()];
  assert.deepEqual(keys('v6'), ['2001:db8::1']);
  assert.deepEqual(keys('nets'), ['10.0.0.1', '10.1.0.0/16', '10.2.0.1-10.2.0.9']);
  assert.deepEqual(keys('svc'), ['10.96.0.1 . tcp . 80']);
  assert.equal(d.elements.get('inet kpng.netpol.t vm')!.get('80')!.value, 'jump c');
  assert.match(d.tables.get('inet t')!.sets.get('timed')!.body, /^typeof ip saddr ; flags timeout ; timeout 30000ms ; comment "kpng:[0-9a-f]{12}" ;$/);
  const bad = (set: object, message: RegExp) => refused({ tables: [{ family: 'inet', name: 't', chains: [{ name: 'c' }], sets: [set] }] }, message);
  bad({ name: 'x', type: 'ipv4_addr', elements: [{ key: '10.0.0.0/24' }] }, /is not of type ipv4_addr/);
  bad({ name: 'x', type: 'ipv4_addr', flags: ['interval'], elements: [{ key: '10.0.0.1/24' }] }, /host bits set \(10\.0\.0\.0\/24\?\)/);
  bad({ name: 'x', type: 'ipv4_addr', elements: [{ key: '10.0.0.1, 10.0.0.2' }] }, /not of type ipv4_addr/);
  bad({ name: 'x', type: 'ifname', elements: [{ key: 'eth0 }; flush ruleset' }] }, /letters, digits/);
  bad({ name: 'x', type: 'inet_service', map: 'verdict', elements: [{ key: '80', value: 'jump nowhere' }] }, /not a regular chain/);
  bad({ name: 'x', type: 'ipv4_addr', elements: [{ key: '10.0.0.1', timeoutMs: 5 }] }, /needs the set's "timeout" flag/);
  bad({ name: 'x', type: 'ipv4_addr; flush ruleset' }, /type "ipv4_addr; flush ruleset"/);
});

test('a chain is identified by its hook and its rules (the digest a read-back is compared with)', () => {
  const a = declare(withRules('accept')).tables.get('inet filter')!.chains.get('post')!;
  const b = declare(withRules('accept')).tables.get('inet filter')!.chains.get('post')!;
  const c = declare(withRules('drop')).tables.get('inet filter')!.chains.get('post')!;
  assert.equal(a.digest, b.digest);
  assert.notEqual(a.digest, c.digest);
});

test("a name nft reserves is named in the kernel's refusal", () => {
  const d = declare({ tables: [{ family: 'inet', name: 't', chains: [{ name: 'fwd' }] }] });
  const nft = 'nft -c -f - failed (exit 1): Error: syntax error, unexpected fwd, expecting string (line 3: add chain inet kpng.netpol.t fwd)';
  assert.match(nameHint(d, nft), /^fwd \(in table inet t\) is a word nft reserves: give the chain or set another name\. nft -c/);
  assert.equal(nameHint(d, 'Error: Could not process rule: No such file or directory'), 'Error: Could not process rule: No such file or directory');
});
