// Sources fill the store (kube, file, api). Each registers itself; the CLI
// builds `kpng <source> [flags] <sink> ...` from this registry. Every kpng
// process registers every source: a definition loads nothing heavy, its
// start() imports the implementation (see file/definition.ts).
import type { Command } from 'commander';
import type { Logger } from '../runtime/log.js';
import type { Store } from '../store/store.js';

export interface SourceContext {
  readonly store: Store;
  readonly log: Logger;
  /** aborted when the process is asked to stop */
  readonly signal: AbortSignal;
  /** the pipeline ends after its first complete state (--once): a source that cannot give one must fail */
  readonly once?: boolean;
  /** the node's kube-proxy configuration's clientConnection (to-local's backend --config), for a source that talks to an API server */
  readonly clientConnection?: { readonly kubeconfig: string };
}

export interface SourceHandle {
  /** where it reads from, for kpng status: the API server's URL, the input path, the brains */
  readonly origin?: string;
  stop(): Promise<void>;
}

export interface SourceDefinition {
  /** command name, e.g. "file" */
  readonly name: string;
  readonly description: string;
  /** declares the source's flags on its command */
  options(cmd: Command): void;
  /** starts filling ctx.store; resolves once started (not once synced) */
  start(opts: Record<string, any>, ctx: SourceContext): Promise<SourceHandle>;
}

const sources = new Map<string, SourceDefinition>();

export function registerSource(def: SourceDefinition): void {
  if (sources.has(def.name)) throw new Error(`source ${def.name} registered twice`);
  sources.set(def.name, def);
}

export function registeredSources(): SourceDefinition[] {
  return [...sources.values()];
}
