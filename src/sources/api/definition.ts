// The api source's definition (name, flags): registered at start for the
// command line; the implementation (index.ts) loads when the source runs.
import { clientTLSFromOpts } from '../../api/grpc/tls.js';
import { addApiClientOptions } from '../../api/grpc/client-options.js';
import { registerSource } from '../registry.js';

registerSource({
  name: 'api',
  description: "fill the store from another kpng's global API (/globalv1.Sets/Watch), to chain brains",
  options(cmd) {
    addApiClientOptions(cmd);
  },
  // the gRPC client and the mirror load when the source starts
  async start(opts, ctx) {
    const { ApiSource } = await import('./index.js');
    const src = new ApiSource(ctx.store, ctx.log, {
      address: opts.api,
      tls: clientTLSFromOpts(opts),
      minBackoffMs: opts.errorDelay,
      maxBackoffMs: opts.maxErrorDelay,
      watchdogMs: opts.watchdog,
      failbackMs: opts.failback,
    });
    src.start();
    return { origin: opts.api, stop: () => src.stop() };
  },
});
