// healthCheckNodePort servers for externalTrafficPolicy: Local services, as
// kube-proxy serves them: 200 when the node has a ready local endpoint (and
// the proxy is healthy), 503 otherwise, with kube-proxy's JSON body and
// headers, so cloud load balancers send traffic only to nodes that can take it.
import { createServer, type Server } from 'node:http';
import type { Logger } from '../../runtime/log.js';

export interface HealthCheckService {
  readonly namespace: string;
  readonly name: string;
  readonly port: number;
  readonly localEndpoints: number;
}

interface Listener {
  svc: HealthCheckService;
  servers: Server[];
}

export class HealthCheckServers {
  private readonly listeners = new Map<number, Listener>();

  constructor(
    private readonly log: Logger,
    private readonly healthy: () => boolean = () => true,
    private readonly addresses: readonly string[] = ['0.0.0.0', '::'],
  ) {}

  /** The services to serve now; servers start and stop as needed. Resolves once the new servers listen (or failed to). */
  update(list: readonly HealthCheckService[]): Promise<void> {
    const started: Promise<void>[] = [];
    const want = new Map(list.filter((s) => s.port > 0).map((s) => [s.port, s]));
    for (const [port, l] of this.listeners) {
      if (want.has(port)) continue;
      for (const s of l.servers) s.close();
      this.listeners.delete(port);
    }
    for (const [port, svc] of want) {
      const l = this.listeners.get(port);
      if (l) {
        l.svc = svc;
        continue;
      }
      const listener: Listener = { svc, servers: [] };
      this.listeners.set(port, listener);
      for (const addr of this.addresses) {
        const server = createServer((_req, res) => {
          const s = listener.svc;
          const ok = s.localEndpoints > 0 && this.healthy();
          res.setHeader('Content-Type', 'application/json');
          res.setHeader('X-Content-Type-Options', 'nosniff');
          res.setHeader('X-Load-Balancing-Endpoint-Weight', String(s.localEndpoints));
          res.statusCode = ok ? 200 : 503;
          res.end(JSON.stringify({ service: { namespace: s.namespace, name: s.name }, localEndpoints: s.localEndpoints, serviceProxyHealthy: this.healthy() }));
        });
        server.on('error', (e: NodeJS.ErrnoException) => {
          // an address family missing in this network namespace is fine
          if (e.code === 'EAFNOSUPPORT' || e.code === 'EADDRNOTAVAIL') return;
          this.log.warn({ port, address: addr, err: e.message }, 'health check server failed');
        });
        started.push(
          new Promise<void>((r) => {
            server.once('listening', r);
            server.once('error', () => r());
          }),
        );
        server.listen({ port, host: addr, ipv6Only: addr.includes(':') });
        listener.servers.push(server);
      }
    }
    return Promise.all(started).then(() => {});
  }

  ports(): number[] {
    return [...this.listeners.keys()].sort((a, b) => a - b);
  }

  async close(): Promise<void> {
    const all = [...this.listeners.values()].flatMap((l) => l.servers);
    this.listeners.clear();
    await Promise.all(all.map((s) => new Promise<void>((r) => (s.listening ? s.close(() => r()) : r()))));
  }
}
