// kpng trace's interpreters without root: rules a lab node really held
// (test/fixtures/trace: `nft -j list table ip kpng` and `nft -a`, or
// iptables-save, with that node's local routes), handed to trace() in place
// of the tools. Every flow of the scenario they came from must come out as
// upstream expects; a rule outside kpng's subset is reported, not guessed.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { trace, traceJSON, formatTrace, type Exec } from '../../src/trace/index.js';
import { loadScenario, parseEndpoints } from '../helpers/lab-flows.js';

const FIX = fileURLToPath(new URL('../fixtures/trace/', import.meta.url));
const read = (f: string) => readFileSync(FIX + f, 'utf8');

/** tools answering from fixture files; anything else fails as a missing table does */
function fakeTools(files: Record<string, string>): Exec {
  return async (argv) => {
    const out = files[argv.join(' ')];
    return out === undefined ? { code: 1, stdout: '', stderr: `Error: ${argv.join(' ')}: no such table` } : { code: 0, stdout: out, stderr: '' };
  };
}

const nftTools = (json = read('etp-local.nft.json')) =>
  fakeTools({
    'nft -j list table ip kpng': json,
    'nft -a list table ip kpng': read('etp-local.nft.txt'),
    'ip -j -4 route show table local': read('etp-local.routes.json'),
  });

const iptTools = (save = read('lb.iptables-save.txt')) =>
  fakeTools({
    'iptables-nft-save': save,
    'ip -j -4 route show table local': read('lb.routes.json'),
  });

function expected(output: string): { verdict: string; endpoints: string[] } {
  if (output === '') return { verdict: 'accept', endpoints: [] };
  if (output === 'DROP' || output === 'REJECT') return { verdict: output.toLowerCase(), endpoints: [] };
  return { verdict: 'dnat', endpoints: parseEndpoints(output).sort() };
}

for (const [file, tools] of [
  ['nftables_test_external_traffic_policy_local.json', nftTools],
  ['iptables_test_load_balancer.json', iptTools],
] as const) {
  test(`trace over the rules of ${file}: every flow as upstream expects`, async () => {
    const s = loadScenario(file);
    for (const f of s.flows) {
      const t = await trace({ src: f.sourceIP, dst: f.destIP, dport: f.destPort, proto: f.protocol.toLowerCase() as 'tcp' }, tools());
      const want = expected(f.output);
      const what = `${f.name}\n${formatTrace(t)}`;
      assert.equal(t.verdict, want.verdict, what);
      assert.deepEqual([...t.endpoints].sort(), want.endpoints, what);
      assert.equal(t.masquerade, f.masq, what);
      assert.deepEqual(t.unknown, [], what);
      if (t.verdict === 'dnat') assert.ok(Math.abs(t.choices.reduce((a, c) => a + c.probability, 0) - 1) < 1e-6, what);
    }
  });
}

test('nft: the path and reasons of an eTP=Local LoadBalancer IP from outside', async () => {
  const t = await trace({ src: '203.0.113.2', dst: '1.2.3.4', dport: 80 }, nftTools());
  assert.equal(t.backend, 'nft');
  assert.equal(t.origin, 'arriving');
  assert.deepEqual(t.endpoints, ['10.180.2.1:80']);
  assert.equal(t.service, 'ns1/svc1:p80');
  assert.ok(t.reasons.some((r) => /externalTrafficPolicy: Local/.test(r)), t.reasons.join('\n'));
  assert.ok(t.path.some((s) => s.where === 'prerouting services' && s.rule.includes('@service-ips element 1.2.3.4 . tcp . 80')), JSON.stringify(t.path));
  // -o json: verdict, endpoints, masquerade first
  assert.deepEqual(Object.keys(JSON.parse(traceJSON(t))).slice(0, 3), ['verdict', 'endpoints', 'masquerade']);
});

test('nft: several endpoints, each with its probability', async () => {
  const t = await trace({ src: '10.0.0.2', dst: '172.30.0.41', dport: 80 }, nftTools());
  assert.equal(t.verdict, 'dnat');
  assert.deepEqual(t.choices.map((c) => [c.endpoint, c.probability]).sort(), [['10.180.0.1:80', 0.5], ['10.180.2.1:80', 0.5]]);
  assert.match(formatTrace(t), /DNAT to one of 2 endpoints, not masqueraded/);
});

test('a rule outside kpng\'s subset is reported as unknown, not guessed', async () => {
  const doc = JSON.parse(read('etp-local.nft.json'));
  const at = doc.nftables.findIndex((o: any) => o.rule?.chain === 'services');
  const rule = doc.nftables[at];
  // a match on the socket owner, first in the chain: nothing kpng writes
  doc.nftables.splice(at, 0, { rule: { ...rule.rule, handle: 9999, expr: [{ match: { op: '==', left: { meta: { key: 'skuid' } }, right: 0 } }, { drop: null }] } });
  const t = await trace({ src: '10.0.0.2', dst: '172.30.0.41', dport: 80 }, nftTools(JSON.stringify(doc)));
  assert.equal(t.unknown.length, 1, JSON.stringify(t.unknown));
  assert.match(t.unknown[0]!, /meta skuid/);
  assert.match(formatTrace(t), /unknown rules \(taken as not matching; the verdict may be wrong\)/);

  const save = read('lb.iptables-save.txt').replace(/^(-A KUBE-SERVICES .*)$/m, '-A KUBE-SERVICES -m set --match-set blocked src -j DROP\n$1');
  const u = await trace({ src: '10.0.0.2', dst: '172.30.0.41', dport: 80 }, iptTools(save));
  assert.equal(u.unknown.length, 1, JSON.stringify(u.unknown));
  assert.match(u.unknown[0]!, /--match-set/);
});

test('no kpng rules, bad input: one clear error', async () => {
  await assert.rejects(trace({ src: '10.0.0.2', dst: '172.30.0.41', dport: 80 }, fakeTools({})), /no kpng rules on this node for IPv4/);
  await assert.rejects(trace({ src: '10.0.0.2', dst: 'fd00::1', dport: 80 }, nftTools()), /different IP families/);
  await assert.rejects(trace({ src: '10.0.0.2', dst: '172.30.0.41', dport: 70000 }, nftTools()), /not a port/);
});
