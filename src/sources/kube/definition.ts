// The kube source's definition (name, flags): registered at start for the
// command line; the implementation (index.ts) loads when the source runs.
import { registerSource } from '../registry.js';

registerSource({
  name: 'kube',
  description: 'list and watch a Kubernetes API server (kubeconfig, KUBECONFIG, or in-cluster credentials)',
  options(cmd) {
    cmd
      .option('--kubeconfig <path>', "kubeconfig file (default: the backend --config's clientConnection.kubeconfig, $KUBECONFIG, in-cluster, then ~/.kube/config)")
      .option('--master <url>', "the API server's real address, e.g. https://10.0.0.1:6443 (a node without kube-proxy cannot reach it through the kubernetes Service); overrides the kubeconfig's server; without a kubeconfig, with the pod's service-account token and CA")
      .option('--context <name>', 'kubeconfig context (default: its current-context)')
      .option('--watch-node <name>', 'watch only this Node (enough for a node-local proxy; a to-api brain needs all nodes)');
  },
  // the client and reflectors load when the source starts
  async start(opts, ctx) {
    const { KubeSource, resolveConnection } = await import('./index.js');
    const connection = resolveConnection({ kubeconfig: opts.kubeconfig, configKubeconfig: ctx.clientConnection?.kubeconfig || undefined, master: opts.master, context: opts.context });
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
