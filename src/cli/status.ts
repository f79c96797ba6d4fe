// kpng status: one screen about the kpng running on this node (or the brain
// whose state socket is named): what it is, where its state comes from, its
// backends' syncs, health, what its node's state holds; -o json for scripts.
import { Option, type Command } from 'commander';
import { registerCommand } from './commands.js';
import { defaultSocket } from './get.js';
import { DEFAULT_BRAIN_SOCKET, DEFAULT_NODE_SOCKET } from '../sinks/api/defaults.js';

const HELP = `
Asks a running kpng on its state socket (a node agent's ${DEFAULT_NODE_SOCKET.slice(7)}, else a
brain's ${DEFAULT_BRAIN_SOCKET.slice(7)}, or --socket), then reads its /healthz and /metrics:
  node agent (to-local, kpng local)   the node, the API server or the brain it follows,
                                      its backends and their last syncs, health, the
                                      Services and endpoints its node's state holds,
                                      skipped Services, sync failures, drift repairs,
                                      conntrack cleanup, network programming latency
  brain (to-api)                      the API server, what it holds, its Watch streams
In a pod: kubectl -n kube-system exec POD -- kpng status
`;

registerCommand((program, run) => {
  program
    .command('status')
    .description('show what the kpng running here does: backends, source or brain, syncs, health')
    .option('--socket <path>', "a kpng's state socket")
    .addOption(new Option('-o, --output <format>', 'output format').choices(['json']))
    .addHelpText('after', HELP)
    .action(function (this: Command) {
      const o = this.opts();
      return run(async () => {
        const [{ fetchStatus, formatStatus }, { GetError }] = await Promise.all([import('../get/status.js'), import('../get/fetch.js')]);
        try {
          const view = await fetchStatus(o.socket ? (o.socket.startsWith('unix:') ? o.socket : `unix://${o.socket}`) : defaultSocket());
          console.log(o.output === 'json' ? JSON.stringify(view, null, 2) : formatStatus(view));
        } catch (e) {
          if (e instanceof GetError) e.stack = `kpng status: ${e.message}`;
          throw e;
        }
      });
    });
});
