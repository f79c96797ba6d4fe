// Metrics with kube-proxy's names (kubeproxy_*) wherever kpng measures the
// same thing, plus kpng's own (kpng_*). One private registry for the process:
// no default metrics unless the daemon asks (they cost CPU in tests).
import { Registry, Histogram, Counter, Gauge, collectDefaultMetrics } from 'prom-client';

export const registry = new Registry();

export const exp = (start: number, factor: number, n: number) => Array.from({ length: n }, (_, i) => start * factor ** i);
const lin = (start: number, width: number, n: number) => Array.from({ length: n }, (_, i) => start + width * i);
/** upstream's: 0.25s, 0.5s, 1..59s, 60..115s by 5s, 2..5min by 30s */
const PROGRAMMING_BUCKETS = [...lin(0.25, 0.25, 2), ...lin(1, 1, 59), ...lin(60, 5, 12), ...lin(120, 30, 7)];
const familyLabel = ['ip_family'] as const;

export const metrics = {
  syncDuration: new Histogram({
    name: 'kubeproxy_sync_proxy_rules_duration_seconds',
    help: 'SyncProxyRules latency in seconds',
    buckets: exp(0.001, 2, 15),
    labelNames: familyLabel,
    registers: [registry],
  }),
  syncFullDuration: new Histogram({
    name: 'kubeproxy_sync_full_proxy_rules_duration_seconds',
    help: 'SyncProxyRules latency in seconds for full resyncs',
    buckets: exp(0.001, 2, 15),
    labelNames: familyLabel,
    registers: [registry],
  }),
  syncPartialDuration: new Histogram({
    name: 'kubeproxy_sync_partial_proxy_rules_duration_seconds',
    help: 'SyncProxyRules latency in seconds for partial resyncs',
    buckets: exp(0.001, 2, 15),
    labelNames: familyLabel,
    registers: [registry],
  }),
  lastSync: new Gauge({ name: 'kubeproxy_sync_proxy_rules_last_timestamp_seconds', help: 'The last time proxy rules were successfully synced', labelNames: familyLabel, registers: [registry] }),
  lastQueued: new Gauge({ name: 'kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds', help: 'The last time a sync of proxy rules was queued', labelNames: familyLabel, registers: [registry] }),
  networkProgramming: new Histogram({
    name: 'kubeproxy_network_programming_duration_seconds',
    help: 'In Cluster Network Programming Latency in seconds (from an EndpointSlice change, its last-change-trigger-time when set, to the rules being programmed)',
    buckets: PROGRAMMING_BUCKETS,
    labelNames: familyLabel,
    registers: [registry],
  }),
  endpointChangesPending: new Gauge({ name: 'kubeproxy_sync_proxy_rules_endpoint_changes_pending', help: 'Pending proxy rules Endpoint changes', registers: [registry] }),
  endpointChangesTotal: new Counter({ name: 'kubeproxy_sync_proxy_rules_endpoint_changes_total', help: 'Cumulative proxy rules Endpoint changes', registers: [registry] }),
  serviceChangesPending: new Gauge({ name: 'kubeproxy_sync_proxy_rules_service_changes_pending', help: 'Pending proxy rules Service changes', registers: [registry] }),
  serviceChangesTotal: new Counter({ name: 'kubeproxy_sync_proxy_rules_service_changes_total', help: 'Cumulative proxy rules Service changes', registers: [registry] }),
  noLocalEndpoints: new Gauge({
    name: 'kubeproxy_sync_proxy_rules_no_local_endpoints_total',
    help: 'Number of services with a Local traffic policy and no endpoints',
    labelNames: ['traffic_policy', 'ip_family'] as const,
    registers: [registry],
  }),
  nftablesSyncFailures: new Counter({ name: 'kubeproxy_sync_proxy_rules_nftables_sync_failures_total', help: 'Cumulative proxy nftables sync failures', labelNames: familyLabel, registers: [registry] }),
  nftablesCleanupFailures: new Counter({ name: 'kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total', help: 'Cumulative proxy nftables cleanup failures', labelNames: familyLabel, registers: [registry] }),
  iptablesRestoreFailures: new Counter({ name: 'kubeproxy_sync_proxy_rules_iptables_restore_failures_total', help: 'Cumulative proxy iptables restore failures', labelNames: familyLabel, registers: [registry] }),
  iptablesPartialRestoreFailures: new Counter({ name: 'kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total', help: 'Cumulative proxy iptables partial restore failures', labelNames: familyLabel, registers: [registry] }),
  iptablesTotal: new Gauge({ name: 'kubeproxy_sync_proxy_rules_iptables_total', help: 'Total number of iptables rules owned by kpng', labelNames: ['table', 'ip_family'] as const, registers: [registry] }),
  iptablesLast: new Gauge({ name: 'kubeproxy_sync_proxy_rules_iptables_last', help: 'Number of iptables rules written by kpng in last sync', labelNames: ['table', 'ip_family'] as const, registers: [registry] }),
  conntrackDeleted: new Counter({ name: 'kubeproxy_conntrack_reconciler_deleted_entries_total', help: 'Cumulative conntrack flows deleted by conntrack cleanup', labelNames: familyLabel, registers: [registry] }),
  conntrackDuration: new Histogram({
    name: 'kubeproxy_conntrack_reconciler_sync_duration_seconds',
    help: 'Conntrack cleanup latency in seconds: one round of one family (a dump of its UDP entries, then the deletes)',
    buckets: exp(0.001, 2, 15),
    labelNames: familyLabel,
    registers: [registry],
  }),
  conntrackFailures: new Counter({ name: 'kpng_conntrack_reconciler_failures_total', help: 'Conntrack cleanup rounds of a family that failed (stale UDP entries left to time out)', labelNames: familyLabel, registers: [registry] }),
  healthz: new Counter({ name: 'kubeproxy_proxy_healthz_total', help: 'Cumulative proxy healthz HTTP status', labelNames: ['code'] as const, registers: [registry] }),
  livez: new Counter({ name: 'kubeproxy_proxy_livez_total', help: 'Cumulative proxy livez HTTP status', labelNames: ['code'] as const, registers: [registry] }),

  // kpng's own
  apiEvents: new Gauge({ name: 'kpng_api_events_total', help: 'Writes received from sources (Kubernetes events, file objects), changed or not', registers: [registry] }),
  revisions: new Gauge({ name: 'kpng_store_revisions_total', help: 'Store revisions: updates that really changed the global state', registers: [registry] }),
  opsSent: new Counter({ name: 'kpng_node_local_ops_total', help: 'Node-local diff-stream ops delivered to a backend or a watcher', labelNames: ['op'] as const, registers: [registry] }),
  stageDuration: new Histogram({
    name: 'kpng_stage_duration_seconds',
    help: 'Time per sync stage: compute (node-local diff), render (backend transaction), apply (kernel)',
    buckets: exp(0.0005, 2, 16),
    labelNames: ['stage'] as const,
    registers: [registry],
  }),
  skippedServices: new Gauge({ name: 'kpng_sync_skipped_services', help: 'Services left out of the dataplane because it refuses them (each logged once; retried when they change)', registers: [registry] }),
  repairs: new Counter({ name: 'kpng_dataplane_repairs_total', help: 'Times the periodic check found the dataplane changed by someone else and repaired it', registers: [registry] }),
  elementChanges: new Counter({ name: 'kpng_nftables_element_changes_total', help: 'nftables map/set elements added or deleted', registers: [registry] }),
  nodeKnown: new Gauge({
    name: 'kpng_node_known',
    help: "1 when the node-local state has this agent's Node, 0 when the cluster has no Node of its name (a mistyped --node-name, or a Node not registered yet)",
    registers: [registry],
  }),
};

let defaultsOn = false;
/** process metrics (CPU, memory, event loop); only for the daemon */
export function enableProcessMetrics(): void {
  if (defaultsOn) return;
  defaultsOn = true;
  collectDefaultMetrics({ register: registry });
}

export type IpFamily = 'IPv4' | 'IPv6';

/**
 * kube-proxy runs one proxier per IP family and labels its sync metrics
 * with it; a kpng sync programs both families at once, so these carry the
 * node's primary family (IPv4 unless the node has IPv6 addresses only).
 * Metrics of one family's own work (a table's cleanup, conntrack entries)
 * carry that family.
 */
let primaryFamily: IpFamily = 'IPv4';
let initializedModes: readonly string[] | undefined;

export function ipFamily(): IpFamily {
  return primaryFamily;
}

/** The node's primary family (from its Node's addresses); its known series start at 0 when it changes. */
export function setIpFamily(family: IpFamily): void {
  if (family === primaryFamily) return;
  primaryFamily = family;
  if (initializedModes) initKnownSeries(initializedModes);
}

/** kube-proxy's failure counters of each proxy mode */
const FAILURE_COUNTERS: Record<string, readonly Counter<'ip_family'>[]> = {
  nftables: [metrics.nftablesSyncFailures, metrics.nftablesCleanupFailures],
  iptables: [metrics.iptablesRestoreFailures, metrics.iptablesPartialRestoreFailures],
};

/**
 * Every series a dashboard or an alert (absent(), rate()) expects, at 0 from
 * the start rather than from the first event: the sync and programming
 * histograms, the failure counters of the proxy modes running, health
 * answers, Services without local endpoints, and the last sync's timestamp
 * (0: never, so "too long since the last sync" holds before the first one).
 * The last queued timestamp is the start, as kube-proxy sets it.
 */
export function initKnownSeries(proxyModes: readonly string[]): void {
  initializedModes = proxyModes;
  const f = { ip_family: primaryFamily };
  for (const h of [metrics.syncDuration, metrics.syncFullDuration, metrics.syncPartialDuration, metrics.networkProgramming]) h.zero(f);
  for (const mode of proxyModes) for (const c of FAILURE_COUNTERS[mode] ?? []) c.inc(f, 0);
  for (const traffic_policy of ['internal', 'external']) metrics.noLocalEndpoints.set({ traffic_policy, ...f }, 0);
  for (const code of ['200', '503']) {
    metrics.healthz.inc({ code }, 0);
    metrics.livez.inc({ code }, 0);
  }
  metrics.lastSync.set(f, 0);
  metrics.lastQueued.set(f, Date.now() / 1000);
}
