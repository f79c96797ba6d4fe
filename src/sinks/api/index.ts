// to-api: serves the store to other processes over gRPC, wire-compatible
// with kpng: /localv1.Sets/Watch (node-local diff streams, for `kpng local`)
// and /globalv1.Sets/Watch (the global state, for `kpng api`).
import { DEFAULT_API } from '../../api/grpc/address.js';
import { tlsFromOpts } from '../../api/grpc/tls.js';
import { registerSink } from '../registry.js';
import { ApiServer, tuneHeapForFanOut } from './server.js';

export { ApiServer, tuneHeapForFanOut, type ApiServerOptions, type ApiServerStats } from './server.js';

registerSink({
  name: 'to-api',
  compactViews: true,
  description: 'serve node-local state (/localv1.Sets/Watch) and the global state (/globalv1.Sets/Watch) over gRPC',
  options(cmd) {
    cmd
      .option('--listen <address>', 'unix:///path/to.sock, or tcp://host:port (a non-loopback host needs TLS or --insecure)', DEFAULT_API)
      .option('--tls-cert <file>', 'server certificate (enables TLS)')
      .option('--tls-key <file>', 'key of --tls-cert')
      .option('--tls-ca <file>', 'require client certificates signed by this CA (mTLS)')
      .option('--insecure', 'allow a non-loopback TCP listener without TLS')
      .option('--no-local-api', 'do not serve /localv1.Sets/Watch')
      .option('--no-global-api', 'do not serve /globalv1.Sets/Watch');
  },
  async run(opts, ctx) {
    tuneHeapForFanOut();
    const server = new ApiServer({
      store: ctx.store,
      views: ctx.views,
      log: ctx.log,
      listen: opts.listen,
      tls: tlsFromOpts(opts),
      insecure: !!opts.insecure,
      localApi: opts.localApi !== false,
      globalApi: opts.globalApi !== false,
    });
    await server.start();
    try {
      await new Promise<void>((resolve) => {
        if (ctx.signal.aborted) return resolve();
        ctx.signal.addEventListener('abort', () => resolve(), { once: true });
      });
    } finally {
      await server.stop();
    }
  },
});
