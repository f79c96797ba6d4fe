// Starting a registered backend: node name, kube-proxy configuration and
// --once are handled here for every backend, wherever its ops come from
// (to-local in-process, or the local gRPC source).
import { hostname } from 'node:os';
import type { Command } from 'commander';
import type { Logger } from '../log.js';
import type { LocalOp, LocalSink } from '../diff/ops.js';
import { getBackend, type BackendDefinition, type BackendInstance } from './registry.js';
import { addConfigFlags, configFromFlags, type KubeProxyConfiguration } from './shared/config.js';

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
  /** the sink to feed: the backend's, wrapped for --once */
  readonly sink: LocalSink;
  /** resolves after the first Sync was applied when --once is set */
  readonly done: Promise<void>;
}

export async function startBackend(name: string, opts: Record<string, any>, log: Logger, signal: AbortSignal): Promise<StartedBackend> {
  const def = getBackend(name);
  if (!def) throw new Error(`unknown backend ${name}`);
  const config = configFromFlags(opts);
  const nodeName = String(opts.nodeName || config.hostnameOverride || hostname());
  const instance = await def.create(opts, { nodeName, config, log: log.child({ backend: name }), signal });
  let resolveDone!: () => void;
  const done = new Promise<void>((r) => (resolveDone = r));
  const sink: LocalSink = opts.once
    ? {
        async send(op: LocalOp) {
          await instance.sink.send(op);
          if (op.kind === 'sync') resolveDone();
        },
      }
    : instance.sink;
  return { instance, nodeName, config, sink, done };
}
