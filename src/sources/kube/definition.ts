// The kube source's definition (name, flags): registered at start for the
// command line; the implementation (index.ts) loads when the source runs.
import { registerSource } from '../registry.js';

registerSource({
  name: 'kube',
  description: 'list and watch a Kubernetes API server (kubeconfig, KUBECONFIG, or in-cluster credentials)',
  options(cmd) {
    cmd
      .option('--kubeconfig <path>', 'kubeconfig file (default: $KUBECONFIG, then in-cluster, then ~/.kube/config)')
      .option('--master <url>', 'API server URL (overrides the kubeconfig\'s server)')
      .option('--context <name>', 'kubeconfig context (default: its current-context)')
      .option('--watch-node <name>', 'watch only this Node (enough for a node-local proxy; a to-api brain needs all nodes)');
  },
  // the client and reflectors load when the source starts
  async start(opts, ctx) {
    const { KubeSource, resolveConnection } = await import('./index.js');
    const connection = resolveConnection({ kubeconfig: opts.kubeconfig, master: opts.master, context: opts.context });
    const src = new KubeSource(ctx.store, ctx.log, {
      connection,
      serviceProxyName: opts.serviceProxyName || undefined,
      watchNode: opts.watchNode || undefined,
    });
    ctx.log.info({ server: connection.server.origin, origin: connection.origin }, `kube source: watching ${connection.server.origin}`);
    src.start();
    return { origin: connection.server.origin, stop: () => src.stop() };
  },
});
