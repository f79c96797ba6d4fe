// to-api's definition (name, flags): registered at start for the command
// line; the server (server.ts) loads when the sink runs.
import { DEFAULT_API } from '../../api/grpc/address.js';
import { tlsFromOpts } from '../../api/grpc/tls.js';
import { registerSink } from '../registry.js';
import { ConfigError } from '../../runtime/errors.js';
import { DEFAULT_HANDSHAKE_TIMEOUT_MS, DEFAULT_MAX_CONNECTIONS, RESERVED_FDS } from './listener.js';
import { DEFAULT_BRAIN_SOCKET, DEFAULT_HEAP_GROWTH_PERCENT, STATE_SOCKET_HELP } from './defaults.js';

/** kube-proxy's metrics address (a brain and a node agent on one host's network need one of them moved) */
const DEFAULT_METRICS_ADDRESS = '127.0.0.1:10249';

/** a whole number in [min, max] from a flag, or a ConfigError naming it */
function wholeNumber(flag: string, value: unknown, min: number, max: number, unit: string): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < min || n > max) throw new ConfigError(flag, `${value} is not a whole number of ${unit} from ${min} to ${max}`);
  return n;
}

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
      .option('--no-global-api', 'do not serve /globalv1.Sets/Watch')
      .option('--heap-growth <percent>', "how far V8's heap may grow past what survived the last full GC (0: V8's own, up to 4x)", String(DEFAULT_HEAP_GROWTH_PERCENT))
      .option(
        '--max-connections <n>',
        `open connections at most; more are closed at once (default: ${DEFAULT_MAX_CONNECTIONS}, or the open-file limit less ${RESERVED_FDS} if that is lower)`,
      )
      .option('--handshake-timeout <ms>', 'close a connection that does not complete the TLS handshake, then the HTTP/2 one, within this', String(DEFAULT_HANDSHAKE_TIMEOUT_MS))
      .option('--metrics-bind-address <host:port>', "serve /metrics here ('' : not at all)", DEFAULT_METRICS_ADDRESS)
      .option('--state-socket <address>', STATE_SOCKET_HELP, DEFAULT_BRAIN_SOCKET);
  },
  async run(opts, ctx) {
    const growth = wholeNumber('--heap-growth', opts.heapGrowth, 0, 1000, 'percent');
    const maxConnections = opts.maxConnections === undefined ? undefined : wholeNumber('--max-connections', opts.maxConnections, 1, 1_000_000, 'connections');
    const handshakeTimeoutMs = wholeNumber('--handshake-timeout', opts.handshakeTimeout, 100, 600_000, 'milliseconds');
    // the server loads when the sink runs
    const [{ ApiServer, tuneHeapForFanOut }, { closeServers, listenHttp, metricsHandler }, { enableProcessMetrics }, { TRIM_AFTER_BURST_MS, trimMemory }, { sourceStatus, startStateSocket }, { processStatus }, { version }] = await Promise.all([
      import('./server.js'),
      import('../../runtime/health.js'),
      import('../../runtime/metrics.js'),
      import('../../runtime/memory.js'),
      import('./state-socket.js'),
      import('../../api/grpc/status.js'),
      import('../../runtime/version.js'),
    ]);
    tuneHeapForFanOut(growth);
    let listening = opts.listen;
    const count = (it: Iterable<unknown>) => {
      let n = 0;
      for (const _ of it) n++;
      return n;
    };
    const status = () => ({
      ...processStatus('brain', version()),
      source: sourceStatus(ctx),
      api: { listen: listening, streams: server.stats.streams, connections: server.connections },
      metricsAddress: opts.metricsBindAddress || undefined,
      cluster: { services: count(ctx.store.serviceKeys()), slices: count(ctx.store.allSlices()), nodes: count(ctx.store.allNodes()) },
    });
    const server = new ApiServer({
      store: ctx.store,
      views: ctx.views,
      log: ctx.log,
      listen: opts.listen,
      tls: tlsFromOpts(opts),
      insecure: !!opts.insecure,
      localApi: opts.localApi !== false,
      globalApi: opts.globalApi !== false,
      maxConnections,
      handshakeTimeoutMs,
      // the listener may be the state socket itself (then it answers kpng status too)
      status: opts.listen === opts.stateSocket ? status : undefined,
    });
    listening = await server.start();
    const state = listening === opts.stateSocket ? undefined : await startStateSocket({ address: opts.stateSocket, store: ctx.store, views: ctx.views, log: ctx.log, status });
    enableProcessMetrics();
    const metricsServer = await listenHttp(opts.metricsBindAddress, '/metrics', metricsHandler(), ctx.log);
    // the sources' first lists are the brain's burst (as a node agent's full sync is)
    let cancelTrim = () => {};
    const trim = () => (cancelTrim = trimMemory(TRIM_AFTER_BURST_MS));
    const unsubscribe = ctx.store.allSynced ? (trim(), () => {}) : ctx.store.subscribe((c) => c.becameSynced && trim());
    try {
      await new Promise<void>((resolve) => {
        if (ctx.signal.aborted) return resolve();
        ctx.signal.addEventListener('abort', () => resolve(), { once: true });
      });
    } finally {
      unsubscribe();
      cancelTrim();
      await closeServers([metricsServer]);
      await state?.stop();
      await server.stop();
    }
  },
});
