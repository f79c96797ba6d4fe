// /healthz, /livez and /metrics, as kube-proxy serves them: healthy while
// every queued update gets applied within 2 x syncPeriod; /healthz is also
// unhealthy while the Node is going away (deletionTimestamp or the cluster
// autoscaler's ToBeDeletedByClusterAutoscaler taint).
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { Logger } from './log.js';
import { metrics, registry } from './metrics.js';

export class ProxyHealth {
  /** per backend: since when an update waits to be applied by it (0: none waits) */
  private readonly oldestPending: number[];
  private lastUpdated = 0;
  nodeEligible = true;

  constructor(
    readonly timeoutMs: number,
    /** backends that must each apply every update (several on one stream) */
    backends = 1,
    private readonly now: () => number = Date.now,
  ) {
    this.oldestPending = new Array<number>(backends).fill(0);
  }

  /** an update reached the backends and waits to be applied */
  queued(): void {
    const t = this.now();
    for (let i = 0; i < this.oldestPending.length; i++) if (!this.oldestPending[i]) this.oldestPending[i] = t;
    metrics.lastQueued.set({ ip_family: '' }, t / 1000);
  }

  /** what a backend's sync did: a good one applied everything queued before it */
  observe(r: { readonly ok: boolean }, backend = 0): void {
    if (!r.ok) return;
    this.oldestPending[backend] = 0;
    if (!this.applied) return;
    this.lastUpdated = this.now();
    metrics.lastSync.set({ ip_family: '' }, this.lastUpdated / 1000);
  }

  /** every backend applied everything queued so far */
  get applied(): boolean {
    return this.oldestPending.every((t) => t === 0);
  }

  get healthy(): boolean {
    const t = this.now();
    return this.oldestPending.every((p) => p === 0 || t - p < this.timeoutMs);
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

/** An HTTP server on addr ('' : none); returns it, or undefined (logged, or thrown with hardFail) when the address cannot be bound. */
export async function listenHttp(addr: string, name: string, handler: Parameters<typeof createServer>[1], log: Logger, hardFail = false): Promise<Server | undefined> {
  const a = parseBindAddress(addr);
  if (!a) return undefined;
  const server = createServer(handler!);
  try {
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(a.port, a.host, () => resolve());
    });
    log.info({ address: addr }, `${name} listening`);
    return server;
  } catch (e) {
    const msg = `cannot serve ${name} on ${addr}: ${(e as Error).message}`;
    if (hardFail) throw new Error(msg);
    log.error(msg);
    return undefined;
  }
}

/** GET /metrics: the process's registry; anything else goes to `other` (404 without it) */
export function metricsHandler(other?: (path: string, req: IncomingMessage, res: ServerResponse) => boolean, before?: () => void) {
  return async (req: IncomingMessage, res: ServerResponse) => {
    const path = (req.url ?? '').split('?')[0];
    if (path === '/metrics') {
      before?.();
      res.writeHead(200, { 'Content-Type': registry.contentType });
      return res.end(await registry.metrics());
    }
    if (other?.(path, req, res)) return;
    res.statusCode = 404;
    res.end();
  };
}

/** closes servers */
export async function closeServers(servers: readonly (Server | undefined)[]): Promise<void> {
  await Promise.all(servers.map((s) => s && new Promise<void>((r) => s.close(() => r()))));
}

/** Starts the health and metrics servers; returns a closer. */
export async function startProxyServers(health: ProxyHealth, o: ProxyServersOptions, log: Logger, stats?: () => void): Promise<() => Promise<void>> {
  const healthz = await listenHttp(
    o.healthzBindAddress,
    '/healthz',
    (req, res) => {
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
    },
    log,
    o.hardFail,
  );
  const metricsServer = await listenHttp(
    o.metricsBindAddress,
    '/metrics',
    metricsHandler((path, _req, res) => {
      if (path === '/proxyMode') {
        res.end(o.proxyMode);
        return true;
      }
      if (path === '/healthz' || path === '/livez') {
        res.writeHead(health.healthy ? 200 : 503, { 'Content-Type': 'application/json' });
        res.end(JSON.stringify(health.body(false)));
        return true;
      }
      return false;
    }, stats),
    log,
    o.hardFail,
  );
  return () => closeServers([healthz, metricsServer]);
}
