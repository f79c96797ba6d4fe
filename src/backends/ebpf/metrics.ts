// to-ebpf's own metrics (kpng_ebpf_*), in the process's registry: map fill
// levels, full maps, and what the programs counted (read when scraped).
import { Counter, Gauge } from 'prom-client';
import { registry } from '../../runtime/metrics.js';
import { COUNTERS } from './layout.js';
import type { Counters } from './maps.js';

let source: (() => Counters | undefined) | undefined;

export const ebpfMetrics = {
  entries: new Gauge({ name: 'kpng_ebpf_map_entries', help: 'Entries kpng wrote in an eBPF map', labelNames: ['map'], registers: [registry] }),
  capacity: new Gauge({ name: 'kpng_ebpf_map_capacity', help: 'The size of an eBPF map (its max entries)', labelNames: ['map'], registers: [registry] }),
  mapFull: new Counter({ name: 'kpng_ebpf_map_full_total', help: 'Syncs refused because an eBPF map would overflow', labelNames: ['map'], registers: [registry] }),
  programs: new Gauge({
    name: 'kpng_ebpf_socket_operations_total',
    help: "What kpng's socket programs did: translated (a Service address to an endpoint), refused (no endpoint), missed (an update in flight), reversed (getpeername, recvmsg)",
    labelNames: ['result'],
    registers: [registry],
    collect() {
      let c: Counters | undefined;
      try {
        c = source?.();
      } catch {
        c = undefined;
      }
      if (c) for (const k of COUNTERS) this.set({ result: k }, c[k]);
    },
  }),
};

/** where the programs' counters are read from when /metrics is scraped */
export function setCounterSource(fn: () => Counters | undefined): void {
  source = fn;
}
