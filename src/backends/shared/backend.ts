// What every dataplane backend's registration shares: the flags of a proxier
// (--dry-run, --no-health-checks), the options they make, and the instance
// around a proxier (its decoder sink, close).
import type { Command } from 'commander';
import type { Family } from '../../api/ip.js';
import type { LocalSet } from '../../api/model.js';
import { DecoderSink } from '../../diff/decoder.js';
import type { BackendContext, BackendInstance } from '../registry.js';
import type { KubeProxyConfiguration } from './config.js';
import type { ProxierBase, ProxierBaseOptions } from './proxier.js';
import type { TenantLedger } from '../../aggregator/dataplane.js';

/** What a dataplane proxier is told, whatever its dataplane. */
export interface DataplaneOptions extends ProxierBaseOptions {
  readonly nodeName: string;
  readonly config: KubeProxyConfiguration;
  /** where --dry-run prints */
  readonly out?: NodeJS.WritableStream;
  readonly families?: readonly Family[];
  /** the drift check (default: unless once or dry run) */
  readonly watch?: boolean;
  /** the network namespace the dataplane is in, when not this process's (tests: a name under /run/netns) */
  readonly netns?: string;
  /** the node's tenants (src/aggregator), whose content a backend that can writes beside its own */
  readonly tenants?: TenantLedger;
}

/** --dry-run (what it prints), --no-health-checks */
export function addDataplaneFlags(cmd: Command, dryRun: string): Command {
  return cmd
    .option('--dry-run', `print ${dryRun} on stdout instead of applying it`)
    .option('--no-health-checks', 'do not serve healthCheckNodePorts');
}

/** The options those flags and the backend context make. */
export function dataplaneOptions(opts: Record<string, any>, ctx: BackendContext): DataplaneOptions {
  return {
    nodeName: ctx.nodeName,
    config: ctx.config,
    log: ctx.log,
    dryRun: !!opts.dryRun,
    once: !!opts.once,
    healthChecks: opts.healthChecks,
    report: ctx.report,
    packEndpoints: ctx.packEndpoints,
    tenants: ctx.tenants,
  };
}

/** A proxier as a backend instance: it takes the diff stream through a decoder. */
export function proxierInstance(proxier: ProxierBase, sets: readonly LocalSet[]): BackendInstance {
  return { sink: new DecoderSink(proxier), sets, close: () => proxier.close() };
}
