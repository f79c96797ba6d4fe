// Backends program a node's dataplane from its node-local diff stream. A
// backend is a folder under src/backends that calls registerBackend; the CLI
// offers it as `to-<name>` below `to-local` (and below `local`). Every kpng
// process registers every backend: a definition loads nothing heavy, its
// create() and cleanup() import the implementation (see nft/index.ts).
import type { Command } from 'commander';
import type { Logger } from '../runtime/log.js';
import type { LocalSink } from '../diff/ops.js';
import type { LocalSet } from '../api/model.js';
import type { KubeProxyConfiguration } from './shared/config.js';
import type { SyncResult } from './shared/runner.js';
import type { TenantLedger } from '../aggregator/dataplane.js';

/** How a backend tells the process (health, metrics) what each sync did, whoever asked for it. */
export type SyncReporter = (r: SyncResult) => void;

export interface BackendContext {
  readonly nodeName: string;
  /** kube-proxy's configuration (defaults applied; from --config if given) */
  readonly config: KubeProxyConfiguration;
  readonly log: Logger;
  readonly signal: AbortSignal;
  readonly report: SyncReporter;
  /** nothing before the backend keeps the node's endpoints decoded (kpng local): a proxier keeps them encoded */
  readonly packEndpoints?: boolean;
  /** the node agent's tenants (src/aggregator): an nftables backend writes their content in its syncs */
  readonly tenants?: TenantLedger;
}

export interface BackendInstance {
  /** receives the node-local diff stream */
  readonly sink: LocalSink;
  /** sets beyond services and endpoints the backend wants (NodesSet, ...) */
  readonly sets?: readonly LocalSet[];
  /** called once when the process stops; must leave the dataplane in place */
  close?(): Promise<void>;
}

export interface BackendDefinition {
  /** "nft" makes the command "to-nft" */
  readonly name: string;
  readonly description: string;
  /** backend-specific flags (--node-name, --config and --once are added for every backend) */
  options?(cmd: Command): void;
  /**
   * A dataplane backend gets kube-proxy's /healthz, /livez and /metrics
   * servers; this is its answer on /proxyMode (e.g. "nftables").
   */
  readonly proxyMode?: string;
  /** the sync period that bounds health (2 x this), from the configuration */
  syncPeriodMs?(config: KubeProxyConfiguration): number;
  create(opts: Record<string, any>, ctx: BackendContext): BackendInstance | Promise<BackendInstance>;
  /**
   * `kpng cleanup`: removes everything this backend installed on the node
   * (its tables, chains, sets) and nothing else; goes on past a part it
   * cannot remove, and reports it.
   */
  cleanup?(log: Logger): Promise<CleanupReport>;
}

/** What `kpng cleanup` did in one backend, one entry per table (or chain set), as printed. */
export interface CleanupReport {
  readonly removed: string[];
  /** found, and left on purpose: what and why */
  readonly kept: string[];
  /** could not be removed: what and why (the command then exits 1) */
  readonly failed: string[];
}

const backends = new Map<string, BackendDefinition>();

export function registerBackend(def: BackendDefinition): void {
  if (backends.has(def.name)) throw new Error(`backend ${def.name} registered twice`);
  backends.set(def.name, def);
}

export function registeredBackends(): BackendDefinition[] {
  return [...backends.values()];
}

export function getBackend(name: string): BackendDefinition | undefined {
  return backends.get(name);
}
