// Per-tenant metrics (kpng_tenant_*), on the node agent's /metrics. The
// names are a contract with dashboards: keep them.
import { Counter, Gauge, Histogram } from 'prom-client';
import { exp, registry } from '../runtime/metrics.js';

const tenant = ['tenant'] as const;

export const tenantMetrics = {
  changes: new Counter({ name: 'kpng_tenant_changes_total', help: "A tenant's requests (Declare, ChangeElements, Unregister) whose content reached the kernel", labelNames: tenant, registers: [registry] }),
  refusals: new Counter({ name: 'kpng_tenant_refusals_total', help: "A tenant's requests refused (by kpng's checks, quotas, the allow-list, or the kernel)", labelNames: tenant, registers: [registry] }),
  elements: new Gauge({ name: 'kpng_tenant_elements', help: "Elements of a tenant's sets and maps, as kpng writes them", labelNames: tenant, registers: [registry] }),
  changeDuration: new Histogram({
    name: 'kpng_tenant_change_duration_seconds',
    help: "From a tenant's request reaching kpng to its content in the kernel",
    labelNames: tenant,
    buckets: exp(0.001, 2, 15),
    registers: [registry],
  }),
};

/** A forgotten tenant's series go. */
export function forgetTenantMetrics(name: string): void {
  for (const m of Object.values(tenantMetrics)) m.remove({ tenant: name });
}
