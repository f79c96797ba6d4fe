// The flags of a kpng API client (kpng local, the api source), apart from
// the client so that registering those commands loads none of it.
import type { Command } from 'commander';
import { DEFAULT_API } from './address.js';
import { DEFAULT_FAILBACK_MS, DEFAULT_WATCHDOG_MS } from './client.js';
import { addClientTLSOptions } from './tls.js';

const ms = (v: string) => {
  const n = Number(v);
  if (!Number.isFinite(n) || n <= 0) throw new Error(`not a positive number of milliseconds: ${v}`);
  return n;
};

export function addApiClientOptions(cmd: Command): void {
  cmd
    .option('--api <address>[,<address>...]', 'the kpng API: unix:///path/to.sock, tcp://host:port or host:port; several brains comma-separated (each client picks its own by its name and fails over to the others)', DEFAULT_API)
    .option('--error-delay <ms>', 'first retry delay after a failure (doubles, with jitter)', ms, 200)
    .option('--max-error-delay <ms>', 'longest retry delay', ms, 10_000)
    .option('--watchdog <ms>', "give a brain up when a stream's first answer, or the rest of a diff, does not come within this", ms, DEFAULT_WATCHDOG_MS)
    .option('--failback <ms>', 'on another brain than its own: how often to check whether its own answers again', ms, DEFAULT_FAILBACK_MS);
  addClientTLSOptions(cmd);
}
