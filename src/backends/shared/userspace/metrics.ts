// The userspace proxy's metrics (kpng_userspace_*), in the process's registry.

/** the engines of this process, read when /metrics is scraped */
const engines = new Set<() => { sockets: number; maxSockets: number }>();

/** adds an engine's socket counts to the gauges; returns its removal */
export function reportSockets(read: () => { sockets: number; maxSockets: number }): () => void {
  engines.add(read);
  return () => engines.delete(read);
}

const sum = (k: 'sockets' | 'maxSockets') => [...engines].reduce((n, read) => n + read()[k], 0);
import { Counter, Gauge } from 'prom-client';
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
    help: 'Userspace proxy: connections refused or broken per Service (no_endpoints, endpoint_refused, io, udp_session_evicted, capacity)',
    labelNames: ['service', 'protocol', 'reason'] as const,
    registers: [registry],
  }),
  userspaceSockets: new Gauge({
    name: 'kpng_userspace_sockets',
    help: 'Userspace proxy: sockets of relayed connections (both ends) and UDP sessions, open now',
    registers: [registry],
    collect() {
      this.set(sum('sockets'));
    },
  }),
  userspaceMaxSockets: new Gauge({
    name: 'kpng_userspace_sockets_max',
    help: "Userspace proxy: sockets it may open at most (the open files limit, less its listeners' and what kpng keeps for itself); past it, new clients are refused (reason capacity)",
    registers: [registry],
    collect() {
      this.set(sum('maxSockets'));
    },
  }),
};
