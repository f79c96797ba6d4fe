// Starting a registered backend: node name, kube-proxy configuration and
// --once are handled here for every backend, wherever its ops come from
// (to-local in-process, or the local gRPC source).
import { hostname } from 'node:os';
import type { Command } from 'commander';
import type { Logger } from '../log.js';
import type { LocalOp, LocalSink } from '../diff/ops.js';
import { LocalSet, type LocalNode } from '../api/model.js';
import { getBackend, type BackendDefinition, type BackendInstance, type SyncReporter } from './registry.js';
import { addConfigFlags, configFromFlags, type KubeProxyConfiguration } from './shared/config.js';
import { ProxyHealth, startProxyServers } from './shared/health.js';
import { metrics, enableProcessMetrics } from './shared/metrics.js';
import type { SyncResult } from './shared/runner.js';

/** The flags every backend command has, then the backend's own. */
export function addBackendOptions(cmd: Command, def: BackendDefinition): void {
  cmd
    .option('--node-name <name>', 'the node whose state to program (default: hostnameOverride, then the hostname)')
    .option('--once', 'apply the first full state, then exit 0 (the dataplane stays)');
  addConfigFlags(cmd);
  def.options?.(cmd);
}

export interface StartedBackend {
  readonly instance: BackendInstance;
  readonly nodeName: string;
  readonly config: KubeProxyConfiguration;
  /** the sink to feed: the backend's, with health, metrics and --once around it */
  readonly sink: LocalSink;
  /** resolves after the first Sync was applied when --once is set */
  readonly done: Promise<void>;
  readonly health: ProxyHealth;
  /** the last sync's result (whoever asked for it) */
  readonly lastResult: SyncResult | undefined;
  /** every sync's result from now on, whoever asked for it; returns an unsubscriber */
  onResult(listener: (r: SyncResult) => void): () => void;
  /** stops the backend and its servers (the dataplane stays) */
  close(): Promise<void>;
}

export async function startBackend(name: string, opts: Record<string, any>, log: Logger, signal: AbortSignal): Promise<StartedBackend> {
  const def = getBackend(name);
  if (!def) throw new Error(`unknown backend ${name}`);
  const config = configFromFlags(opts);
  const nodeName = String(opts.nodeName || config.hostnameOverride || hostname());
  const health = new ProxyHealth(2 * (def.syncPeriodMs?.(config) ?? config.nftables.syncPeriodMs));
  let lastResult: SyncResult | undefined;
  const listeners = new Set<(r: SyncResult) => void>();
  // changes received and not yet applied (kube-proxy's *_changes_pending)
  let pendingEndpoints = 0;
  let pendingServices = 0;
  const report: SyncReporter = (r) => {
    lastResult = r;
    health.observe(r);
    for (const l of listeners) l(r);
    if (r.ok) {
      pendingEndpoints = pendingServices = 0;
      metrics.endpointChangesPending.set(0);
      metrics.serviceChangesPending.set(0);
    }
    if (!r.ok) return;
    metrics.syncDuration.observe({ ip_family: '' }, r.durationMs / 1000);
    (r.full ? metrics.syncFullDuration : metrics.syncPartialDuration).observe({ ip_family: '' }, r.durationMs / 1000);
  };
  const blog = log.child({ backend: name });
  const instance = await def.create(opts, { nodeName, config, log: blog, signal, report });
  let closeServers = async () => {};
  if (def.proxyMode && !opts.once) {
    enableProcessMetrics();
    closeServers = await startProxyServers(
      health,
      { healthzBindAddress: config.healthzBindAddress, metricsBindAddress: config.metricsBindAddress, proxyMode: def.proxyMode, hardFail: config.bindAddressHardFail },
      blog,
    );
  }
  let resolveDone!: () => void;
  const done = new Promise<void>((r) => (resolveDone = r));
  let inDiff = false;
  const sink: LocalSink = {
    async send(op: LocalOp) {
      if (!inDiff && op.kind !== 'sync') {
        inDiff = true;
        health.queued();
      }
      if (op.kind === 'set' || op.kind === 'delete') {
        if (op.set === LocalSet.EndpointsSet) {
          metrics.endpointChangesTotal.inc();
          metrics.endpointChangesPending.set(++pendingEndpoints);
        } else if (op.set === LocalSet.ServicesSet) {
          metrics.serviceChangesTotal.inc();
          metrics.serviceChangesPending.set(++pendingServices);
        }
        if (op.set === LocalSet.NodesSet) health.nodeEligible = op.kind === 'delete' || !(op.value as LocalNode).Deleting;
      }
      metrics.opsSent.inc({ op: op.kind });
      await instance.sink.send(op);
      if (op.kind === 'sync') {
        inDiff = false;
        if (opts.once) resolveDone();
      }
    },
  };
  return {
    instance,
    nodeName,
    config,
    sink,
    done,
    health,
    get lastResult() {
      return lastResult;
    },
    onResult(l) {
      listeners.add(l);
      return () => listeners.delete(l);
    },
    async close() {
      await instance.close?.();
      await closeServers();
    },
  };
}
