// kpng local (src/sinks/local/remote.ts)'s command and flags: registered at start for the
// command line; the implementation loads when the command runs.
import { addBackendCommands } from '../backends/run.js';
import { registerCommand } from './commands.js';
import { DEFAULT_NODE_SOCKET, STATE_SOCKET_HELP } from '../sinks/api/defaults.js';
import { addApiClientOptions } from '../api/grpc/client-options.js';
import { addTenantFlags } from '../aggregator/defaults.js';

registerCommand((program, run) => {
  const lc = program
    .command('local')
    .description("program this node from another kpng's node-local API (to-api): kpng local --api ADDR to-<backend>")
    .enablePositionalOptions()
    .option('--node-name <name>', 'the node to watch (default: the backend\'s --node-name, hostnameOverride, then the hostname)')
    .option('--no-resume', 'after a reconnect, ask for the full state instead of sending what this node holds')
    .option('--state-socket <address>', STATE_SOCKET_HELP, DEFAULT_NODE_SOCKET);
  addApiClientOptions(lc);
  addTenantFlags(lc);
  // the client, the reset filter and the mirror load when the command runs
  addBackendCommands(lc, (backends) =>
    run(async (log, signal) => {
      const { runLocal } = await import('../sinks/local/remote.js');
      await runLocal(lc.opts(), backends, log, signal);
    }),
  );
});
