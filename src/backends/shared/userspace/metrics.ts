// The userspace proxy's metrics (kpng_userspace_*), in the process's registry.
import { Counter } from 'prom-client';
import { registry } from '../../../runtime/metrics.js';

export const userspaceMetrics = {
  userspaceConnections: new Counter({
    name: 'kpng_userspace_connections_total',
    help: 'Userspace proxy: connections (TCP) and sessions (UDP) accepted, per Service',
    labelNames: ['service', 'protocol'] as const,
    registers: [registry],
  }),
  userspaceBytes: new Counter({
    name: 'kpng_userspace_bytes_total',
    help: 'Userspace proxy: bytes relayed per Service, to_endpoint or to_client (TCP: counted when a connection ends)',
    labelNames: ['service', 'protocol', 'direction'] as const,
    registers: [registry],
  }),
  userspaceErrors: new Counter({
    name: 'kpng_userspace_errors_total',
    help: 'Userspace proxy: connections refused or broken per Service (no_endpoints, endpoint_refused, io, udp_session_evicted)',
    labelNames: ['service', 'protocol', 'reason'] as const,
    registers: [registry],
  }),
};
