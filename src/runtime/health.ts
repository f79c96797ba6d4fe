// /healthz, /livez, /readyz and /metrics. /livez is kube-proxy's: healthy
// while every queued update gets applied within 2 x syncPeriod (a process
// that cannot reach its source is not stuck: restarting it would not help).
// /healthz has kube-proxy's body and meaning for load balancers: 503 while
// the node's Node is unknown or going away (deletionTimestamp, or the
// cluster autoscaler's ToBeDeletedByClusterAutoscaler taint: nodeEligible),
// and it is 200 only on a programmed node: /livez, and a first complete
// state applied by every backend (kube-proxy counts itself updated as it
// starts, which says nothing of the rules). /readyz is the same without the
// deletion part: "this node is programmed", for readiness and startup probes
// (a draining node stays ready; its liveness is /livez).
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { Logger } from './log.js';
import { ipFamily, metrics, registry } from './metrics.js';

export type HealthPath = '/healthz' | '/livez' | '/readyz';

export class ProxyHealth {
  /** per backend: since when an update waits to be applied by it (0: none waits) */
  private readonly oldestPending: number[];
  /** per backend: it applied a complete state (a sync that started after the first one was delivered) */
  private readonly programmedBy: boolean[];
  /** when the first complete state reached the backends (0: not yet) */
  private firstStateAt = 0;
  private lastUpdated = 0;
  /** the stream has this node's Node object (setNode) */
  private nodeKnown = false;
  /** the Node is being deleted */
  private nodeDeleting = false;

  constructor(
    readonly timeoutMs: number,
    /** backends that must each apply every update (several on one stream) */
    backends = 1,
    private readonly now: () => number = Date.now,
  ) {
    this.oldestPending = new Array<number>(backends).fill(0);
    this.programmedBy = new Array<boolean>(backends).fill(false);
  }

  /** an update reached the backends and waits to be applied */
  queued(): void {
    const t = this.now();
    for (let i = 0; i < this.oldestPending.length; i++) if (!this.oldestPending[i]) this.oldestPending[i] = t;
    metrics.lastQueued.set({ ip_family: ipFamily() }, t / 1000);
  }

  /** a complete state (a diff's Sync) reached the backends */
  delivered(): void {
    this.firstStateAt ||= this.now();
  }

  /** what a backend's sync did: a good one applied everything queued before it */
  observe(r: { readonly ok: boolean; readonly endedAt: number; readonly durationMs: number }, backend = 0): void {
    if (!r.ok) return;
    this.oldestPending[backend] = 0;
    if (this.firstStateAt && r.endedAt - r.durationMs >= this.firstStateAt) this.programmedBy[backend] = true;
    if (!this.applied || !this.programmed) return;
    this.lastUpdated = this.now();
    metrics.lastSync.set({ ip_family: ipFamily() }, this.lastUpdated / 1000);
  }

  /** what the stream says of this node's Node: there or not, and whether it is being deleted */
  setNode(known: boolean, deleting: boolean): void {
    this.nodeKnown = known;
    this.nodeDeleting = deleting;
  }

  /** every backend applied everything queued so far */
  get applied(): boolean {
    return this.oldestPending.every((t) => t === 0);
  }

  /** every backend applied a complete state at least once */
  get programmed(): boolean {
    return this.programmedBy.every(Boolean);
  }

  /** /livez: no update waits longer than the timeout */
  get live(): boolean {
    const t = this.now();
    return this.oldestPending.every((p) => p === 0 || t - p < this.timeoutMs);
  }

  get nodeEligible(): boolean {
    return this.nodeKnown && !this.nodeDeleting;
  }

  /** the answer of one path: healthy or not, and kube-proxy's JSON body */
  check(path: HealthPath): { healthy: boolean; body: Record<string, unknown> } {
    const iso = (t: number) => (t ? new Date(t).toISOString() : '');
    const live = this.live;
    const ready = live && this.programmed && this.nodeKnown;
    const healthy = path === '/livez' ? live : path === '/readyz' ? ready : ready && !this.nodeDeleting;
    const body = {
      lastUpdated: iso(this.lastUpdated),
      currentTime: iso(this.now()),
      ...(path === '/healthz' ? { nodeEligible: this.nodeEligible } : {}),
      healthy,
    };
    return { healthy, body };
  }
}

/** Answers check(path) with its code and body, counted in kubeproxy_proxy_{healthz,livez}_total. */
function answerHealth(health: ProxyHealth, path: HealthPath, res: ServerResponse): void {
  const { healthy, body } = health.check(path);
  const code = healthy ? 200 : 503;
  if (path !== '/readyz') (path === '/healthz' ? metrics.healthz : metrics.livez).inc({ code: String(code) });
  res.writeHead(code, { 'Content-Type': 'application/json', 'X-Content-Type-Options': 'nosniff' });
  res.end(JSON.stringify(body));
}

const HEALTH_PATHS: ReadonlySet<string> = new Set<HealthPath>(['/healthz', '/livez', '/readyz']);

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
      if (HEALTH_PATHS.has(path)) return answerHealth(health, path as HealthPath, res);
      res.statusCode = 404;
      res.end();
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
      // as kube-proxy's metrics server: the process is alive (the node's health is on healthzBindAddress)
      if (path === '/healthz' || path === '/livez') {
        const { healthy, body } = health.check('/livez');
        res.writeHead(healthy ? 200 : 503, { 'Content-Type': 'application/json' });
        res.end(JSON.stringify(body));
        return true;
      }
      return false;
    }, stats),
    log,
    o.hardFail,
  );
  return () => closeServers([healthz, metricsServer]);
}
