// The brain's metrics (to-api: kpng_api_*), in the process's registry.
import { Counter, Gauge, Histogram } from 'prom-client';
import { exp, registry } from '../../runtime/metrics.js';

export const apiMetrics = {
  watchers: new Gauge({ name: 'kpng_api_watchers', help: 'Open Watch streams of to-api, by API (local: nodes, global: chained brains)', labelNames: ['api'] as const, registers: [registry] }),
  apiDiffDuration: new Histogram({
    name: 'kpng_api_diff_duration_seconds',
    help: 'to-api: time to compute a diff for a watcher and write it to its stream',
    buckets: exp(0.0001, 2, 18),
    labelNames: ['api'] as const,
    registers: [registry],
  }),
  apiMessages: new Counter({ name: 'kpng_api_messages_total', help: 'to-api: OpItems sent to watchers', labelNames: ['api'] as const, registers: [registry] }),
  apiBytes: new Counter({ name: 'kpng_api_bytes_total', help: 'to-api: bytes sent to watchers, with gRPC framing', labelNames: ['api'] as const, registers: [registry] }),
  apiConnections: new Gauge({ name: 'kpng_api_connections', help: 'Open connections to the to-api server (in handshake or serving)', registers: [registry] }),
  apiConnectionsRejected: new Counter({
    name: 'kpng_api_connections_rejected_total',
    help: 'Connections to the to-api server refused at --max-connections (reason max_connections) or closed for not completing the TLS and HTTP/2 handshake in time (handshake_timeout)',
    labelNames: ['reason'] as const,
    registers: [registry],
  }),
};
