// What `kpng status` shows of a running kpng: its own report (the status
// query of its state socket: what it is, where its state comes from, its
// backends' last syncs), its /healthz and /metrics read as the probes and
// Prometheus read them, and for a node agent how many Services and endpoints
// its node's state holds (the node-local Watch, counted as it streams).
import type * as grpc from '@grpc/grpc-js';
import { create } from '@bufbuild/protobuf';
import { grpcJs } from '../runtime/lazy.js';
import { parseBindAddress } from '../runtime/health.js';
import { LocalSet } from '../api/model.js';
import { WatchReqSchema } from '../api/gen/api/localv1/api_pb.js';
import { parseAddress } from '../api/grpc/address.js';
import { newClient } from '../api/grpc/client.js';
import { localWatchMethod } from '../api/grpc/wire.js';
import { requestStatus, type StatusReport, type SyncStatus } from '../api/grpc/status.js';
import { GetError, readToSync } from './fetch.js';

const TIMEOUT_MS = 10_000;
const HTTP_TIMEOUT_MS = 3_000;

/** What the metrics say, as kpng status shows it (absent: not served). */
export interface MetricFigures {
  syncFailures?: number;
  repairs?: number;
  skippedServices?: number;
  conntrackDeleted?: number;
  endpointChanges?: number;
  serviceChanges?: number;
  /** network programming latency since the start (seconds) */
  programming?: { count: number; p50?: number; p99?: number };
  /** a brain's open Watch streams by API (local: nodes, global: chained brains) */
  watchers?: Record<string, number>;
  /** the aggregator's tenants (kpng_tenant_*), once it serves them */
  tenants?: { tenant: string; elements?: number; changes?: number; refusals?: number }[];
}

export interface StatusView {
  socket: string;
  report: StatusReport;
  health?: { address: string; code?: number; body?: Record<string, unknown>; error?: string };
  metrics?: { address: string; figures?: MetricFigures; error?: string };
  /** a node agent: what its node's state holds */
  programmed?: { services: number; endpoints: number } | { error: string };
}

interface Sample {
  readonly name: string;
  readonly labels: Readonly<Record<string, string>>;
  readonly value: number;
}

/** Prometheus' text format, the samples only (comments and types skipped). */
function parseMetrics(text: string): Sample[] {
  const out: Sample[] = [];
  for (const line of text.split('\n')) {
    const m = /^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels: Record<string, string> = {};
    for (const l of (m[2] ?? '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]!] = l[2]!.replace(/\\(.)/g, (_, c: string) => (c === 'n' ? '\n' : c));
    out.push({ name: m[1]!, labels, value: Number(m[3]) });
  }
  return out;
}

/** the sum of a metric's samples, or undefined when none is served */
function total(samples: readonly Sample[], name: string): number | undefined {
  const of = samples.filter((s) => s.name === name);
  return of.length ? of.reduce((n, s) => n + s.value, 0) : undefined;
}

/** A quantile of a histogram over its whole life, as PromQL's histogram_quantile interpolates within a bucket. */
function histogramQuantile(samples: readonly Sample[], name: string, q: number): number | undefined {
  const buckets = new Map<number, number>();
  for (const s of samples) if (s.name === `${name}_bucket`) buckets.set(Number(s.labels.le), (buckets.get(Number(s.labels.le)) ?? 0) + s.value);
  const sorted = [...buckets].sort(([a], [b]) => a - b);
  const count = sorted.at(-1)?.[1] ?? 0;
  if (!count) return undefined;
  const rank = q * count;
  let [lower, below] = [0, 0];
  for (const [le, n] of sorted) {
    if (n >= rank) return le === Infinity ? lower : lower + ((le - lower) * (rank - below)) / Math.max(n - below, 1);
    [lower, below] = [le, n];
  }
  return lower;
}

/** The figures kpng status shows, from a /metrics text. */
export function metricFigures(text: string): MetricFigures {
  const s = parseMetrics(text);
  const failures = ['kubeproxy_sync_proxy_rules_nftables_sync_failures_total', 'kubeproxy_sync_proxy_rules_iptables_restore_failures_total'].map((n) => total(s, n));
  const programmed = total(s, 'kubeproxy_network_programming_duration_seconds_count');
  const byLabel = (name: string, label: string) => new Map(s.filter((x) => x.name === name).map((x) => [x.labels[label] ?? '', x.value]));
  const watchers = byLabel('kpng_api_watchers', 'api');
  const elements = byLabel('kpng_tenant_elements', 'tenant');
  const changes = byLabel('kpng_tenant_changes_total', 'tenant');
  const refusals = byLabel('kpng_tenant_refusals_total', 'tenant');
  const tenants = [...new Set([...elements.keys(), ...changes.keys(), ...refusals.keys()])].sort();
  return {
    syncFailures: failures.some((f) => f !== undefined) ? failures.reduce<number>((a, b) => a + (b ?? 0), 0) : undefined,
    repairs: total(s, 'kpng_dataplane_repairs_total'),
    skippedServices: total(s, 'kpng_sync_skipped_services'),
    conntrackDeleted: total(s, 'kubeproxy_conntrack_reconciler_deleted_entries_total'),
    endpointChanges: total(s, 'kubeproxy_sync_proxy_rules_endpoint_changes_total'),
    serviceChanges: total(s, 'kubeproxy_sync_proxy_rules_service_changes_total'),
    programming:
      programmed === undefined
        ? undefined
        : { count: programmed, p50: histogramQuantile(s, 'kubeproxy_network_programming_duration_seconds', 0.5), p99: histogramQuantile(s, 'kubeproxy_network_programming_duration_seconds', 0.99) },
    watchers: watchers.size ? Object.fromEntries(watchers) : undefined,
    tenants: tenants.length ? tenants.map((tenant) => ({ tenant, elements: elements.get(tenant), changes: changes.get(tenant), refusals: refusals.get(tenant) })) : undefined,
  };
}

/** http://host:port for a bind address (every address: the loopback one) */
function httpBase(bind: string): string {
  const a = parseBindAddress(bind)!;
  const host = a.host === '0.0.0.0' ? '127.0.0.1' : a.host === '::' ? '::1' : a.host;
  return `http://${host.includes(':') ? `[${host}]` : host}:${a.port}`;
}

async function httpGet(bind: string, path: string): Promise<{ code: number; text: string }> {
  const r = await fetch(`${httpBase(bind)}${path}`, { signal: AbortSignal.timeout(HTTP_TIMEOUT_MS) });
  return { code: r.status, text: await r.text() };
}

const reason = (e: unknown) => {
  const err = e as Error & { cause?: Error };
  return err.cause?.message ?? err.message;
};

async function health(address: string): Promise<NonNullable<StatusView['health']>> {
  try {
    const r = await httpGet(address, '/healthz');
    return { address, code: r.code, body: JSON.parse(r.text) as Record<string, unknown> };
  } catch (e) {
    return { address, error: reason(e) };
  }
}

async function metrics(address: string): Promise<NonNullable<StatusView['metrics']>> {
  try {
    const r = await httpGet(address, '/metrics');
    if (r.code !== 200) return { address, error: `HTTP ${r.code}` };
    return { address, figures: metricFigures(r.text) };
  } catch (e) {
    return { address, error: reason(e) };
  }
}

/** The node's state as its agent serves it (Reset, Sets, Sync), counted. */
async function programmed(client: grpc.Client, deadline: number): Promise<NonNullable<StatusView['programmed']>> {
  let services = 0;
  let endpoints = 0;
  try {
    await readToSync(client, localWatchMethod.path, localWatchMethod.serialize(create(WatchReqSchema, { NodeName: '', Sets: [] })), deadline, (op) => {
      if (op.Op.case !== 'Set') return;
      if (op.Op.value.Ref?.Set === LocalSet.ServicesSet) services++;
      else if (op.Op.value.Ref?.Set === LocalSet.EndpointsSet) endpoints++;
    });
    return { services, endpoints };
  } catch (e) {
    return { error: (e as grpc.ServiceError).details ?? (e as Error).message };
  }
}

/** Asks the kpng whose state socket is at address. */
export async function fetchStatus(address: string): Promise<StatusView> {
  const client = newClient(parseAddress(address), undefined);
  const deadline = Date.now() + TIMEOUT_MS;
  const path = address.replace(/^unix:(\/\/)?/, '');
  try {
    let report: StatusReport;
    try {
      report = await requestStatus(client, deadline);
    } catch (e) {
      const err = e as grpc.ServiceError;
      if (err.code === grpcJs().status.UNIMPLEMENTED) throw new GetError(`the kpng at ${path} does not answer kpng status (an older kpng, or a to-file one)`);
      if (err.code === grpcJs().status.UNAVAILABLE) throw new GetError(`no kpng is running here (looked at ${path}); start one or use --socket`);
      throw new GetError(`${path}: ${err.details ?? err.message}`);
    }
    const [h, m, p] = await Promise.all([
      report.healthzAddress ? health(report.healthzAddress) : undefined,
      report.metricsAddress ? metrics(report.metricsAddress) : undefined,
      report.role === 'node' ? programmed(client, deadline) : undefined,
    ]);
    return { socket: address, report, ...(h && { health: h }), ...(m && { metrics: m }), ...(p && { programmed: p }) };
  } finally {
    client.close();
  }
}

/** "3m 12s" */
function duration(ms: number): string {
  const s = Math.max(0, Math.round(ms / 1000));
  const parts = [
    [Math.floor(s / 86400), 'd'],
    [Math.floor(s / 3600) % 24, 'h'],
    [Math.floor(s / 60) % 60, 'm'],
    [s % 60, 's'],
  ] as const;
  const first = parts.findIndex(([n]) => n > 0);
  return first < 0 ? '0s' : parts.slice(first, first + 2).map(([n, u]) => `${n}${u}`).join(' ');
}

const seconds = (s: number | undefined) => (s === undefined ? '?' : s < 1 ? `${Math.round(s * 1000)} ms` : `${s.toFixed(1)} s`);

function syncLine(s: SyncStatus, now: number): string {
  const what = `${s.ok ? 'ok' : 'FAILED'} ${duration(now - Date.parse(s.at))} ago, ${s.full ? 'full' : 'partial'} (${s.reason}), ${s.durationMs} ms, ${s.changes} changes`;
  return s.error ? `${what}: ${s.error}` : what;
}

/** One screen, label: value, as `cilium status` prints. */
export function formatStatus(v: StatusView, now = Date.now()): string {
  const r = v.report;
  const lines: [string, string][] = [];
  const add = (label: string, value: string) => lines.push([label, value]);
  add('KPNG', `${r.role === 'brain' ? 'brain (to-api)' : 'node agent'} ${r.version}, pid ${r.pid}, up ${duration(now - Date.parse(r.startedAt))} (${v.socket.replace(/^unix:(\/\/)?/, '')})`);
  if (r.node) add('Node', r.node);
  if (r.source) add('Source', `${r.source.kind} ${r.source.origin} (${r.source.synced ? 'listed, watching' : 'listing'})`);
  if (r.brains) {
    const b = r.brains;
    const own = b.order[0];
    const which = b.current === undefined ? 'none yet' : `${b.current} (${b.current === own ? 'its own' : `failed over from its own, ${own}`}; ${b.order.length} brains)`;
    add('Brain', `${which}, ${b.synced ? `state received ${duration(now - Date.parse(b.since!))} ago` : 'NOT CONNECTED: waiting for its state'}`);
  }
  if (r.cluster) add('Cluster', `${r.cluster.services} Services, ${r.cluster.slices} EndpointSlices, ${r.cluster.nodes} Nodes`);
  if (r.api) {
    const w = v.metrics?.figures?.watchers;
    const by = w ? ` (${Object.entries(w).map(([api, n]) => `${api} ${n}`).join(', ')})` : '';
    add('API', `${r.api.listen}: ${r.api.streams} Watch streams${by}, ${r.api.connections} connections`);
  }
  if (r.backends) add('Backends', r.backends.map((b) => (b.proxyMode ? `${b.name} (${b.proxyMode})` : b.name)).join(', '));
  if (v.health) {
    const h = v.health;
    const last = h.body?.lastUpdated ? `, last update ${h.body.lastUpdated}` : '';
    add('Health', h.error ? `cannot read /healthz on ${h.address}: ${h.error}` : `${h.code === 200 ? 'ok' : 'UNHEALTHY'} (/healthz ${h.code} on ${h.address}${last})`);
  }
  for (const b of r.backends ?? []) {
    if (!b.proxyMode) continue;
    const label = r.backends!.filter((x) => x.proxyMode).length > 1 ? `Last sync ${b.name}` : 'Last sync';
    add(label, b.lastSync ? syncLine(b.lastSync, now) : 'none yet');
    if (b.lastSuccess) add('  last good', syncLine(b.lastSuccess, now));
  }
  if (v.programmed) add('Programmed', 'error' in v.programmed ? `cannot count: ${v.programmed.error}` : `${v.programmed.services} Services, ${v.programmed.endpoints} endpoints`);
  const f = v.metrics?.figures;
  if (f && r.role === 'node') {
    const skipped = [...new Set((r.backends ?? []).flatMap((b) => b.lastSync?.skipped ?? []))];
    add('Skipped Services', `${f.skippedServices ?? 0}${skipped.length ? `: ${skipped.join(', ')}` : ''}`);
    add('Sync failures', String(f.syncFailures ?? 0));
    add('Drift repairs', String(f.repairs ?? 0));
    add('Conntrack cleanup', `${f.conntrackDeleted ?? 0} stale entries deleted`);
    add('Changes', `${f.serviceChanges ?? 0} Service, ${f.endpointChanges ?? 0} endpoint`);
    if (f.programming) add('Programming', f.programming.count ? `p50 ${seconds(f.programming.p50)}, p99 ${seconds(f.programming.p99)} over ${f.programming.count} changes` : 'no change since the start');
  }
  for (const t of f?.tenants ?? []) add(`Tenant ${t.tenant}`, `${t.elements ?? 0} elements, ${t.changes ?? 0} changes, ${t.refusals ?? 0} refused`);
  if (v.metrics) add('Metrics', v.metrics.error ? `cannot read /metrics on ${v.metrics.address}: ${v.metrics.error}` : v.metrics.address);
  const width = Math.max(...lines.map(([l]) => l.length)) + 2;
  return lines.map(([l, value]) => `${`${l}:`.padEnd(width)}${value}`).join('\n');
}
