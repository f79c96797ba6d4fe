// kpng status against running processes, as an operator runs it on a node:
// a node agent programming a test network namespace with to-nft (its
// source, syncs, health, what its node's state holds, a drift it repaired,
// a sync that failed), a brain (its source, what it holds, the nodes
// watching), and a split-mode agent (which brain it follows, and that it
// has none once the brain is gone); the text screen and -o json. Every
// process and namespace is removed, also on failure. And how it reads
// /metrics: quantiles as PromQL computes them, the aggregator's tenants.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { kpngSync } from '../helpers/cli.js';
import { canUseNetns, createNetns, type TestNetns } from '../helpers/netns.js';
import { formatStatus, metricFigures } from '../../src/get/status.js';
import { brain, nodeAgent, splitAgent, writeCluster, type Kpng, type Served } from '../helpers/running-kpng.js';
import { until } from '../helpers/until.js';

type Obj = Record<string, any>;

const skip = canUseNetns();
const started: Kpng[] = [];
const namespaces: TestNetns[] = [];
let dir: string;

before(() => {
  dir = mkdtempSync(join(tmpdir(), 'kpng-status-'));
  writeCluster(dir);
});
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
  for (const ns of namespaces) ns.remove();
  rmSync(dir, { recursive: true, force: true });
});

function netns(): TestNetns {
  const ns = createNetns();
  namespaces.push(ns);
  return ns;
}

/** kpng status as an operator runs it on the node: in its network namespace (the agent's loopback servers) */
function status({ socket, netns }: Served): { text: string; json: Obj } {
  const text = kpngSync(['status', '--socket', socket], { netns: netns?.name });
  assert.equal(text.status, 0, text.stderr);
  const json = kpngSync(['status', '--socket', socket, '-o', 'json'], { netns: netns?.name });
  assert.equal(json.status, 0, json.stderr);
  return { text: text.stdout, json: JSON.parse(json.stdout) };
}

/** polls kpng status until cond holds */
async function statusUntil(kpng: Served, what: string, cond: (json: Obj) => boolean): Promise<{ text: string; json: Obj }> {
  let s: { text: string; json: Obj } | undefined;
  await until(what, () => cond((s = status(kpng)).json), { timeoutMs: 30_000, everyMs: 200, detail: () => JSON.stringify(s?.json) });
  return s!;
}

test('kpng status of a node agent: source, backend, syncs, health, programmed state, a drift repaired', { skip, timeout: 120_000 }, async () => {
  const ns = netns();
  const agent = await nodeAgent(ns, dir, started);
  const { text, json } = status(agent);
  const r = json.report;
  assert.equal(r.role, 'node');
  assert.equal(r.node, 'n1');
  assert.equal(r.pid, agent.kpng.process.pid);
  assert.deepEqual(r.source, { kind: 'file', origin: dir, synced: true });
  assert.equal(r.backends.length, 1);
  const nft = r.backends[0];
  assert.equal(nft.name, 'nft');
  assert.equal(nft.proxyMode, 'nftables');
  assert.equal(nft.lastSync.ok, true);
  assert.equal(nft.lastSync.full, true, 'the first sync reads the dataplane back');
  assert.deepEqual(nft.lastSync.skipped, []);
  assert.equal(json.health.code, 200);
  assert.ok(json.health.body.lastUpdated);
  assert.deepEqual(json.programmed, { services: 2, endpoints: 3 });
  assert.equal(json.metrics.figures.repairs, 0);
  assert.equal(json.metrics.figures.skippedServices, 0);
  assert.match(text, /^KPNG:\s+node agent \d+\.\d+\.\d+, pid \d+, up /m);
  assert.match(text, /^Node:\s+n1$/m);
  assert.match(text, new RegExp(`^Source:\\s+file ${dir} \\(listed, watching\\)$`, 'm'));
  assert.match(text, /^Backends:\s+nft \(nftables\)$/m);
  assert.match(text, /^Health:\s+ok \(\/healthz 200 on 0\.0\.0\.0:10256, last update /m);
  assert.match(text, /^Last sync:\s+ok \d+s ago, full \(change\), \d+ ms, \d+ changes$/m);
  assert.match(text, /^Programmed:\s+2 Services, 3 endpoints$/m);
  assert.match(text, /^Drift repairs:\s+0$/m);

  // someone else deletes a Service's element: the periodic check repairs it, and status says so
  ns.exec('nft', ['delete', 'element', 'ip', 'kpng', 'service-ips', '{ 172.30.0.10 . tcp . 80 }']);
  const repaired = await statusUntil(agent, 'the repair', (j) => j.metrics.figures.repairs >= 1);
  assert.match(repaired.text, /^Drift repairs:\s+[1-9]\d*$/m);
  assert.match(ns.exec('nft', ['list', 'map', 'ip', 'kpng', 'service-ips']), /172\.30\.0\.10 \. tcp \. 80/);

  // an endpoint more: a partial sync, and the count follows
  writeCluster(dir, ['10.1.0.1', '10.1.0.2', '10.1.0.4']);
  const more = await statusUntil(agent, 'the new endpoint', (j) => j.programmed.endpoints === 4 && !j.report.backends[0].lastSync.full);
  assert.equal(more.json.report.backends[0].lastSync.reason, 'change');
  assert.ok(more.json.metrics.figures.endpointChanges >= 1);
});

test('kpng status of a brain and of a split-mode agent that follows it, then loses it', { skip, timeout: 120_000 }, async () => {
  writeCluster(dir);
  const b = await brain(dir, started);
  let s = status(b);
  assert.equal(s.json.report.role, 'brain');
  assert.deepEqual(s.json.report.source, { kind: 'file', origin: dir, synced: true });
  assert.deepEqual(s.json.report.cluster, { services: 2, slices: 2, nodes: 1 });
  assert.equal(s.json.report.api.listen, b.api);
  assert.equal(s.json.report.api.streams, 0);
  assert.equal(s.json.programmed, undefined, 'a brain serves many nodes');
  assert.match(s.text, /^KPNG:\s+brain \(to-api\) /m);
  assert.match(s.text, /^Cluster:\s+2 Services, 2 EndpointSlices, 1 Nodes$/m);

  const ns = netns();
  const agent = await splitAgent(ns, dir, b.api, started);
  const split = status(agent);
  const r = split.json.report;
  assert.equal(r.role, 'node');
  assert.equal(r.source, undefined, 'kpng local has no source of its own');
  assert.deepEqual(r.brains.order, [b.api]);
  assert.equal(r.brains.current, b.api);
  assert.equal(r.brains.synced, true);
  assert.equal(r.backends[0].name, 'nft');
  assert.equal(split.json.health.code, 200);
  assert.deepEqual(split.json.programmed, { services: 2, endpoints: 3 });
  assert.match(split.text, new RegExp(`^Brain:\\s+${b.api} \\(its own; 1 brains\\), state received \\d+s ago$`, 'm'));

  // the brain counts the node's Watch stream
  s = await statusUntil(b, 'the node watching', (j) => j.report.api.streams === 1);
  assert.equal(s.json.metrics.figures.watchers.local, 1);
  assert.match(s.text, /^API:\s+.*: 1 Watch streams \(local 1(, global 0)?\), 1 connections$/m);

  // the brain goes away: the node says it has none (its dataplane stays)
  await b.kpng.stop();
  const lost = await statusUntil(agent, 'the brain lost', (j) => !j.report.brains.synced);
  assert.match(lost.text, /^Brain:\s+.*NOT CONNECTED/m);
  assert.deepEqual(lost.json.programmed, { services: 2, endpoints: 3 }, 'what it holds stays');
});

test('kpng status with no kpng there says so in one line', () => {
  const r = kpngSync(['status', '--socket', join(tmpdir(), 'kpng-no-such.sock')]);
  assert.equal(r.status, 1);
  assert.match(r.stderr, /no kpng is running here \(looked at .*kpng-no-such\.sock\); start one or use --socket/);
});

test('kpng status reads /metrics as Prometheus does, and shows the aggregator\'s tenants once they are served', () => {
  const text = [
    '# HELP kubeproxy_network_programming_duration_seconds x',
    'kubeproxy_network_programming_duration_seconds_bucket{le="0.25",ip_family="IPv4"} 1',
    'kubeproxy_network_programming_duration_seconds_bucket{le="0.5",ip_family="IPv4"} 2',
    'kubeproxy_network_programming_duration_seconds_bucket{le="1",ip_family="IPv4"} 4',
    'kubeproxy_network_programming_duration_seconds_bucket{le="+Inf",ip_family="IPv4"} 4',
    'kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"} 4',
    'kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv4"} 2',
    'kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv6"} 1',
    'kpng_tenant_elements{tenant="calico"} 12',
    'kpng_tenant_changes_total{tenant="calico"} 3',
    'kpng_tenant_refusals_total{tenant="calico"} 1',
    'kpng_tenant_elements{tenant="kube-network-policies"} 15',
  ].join('\n');
  const f = metricFigures(text);
  // histogram_quantile's interpolation: p50 at the top of the 0.5 bucket, p99 within the 1 s bucket
  assert.deepEqual(f.programming, { count: 4, p50: 0.5, p99: 0.99 });
  assert.equal(f.syncFailures, 3);
  assert.equal(f.repairs, undefined, 'not served: not zero');
  assert.deepEqual(f.tenants, [
    { tenant: 'calico', elements: 12, changes: 3, refusals: 1 },
    { tenant: 'kube-network-policies', elements: 15, changes: undefined, refusals: undefined },
  ]);
  const now = Date.parse('2026-01-01T00:10:00Z');
  const screen = formatStatus(
    {
      socket: 'unix:///run/kpng/node.sock',
      report: { role: 'node', version: '0.1.0', pid: 7, startedAt: '2026-01-01T00:00:00Z', node: 'n1', backends: [{ name: 'nft', proxyMode: 'nftables' }], metricsAddress: '127.0.0.1:10249' },
      metrics: { address: '127.0.0.1:10249', figures: f },
    },
    now,
  );
  assert.match(screen, /^KPNG:\s+node agent 0\.1\.0, pid 7, up 10m 0s \(\/run\/kpng\/node\.sock\)$/m);
  assert.match(screen, /^Last sync:\s+none yet$/m);
  assert.match(screen, /^Sync failures:\s+3$/m);
  assert.match(screen, /^Programming:\s+p50 500 ms, p99 990 ms over 4 changes$/m);
  assert.match(screen, /^Tenant calico:\s+12 elements, 3 changes, 1 refused$/m);
  assert.match(screen, /^Tenant kube-network-policies:\s+15 elements, 0 changes, 0 refused$/m);
});
