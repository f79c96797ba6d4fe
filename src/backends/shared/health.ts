// /healthz, /livez and /metrics, as kube-proxy serves them: healthy while
// every queued update gets applied within 2 x syncPeriod; /healthz is also
// unhealthy while the Node is going away (deletionTimestamp or the cluster
// autoscaler's ToBeDeletedByClusterAutoscaler taint).
import { createServer, type Server } from 'node:http';
import type { Logger } from '../../log.js';
import { metrics, registry } from './metrics.js';
import type { SyncResult } from './runner.js';

export class ProxyHealth {
  private oldestPending = 0;
  private lastUpdated = 0;
  nodeEligible = true;

  constructor(
    readonly timeoutMs: number,
    private readonly now: () => number = Date.now,
  ) {}

  /** an update reached the backend and waits to be applied */
  queued(): void {
    const t = this.now();
    if (!this.oldestPending) this.oldestPending = t;
    metrics.lastQueued.set({ ip_family: '' }, t / 1000);
  }

  /** what a sync did: a good one applied everything queued before it */
  observe(r: SyncResult): void {
    if (!r.ok) return;
    this.lastUpdated = this.now();
    this.oldestPending = 0;
    metrics.lastSync.set({ ip_family: '' }, this.lastUpdated / 1000);
  }

  get healthy(): boolean {
    return this.oldestPending === 0 || this.now() - this.oldestPending < this.timeoutMs;
  }

  body(withNode: boolean): Record<string, unknown> {
    const iso = (t: number) => (t ? new Date(t).toISOString() : '');
    const healthy = this.healthy;
    return {
      lastUpdated: iso(this.lastUpdated),
      currentTime: iso(this.now()),
      ...(withNode ? { nodeEligible: this.nodeEligible } : {}),
      healthy: withNode ? healthy && this.nodeEligible : healthy,
    };
  }
}

/** "host:port" (IPv6 as "[addr]:port"); '' disables */
export function parseBindAddress(s: string): { host: string; port: number } | undefined {
  if (!s) return undefined;
  const m = /^(?:\[([^\]]+)\]|([^:]*)):(\d+)$/.exec(s.trim());
  if (!m) throw new Error(`bind address ${JSON.stringify(s)} is not host:port`);
  return { host: m[1] ?? (m[2] || '0.0.0.0'), port: Number(m[3]) };
}

export interface ProxyServersOptions {
  healthzBindAddress: string;
  metricsBindAddress: string;
  /** kube-proxy's --proxy-mode answer on /proxyMode */
  proxyMode: string;
  /** fail instead of logging when a port cannot be bound */
  hardFail?: boolean;
}

/** Starts the health and metrics servers; returns a closer. */
export async function startProxyServers(health: ProxyHealth, o: ProxyServersOptions, log: Logger, stats?: () => void): Promise<() => Promise<void>> {
  const servers: Server[] = [];
  const listen = async (addr: string, name: string, handler: Parameters<typeof createServer>[1]) => {
    const a = parseBindAddress(addr);
    if (!a) return;
    const server = createServer(handler!);
    try {
      await new Promise<void>((resolve, reject) => {
        server.once('error', reject);
        server.listen(a.port, a.host, () => resolve());
      });
      servers.push(server);
      log.info({ address: addr }, `${name} listening`);
    } catch (e) {
      const msg = `cannot serve ${name} on ${addr}: ${(e as Error).message}`;
      if (o.hardFail) throw new Error(msg);
      log.error(msg);
    }
  };
  await listen(o.healthzBindAddress, '/healthz', (req, res) => {
    const path = (req.url ?? '').split('?')[0];
    if (path !== '/healthz' && path !== '/livez') {
      res.statusCode = 404;
      return res.end();
    }
    const body = health.body(path === '/healthz');
    const code = body.healthy ? 200 : 503;
    (path === '/healthz' ? metrics.healthz : metrics.livez).inc({ code: String(code) });
    res.writeHead(code, { 'Content-Type': 'application/json', 'X-Content-Type-Options': 'nosniff' });
    res.end(JSON.stringify(body));
  });
  await listen(o.metricsBindAddress, '/metrics', async (req, res) => {
    const path = (req.url ?? '').split('?')[0];
    if (path === '/metrics') {
      stats?.();
      res.writeHead(200, { 'Content-Type': registry.contentType });
      return res.end(await registry.metrics());
    }
    if (path === '/proxyMode') return res.end(o.proxyMode);
    if (path === '/healthz' || path === '/livez') {
      res.writeHead(health.healthy ? 200 : 503, { 'Content-Type': 'application/json' });
      return res.end(JSON.stringify(health.body(false)));
    }
    res.statusCode = 404;
    res.end();
  });
  return async () => {
    await Promise.all(servers.map((s) => new Promise<void>((r) => s.close(() => r()))));
  };
}
