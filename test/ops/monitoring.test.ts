// deploy/monitoring: the alert rules checked and tested by Prometheus' own
// promtool (each alert with series that fire it and series that do not),
// the Grafana dashboard's shape and queries (valid PromQL, kpng's job), the
// PodMonitor and ServiceMonitor against the pods the manifests render, and
// every metric a query or an alert names served by a real kpng's /metrics:
// a node agent programming a test network namespace with to-nft, a brain,
// and a split-mode agent (kpng local).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parse, stringify } from 'yaml';
import { ROOT } from '../helpers/cli.js';
import { skipOrFailInCI } from '../helpers/ci.js';
import { canUseNetns, createNetns, type TestNetns } from '../helpers/netns.js';
import { OVERLAYS, kustomize, kustomizeMissing, renderOverlay } from '../helpers/deploy.js';
import { brain, httpGet, nodeAgent, splitAgent, writeCluster, type Kpng, type Served } from '../helpers/running-kpng.js';
import { until } from '../helpers/until.js';

type Obj = Record<string, any>;

const DIR = join(ROOT, 'deploy/monitoring');
const rules: Obj = parse(readFileSync(join(DIR, 'prometheus-rules.yaml'), 'utf8'));
const dashboard: Obj = JSON.parse(readFileSync(join(DIR, 'grafana-dashboard.json'), 'utf8'));
const promtoolMissing = skipOrFailInCI(spawnSync('promtool', ['--version']).status === 0 ? undefined : 'needs promtool (Debian: prometheus)');

/**
 * Metrics a query or an alert names that the kpng processes below do not
 * serve yet, each with why. The test fails when one of them is served: then
 * it leaves this list.
 */
const PENDING: Record<string, string> = {
  kubeproxy_conntrack_reconciler_sync_duration_seconds_bucket: "conntrack cleanup does not time its runs yet (kube-proxy's reconciler histogram)",
  kubeproxy_conntrack_reconciler_deleted_entries_total: 'a labelled counter: served from the first stale entry deleted, until the metrics are initialized at 0 (issue 41)',
  kubeproxy_sync_proxy_rules_iptables_restore_failures_total: 'to-iptables only (the scraped node agent runs to-nft)',
  kubeproxy_sync_proxy_rules_iptables_total: 'to-iptables only (the scraped node agent runs to-nft)',
  kubeproxy_sync_proxy_rules_iptables_last: 'to-iptables only (the scraped node agent runs to-nft)',
  kpng_api_connections_rejected_total: 'a labelled counter: served from the first connection refused',
  kpng_tenant_changes_total: 'labelled by tenant: served once a tenant is there (test/aggregator/nft-lab.test.ts checks them)',
  kpng_tenant_refusals_total: 'labelled by tenant: served once a tenant is there (test/aggregator/nft-lab.test.ts checks them)',
  kpng_tenant_elements: 'labelled by tenant: served once a tenant is there (test/aggregator/nft-lab.test.ts checks them)',
  kpng_tenant_change_duration_seconds_bucket: 'labelled by tenant: served once a tenant is there (test/aggregator/nft-lab.test.ts checks them)',
  rest_client_requests_total: "the kube source's client metrics (issue 41); the scraped processes use the file source",
  rest_client_request_duration_seconds_bucket: "the kube source's client metrics (issue 41); the scraped processes use the file source",
};
/** Prometheus' own series, not kpng's */
const PROMETHEUS_OWN = new Set(['up']);

/** every selector's metric name in a PromQL expression */
const selectors = (expr: string) => [...expr.matchAll(/([a-zA-Z_:][\w:]*)\{([^}]*)\}/g)].map((m) => ({ name: m[1]!, matchers: m[2]! }));

const alertRules = (): Obj[] => rules.spec.groups.flatMap((g: Obj) => g.rules).filter((r: Obj) => r.alert);
const dashboardTargets = (): { panel: string; expr: string }[] =>
  dashboard.panels.flatMap((p: Obj) => (p.targets ?? []).map((t: Obj) => ({ panel: p.title, expr: t.expr as string })));
/** a dashboard expression with Grafana's variables as Prometheus would get them */
const asPromQL = (expr: string) => expr.replaceAll('$__rate_interval', '5m').replace(/\$(node|backend)\b/g, '.*');

let work: string;
before(() => (work = mkdtempSync(join(tmpdir(), 'kpng-monitoring-'))));
after(() => rmSync(work, { recursive: true, force: true }));

function promtool(args: string[]): void {
  const r = spawnSync('promtool', args, { cwd: work, encoding: 'utf8' });
  assert.equal(r.status, 0, `promtool ${args.join(' ')}:\n${r.stdout}\n${r.stderr}`);
}

test('promtool checks the alert rules and every dashboard query', { skip: promtoolMissing }, () => {
  writeFileSync(join(work, 'kpng.rules.yml'), stringify(rules.spec));
  promtool(['check', 'rules', 'kpng.rules.yml']);
  // each query as a recording rule: promtool parses it as Prometheus will
  const recorded = dashboardTargets().map((t, i) => ({ record: `kpng_dashboard:query_${i}`, expr: asPromQL(t.expr) }));
  writeFileSync(join(work, 'dashboard.rules.yml'), stringify({ groups: [{ name: 'dashboard', rules: recorded }] }));
  promtool(['check', 'rules', 'dashboard.rules.yml']);
});

const base = { job: 'kpng', namespace: 'kube-system', pod: 'kpng-a', node: 'n1', backend: 'nft', component: 'node' };
const series = (name: string, labels: Record<string, string | undefined>, values: string) => ({
  series: `${name}{${Object.entries({ ...base, ...labels }).filter(([, v]) => v !== undefined).map(([k, v]) => `${k}="${v}"`).join(', ')}}`,
  values,
});
/** a brain's series: no backend */
const brainLabels = { component: 'brain', backend: undefined };
const v4 = { ip_family: 'IPv4' };

/** For each alert: series that fire it (with the labels it then carries) and series that do not. */
const CASES: Record<string, { fires: { input: Obj[]; at: string; labels: Record<string, string> }[]; quiet: { input: Obj[]; at: string; why: string }[] }> = {
  KpngTargetDown: {
    fires: [{ input: [series('up', {}, '0x20')], at: '15m', labels: { ...base } }],
    quiet: [{ input: [series('up', {}, '1x20')], at: '15m', why: 'scraped' }],
  },
  KpngSyncStalled: {
    // synced at 1m, then an update queued at 2m that never gets applied
    fires: [{ input: [series('kubeproxy_sync_proxy_rules_last_timestamp_seconds', v4, '60x10'), series('kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds', v4, '60 120x9')], at: '5m', labels: { ...base, ...v4 } }],
    quiet: [
      { input: [series('kubeproxy_sync_proxy_rules_last_timestamp_seconds', v4, '60x40'), series('kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds', v4, '50x40')], at: '30m', why: 'a quiet node: everything queued was applied long ago' },
      { input: [series('kubeproxy_sync_proxy_rules_last_timestamp_seconds', v4, '1+60x40'), series('kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds', v4, '0+60x40')], at: '30m', why: 'a busy node applying every update' },
    ],
  },
  KpngNodeNotProgrammed: {
    fires: [
      { input: [series('process_start_time_seconds', {}, '0x20')], at: '11m', labels: { ...base } },
      { input: [series('process_start_time_seconds', {}, '0x20'), series('kubeproxy_sync_proxy_rules_last_timestamp_seconds', v4, '0x20')], at: '11m', labels: { ...base } },
    ],
    quiet: [
      { input: [series('process_start_time_seconds', {}, '0x20'), series('kubeproxy_sync_proxy_rules_last_timestamp_seconds', v4, '0 60x19')], at: '11m', why: 'programmed at 1m' },
      { input: [series('process_start_time_seconds', {}, '0x20')], at: '9m', why: 'still starting' },
    ],
  },
  KpngSyncFailing: {
    fires: [
      { input: [series('kubeproxy_sync_proxy_rules_nftables_sync_failures_total', v4, '0+1x40')], at: '25m', labels: { namespace: base.namespace, pod: base.pod, node: base.node, backend: 'nft' } },
      { input: [series('kubeproxy_sync_proxy_rules_iptables_restore_failures_total', { ...v4, backend: 'iptables' }, '0+1x40')], at: '25m', labels: { namespace: base.namespace, pod: base.pod, node: base.node, backend: 'iptables' } },
    ],
    quiet: [{ input: [series('kubeproxy_sync_proxy_rules_nftables_sync_failures_total', v4, '0 0 0 1x37')], at: '30m', why: 'one failure, retried with success' }],
  },
  KpngNetworkProgrammingSlow: {
    fires: [
      {
        input: [
          series('kubeproxy_network_programming_duration_seconds_bucket', { ...v4, le: '5' }, '0x40'),
          series('kubeproxy_network_programming_duration_seconds_bucket', { ...v4, le: '30' }, '0+10x40'),
          series('kubeproxy_network_programming_duration_seconds_bucket', { ...v4, le: '+Inf' }, '0+10x40'),
        ],
        at: '30m',
        labels: { namespace: base.namespace, pod: base.pod, node: base.node },
      },
    ],
    quiet: [
      {
        input: [
          series('kubeproxy_network_programming_duration_seconds_bucket', { ...v4, le: '1' }, '0+10x40'),
          series('kubeproxy_network_programming_duration_seconds_bucket', { ...v4, le: '+Inf' }, '0+10x40'),
        ],
        at: '30m',
        why: 'every change programmed within a second',
      },
    ],
  },
  KpngServicesSkipped: {
    fires: [{ input: [series('kpng_sync_skipped_services', {}, '2x20')], at: '15m', labels: { namespace: base.namespace, pod: base.pod, node: base.node } }],
    quiet: [{ input: [series('kpng_sync_skipped_services', {}, '0x20')], at: '15m', why: 'none skipped' }],
  },
  KpngBrainWithoutWatchers: {
    fires: [{ input: [series('kpng_api_watchers', { ...brainLabels, api: 'local' }, '0x30')], at: '20m', labels: { job: 'kpng', namespace: base.namespace, pod: base.pod, node: base.node, component: 'brain', api: 'local' } }],
    quiet: [{ input: [series('kpng_api_watchers', { ...brainLabels, api: 'local' }, '3x30')], at: '20m', why: 'three nodes follow it' }],
  },
  KpngNodeWithoutBrain: {
    fires: [{ input: [series('kpng_local_brain_connected', { brain: 'tcp://a:12090' }, '0x20'), series('kpng_local_brain_connected', { brain: 'tcp://b:12090' }, '0x20')], at: '10m', labels: { namespace: base.namespace, pod: base.pod, node: base.node } }],
    quiet: [{ input: [series('kpng_local_brain_connected', { brain: 'tcp://a:12090' }, '0x20'), series('kpng_local_brain_connected', { brain: 'tcp://b:12090' }, '1x20')], at: '10m', why: 'failed over to its second brain' }],
  },
};

/** an alert's annotations for these labels ({{ $labels.x }} only, as the rules use) */
function annotations(rule: Obj, labels: Record<string, string>): Record<string, string> {
  return Object.fromEntries(Object.entries(rule.annotations as Record<string, string>).map(([k, v]) => [k, v.replace(/\{\{ \$labels\.(\w+) \}\}/g, (_, l: string) => labels[l] ?? '')]));
}

test('promtool test rules: each alert fires on the series it is for, and not on the others', { skip: promtoolMissing }, () => {
  const alerts = alertRules();
  assert.deepEqual(alerts.map((r) => r.alert).sort(), Object.keys(CASES).sort(), 'a case for every alert');
  for (const r of alerts) assert.doesNotMatch(JSON.stringify(r.annotations), /\$value/, `${r.alert}: annotations from labels only`);
  const tests = alerts.flatMap((rule) => {
    const c = CASES[rule.alert]!;
    return [
      ...c.fires.map((f) => ({
        interval: '1m',
        input_series: f.input,
        alert_rule_test: [{ eval_time: f.at, alertname: rule.alert, exp_alerts: [{ exp_labels: { ...f.labels, ...rule.labels }, exp_annotations: annotations(rule, f.labels) }] }],
      })),
      ...c.quiet.map((q) => ({ interval: '1m', input_series: q.input, alert_rule_test: [{ eval_time: q.at, alertname: rule.alert, exp_alerts: [] }] })),
    ];
  });
  writeFileSync(join(work, 'kpng.rules.yml'), stringify(rules.spec));
  writeFileSync(join(work, 'kpng.tests.yml'), stringify({ rule_files: ['kpng.rules.yml'], evaluation_interval: '1m', tests }));
  promtool(['test', 'rules', 'kpng.tests.yml']);
});

test('the dashboard: Grafana JSON shaped, panels laid out, every query on kpng and its variables', () => {
  assert.equal(dashboard.uid, 'kpng-proxy');
  assert.ok(dashboard.schemaVersion >= 36);
  const vars = new Set(dashboard.templating.list.map((v: Obj) => v.name));
  assert.deepEqual([...vars].sort(), ['backend', 'datasource', 'node']);
  const ids = new Set<number>();
  const cells = new Set<string>();
  for (const p of dashboard.panels) {
    assert.ok(!ids.has(p.id), `panel id ${p.id} once`);
    ids.add(p.id);
    const g = p.gridPos;
    assert.ok(g.x >= 0 && g.w > 0 && g.x + g.w <= 24 && g.h > 0, `${p.title}: within the grid`);
    for (let x = g.x; x < g.x + g.w; x++) for (let y = g.y; y < g.y + g.h; y++) {
      assert.ok(!cells.has(`${x},${y}`), `${p.title}: overlaps another panel`);
      cells.add(`${x},${y}`);
    }
    if (p.type === 'row') continue;
    assert.ok(['timeseries', 'stat'].includes(p.type), p.type);
    assert.equal(p.datasource.uid, '${datasource}');
    assert.ok(p.targets.length > 0, p.title);
    for (const t of p.targets) {
      assert.ok(t.refId && t.expr, `${p.title}: a query`);
      for (const v of t.expr.matchAll(/\$(\w+)/g)) assert.ok(vars.has(v[1]) || v[1].startsWith('__'), `${p.title}: $${v[1]} is a variable`);
      for (const s of selectors(t.expr)) assert.match(s.matchers, /\bjob="kpng"/, `${p.title}: ${s.name} selects kpng's job`);
    }
  }
  // what the issue asks the dashboard to show
  const all = dashboardTargets().map((t) => t.expr).join('\n');
  for (const m of ['kubeproxy_sync_proxy_rules_duration_seconds_count', 'kubeproxy_network_programming_duration_seconds_bucket', 'kubeproxy_sync_proxy_rules_endpoint_changes_total', 'kubeproxy_sync_proxy_rules_service_changes_total', 'kubeproxy_sync_proxy_rules_nftables_sync_failures_total', 'kpng_sync_skipped_services', 'kpng_dataplane_repairs_total', 'kubeproxy_conntrack_reconciler_deleted_entries_total', 'kubeproxy_conntrack_reconciler_sync_duration_seconds_bucket', 'kpng_api_watchers', 'kpng_api_bytes_total', 'kpng_tenant_changes_total', 'kpng_tenant_refusals_total', 'kpng_tenant_elements', 'kpng_tenant_change_duration_seconds_bucket']) {
    assert.ok(all.includes(`${m}{`), m);
  }
  assert.match(all, /sum by \(backend\) \(rate\(kubeproxy_sync_proxy_rules_duration_seconds_count/, 'sync rate by backend');
  for (const r of alertRules()) for (const s of selectors(r.expr)) assert.match(s.matchers, /\bjob="kpng"/, `${r.alert}: ${s.name} selects kpng's job`);
});

test('the PodMonitor and the ServiceMonitor scrape every kpng pod the manifests run, as job kpng with node, backend and component', { skip: kustomizeMissing() }, () => {
  const rendered = kustomize(DIR);
  assert.deepEqual(rendered.map((d) => d.kind).sort(), ['ConfigMap', 'PodMonitor', 'PrometheusRule']);
  const cm = rendered.find((d) => d.kind === 'ConfigMap')!;
  assert.equal(cm.metadata.labels.grafana_dashboard, '1');
  assert.deepEqual(JSON.parse(cm.data['grafana-dashboard.json']), dashboard);
  const [svc, sm] = readFileSync(join(DIR, 'servicemonitor.yaml'), 'utf8').split(/^---$/m).map((d) => parse(d) as Obj) as [Obj, Obj];
  const pm = rendered.find((d) => d.kind === 'PodMonitor')!;
  for (const overlay of OVERLAYS) {
    for (const w of renderOverlay(overlay).filter((d) => ['DaemonSet', 'Deployment'].includes(d.kind))) {
      const where = `${overlay} ${w.metadata.name}`;
      const labels = w.spec.template.metadata.labels;
      const c = w.spec.template.spec.containers[0];
      for (const [m, endpoints] of [[pm, pm.spec.podMetricsEndpoints], [sm, sm.spec.endpoints]] as const) {
        assert.ok(m.spec.namespaceSelector.matchNames.includes(w.metadata.namespace), `${where}: ${m.kind} namespace`);
        for (const [k, v] of Object.entries(m.spec.selector.matchLabels)) assert.equal(labels[k], v, `${where}: ${m.kind} selects it`);
        assert.equal(labels[m.spec.jobLabel], 'kpng', `${where}: job="kpng"`);
        const port = c.ports.find((p: Obj) => p.name === endpoints[0].port);
        assert.ok(port, `${where}: a ${endpoints[0].port} port`);
        assert.match(c.args.join(' '), new RegExp(`--metrics-bind-address=\\$\\(NODE_IP\\):${port.containerPort}`), `${where}: metrics served on that port, on the node's address`);
        const relabeled = Object.fromEntries(endpoints[0].relabelings.map((r: Obj) => [r.targetLabel, r.sourceLabels[0]]));
        assert.deepEqual(relabeled, {
          node: '__meta_kubernetes_pod_node_name',
          backend: '__meta_kubernetes_pod_label_kpng_io_backend',
          component: '__meta_kubernetes_pod_label_app_kubernetes_io_component',
        });
        assert.ok(labels['app.kubernetes.io/component'], `${where}: a component label`);
      }
      for (const [k, v] of Object.entries(svc.spec.selector)) assert.equal(labels[k], v, `${where}: the headless Service selects it`);
    }
  }
  assert.equal(svc.spec.clusterIP, 'None', 'headless: no ClusterIP for kpng to program');
  assert.deepEqual(sm.spec.selector.matchLabels, svc.metadata.labels);
});

describeScrape();

/** every metric a query or an alert names, served by a real kpng (or PENDING, with why) */
function describeScrape() {
  const skip = canUseNetns();
  const started: Kpng[] = [];
  const namespaces: TestNetns[] = [];
  let dir: string;
  after(async () => {
    await Promise.all(started.map((p) => p.stop()));
    for (const ns of namespaces) ns.remove();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  test('every metric the dashboard and the alerts name is served by a node agent, a brain or a split-mode agent', { skip, timeout: 120_000 }, async () => {
    dir = mkdtempSync(join(tmpdir(), 'kpng-scrape-'));
    writeCluster(dir);
    const netns = () => (namespaces.push(createNetns()), namespaces.at(-1)!);
    const agent = await nodeAgent(netns(), dir, started);
    const b = await brain(dir, started);
    const split = await splitAgent(netns(), dir, b.api, started);
    // a change after the start: programming latency, changes, partial syncs
    writeCluster(dir, ['10.1.0.1', '10.1.0.2', '10.1.0.4']);
    const scrape = (s: Served) => httpGet(s.netns, s.metricsPort, '/metrics').then((r) => r.body);
    const programmedOnce = (s: Served) =>
      until('network programming observed', async () => /^kubeproxy_network_programming_duration_seconds_count\{[^}]*\} [1-9]/m.test(await scrape(s)), { timeoutMs: 30_000, everyMs: 200 });
    await Promise.all([programmedOnce(agent), programmedOnce(split)]);
    const served = new Set((await Promise.all([agent, b, split].map(scrape))).flatMap((text) => [...text.matchAll(/^([a-zA-Z_:][\w:]*)[{ ]/gm)].map((m) => m[1]!)));

    const named = new Map<string, string>();
    for (const t of dashboardTargets()) for (const s of selectors(t.expr)) named.set(s.name, `dashboard panel "${t.panel}"`);
    for (const r of alertRules()) for (const s of selectors(r.expr)) named.set(s.name, `alert ${r.alert}`);
    const missing = [...named].filter(([n]) => !served.has(n) && !PENDING[n] && !PROMETHEUS_OWN.has(n)).map(([n, where]) => `${n} (${where})`);
    assert.deepEqual(missing, [], 'named by a query or an alert, and served by no kpng');
    const nowServed = Object.keys(PENDING).filter((n) => served.has(n));
    assert.deepEqual(nowServed, [], 'served now: remove from PENDING');
    const unused = Object.keys(PENDING).filter((n) => !named.has(n));
    assert.deepEqual(unused, [], 'PENDING names only what a query or an alert names');
  });
}
