// Sinks consume the store (to-file, to-local, to-api). Each registers itself.
// Every kpng process registers every sink: a definition loads nothing heavy,
// its run() imports the implementation (see file/definition.ts).
import type { Command } from 'commander';
import type { Logger } from '../runtime/log.js';
import type { Store } from '../store/store.js';
import type { ServiceViews } from '../localstate/views.js';

export interface SinkContext {
  readonly store: Store;
  /** node-local views, shared by everything that serves nodes */
  readonly views: ServiceViews;
  readonly log: Logger;
  readonly signal: AbortSignal;
  /** --node-name given at the source (`kpng file --node-name N to-local ...`) */
  readonly nodeName?: string;
  /** the source filling the store (kube, file, api) and where it reads from */
  readonly source?: { readonly name: string; readonly origin?: string };
}

/** a backend chosen below a sink like to-local, with its flags */
export interface SubcommandRun {
  readonly name: string;
  readonly opts: Record<string, any>;
}

export interface SinkDefinition {
  /** command name, e.g. "to-file" */
  readonly name: string;
  readonly description: string;
  options(cmd: Command): void;
  /** true for sinks whose work is done by a to-<backend> subcommand (to-local) */
  readonly takesBackend?: boolean;
  /** node-local views keep only their encoding (a server fanning out to many nodes sends bytes) */
  readonly compactViews?: boolean;
  /** runs until ctx.signal aborts, or until the sink is done (e.g. --once); backends: to-local's, in order (empty for other sinks) */
  run(opts: Record<string, any>, ctx: SinkContext, backends: readonly SubcommandRun[]): Promise<void>;
}

const sinks = new Map<string, SinkDefinition>();

export function registerSink(def: SinkDefinition): void {
  if (sinks.has(def.name)) throw new Error(`sink ${def.name} registered twice`);
  sinks.set(def.name, def);
}

export function registeredSinks(): SinkDefinition[] {
  return [...sinks.values()];
}
