// The node agent's tenant flags (to-local, kpng local): registered at every
// start for the command line, so nothing here loads the aggregator itself.
import type { Command } from 'commander';
import { runSocket } from '../runtime/run-dir.js';

export const DEFAULT_RULES_SOCKET = runSocket('rules.sock');

/** --rules-socket and --tenants-config on a node agent's command */
export function addTenantFlags(cmd: Command): Command {
  return cmd
    .option('--rules-socket <address>', "serve the tenant API (other agents' packet-filter rules, written by kpng: docs/aggregator.md) here (unix:///path, mode 0600; '': not at all)", DEFAULT_RULES_SOCKET)
    .option('--tenants-config <file>', "the aggregator's configuration: grace, rate limit, quotas, allow-list of tenants and their hooks (YAML or JSON; docs/aggregator.md)");
}

/** What those flags say. */
export interface TenantFlags {
  readonly socket: string;
  readonly configFile?: string;
}

export function tenantFlags(opts: Record<string, any>): TenantFlags {
  return { socket: String(opts.rulesSocket ?? DEFAULT_RULES_SOCKET), configFile: opts.tenantsConfig };
}
