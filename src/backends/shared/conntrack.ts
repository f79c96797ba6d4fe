// Stale UDP conntrack entries: when an endpoint stops serving a service IP
// (or NodePort), its UDP "connections" would keep going to it until they time
// out; delete exactly those. Nothing is flushed wholesale, and nothing at
// start-up (upstream #122740: a restart must not break UDP flows).
import { spawn } from 'node:child_process';
import type { Logger } from '../../runtime/log.js';
import type { Family } from '../../api/ip.js';
import { metrics } from '../../runtime/metrics.js';
import type { ServicePort } from './service-ports.js';

export interface StaleFlow {
  readonly family: Family;
  /** service IP, or '' for a NodePort (any destination) */
  readonly vip: string;
  readonly port: number;
  /** the endpoint that went away; '' = entries that were never DNATed (reply from the service IP itself) */
  readonly endpoint: string;
}

export class ConntrackCleaner {
  deleted = 0;
  failures = 0;

  constructor(
    private readonly log: Logger,
    private readonly bin = 'conntrack',
  ) {}

  /** Deletes the entries of each flow; never throws. */
  async clean(flows: readonly StaleFlow[], concurrency = 4): Promise<void> {
    const queue = [...flows];
    const worker = async () => {
      for (let f = queue.shift(); f; f = queue.shift()) await this.cleanOne(f);
    };
    await Promise.all(Array.from({ length: Math.min(concurrency, queue.length) }, worker));
  }

  private cleanOne(f: StaleFlow): Promise<void> {
    const args = ['-D', '-f', f.family === 4 ? 'ipv4' : 'ipv6', '-p', 'udp'];
    if (f.vip) args.push('--orig-dst', f.vip);
    args.push('--orig-port-dst', String(f.port));
    args.push('--reply-src', f.endpoint || f.vip);
    return new Promise((resolve) => {
      const p = spawn(this.bin, args, { stdio: ['ignore', 'ignore', 'pipe'] });
      let err = '';
      p.stderr.on('data', (d) => (err += d));
      p.on('error', (e) => {
        this.failures++;
        this.log.warn({ err: e.message }, 'conntrack: cannot run; stale UDP entries stay until they time out');
        resolve();
      });
      p.on('close', (code) => {
        const m = /(\d+) flow entries have been deleted/.exec(err);
        if (m) {
          this.deleted += Number(m[1]);
          metrics.conntrackDeleted.inc({ ip_family: f.family === 4 ? 'IPv4' : 'IPv6' }, Number(m[1]));
        }
        // exit 1 with "0 flow entries" just means there was nothing to delete
        if (code !== 0 && !m) {
          this.failures++;
          this.log.warn({ args: args.join(' '), err: err.trim() }, 'conntrack: delete failed');
        }
        resolve();
      });
    });
  }
}

/**
 * The UDP flows each Service programs, kept as they change: what went away
 * (an endpoint no longer used for a service IP or NodePort) and which service
 * IPs got endpoints (replies the kernel answered itself before, cached as
 * "no DNAT") are the conntrack entries to delete after the sync.
 */
export class StaleFlowTracker {
  /** family|owner -> flows ("vip|port|endpoint") and service addresses with endpoints ("vip|port|") */
  private readonly byOwner = new Map<string, { flows: Set<string>; vips: Set<string> }>();

  /** An owner's flows now (after its recompute); returns the entries to delete. */
  update(family: Family, owner: string, ports: readonly ServicePort[]): StaleFlow[] {
    const id = `${family}|${owner}`;
    const before = this.byOwner.get(id);
    let now: { flows: Set<string>; vips: Set<string> } | undefined;
    for (const sp of ports) {
      if (sp.protocol !== 'udp') continue;
      now ??= { flows: new Set(), vips: new Set() };
      udpFlowsOf(sp, now.flows, now.vips);
    }
    const out: StaleFlow[] = [];
    for (const k of before?.flows ?? []) if (!now?.flows.has(k)) out.push(parseFlow(family, k));
    for (const k of now?.vips ?? []) if (!before?.vips.has(k) && !k.startsWith('|')) out.push(parseFlow(family, k));
    if (now) this.byOwner.set(id, now);
    else this.byOwner.delete(id);
    return out;
  }
}

/** "vip|port|endpoint" for every UDP flow a service port programs ('' vip: its NodePort, any node address) */
function udpFlowsOf(sp: ServicePort, flows: Set<string>, vips: Set<string>): void {
  const P = sp.port.Port;
  const add = (vip: string, port: number, targets: readonly { ip: string }[]) => {
    if (!targets.length) return;
    for (const t of targets) flows.add(`${vip}|${port}|${t.ip}`);
    vips.add(`${vip}|${port}|`);
  };
  add(sp.clusterIP, P, sp.internal);
  const external = sp.externalLocal ? [...sp.cluster, ...sp.external] : sp.cluster;
  for (const vip of new Set([...sp.externalIPs, ...sp.loadBalancerIPs])) add(vip, P, external);
  if (sp.nodePort) add('', sp.nodePort, external);
}

/** "vip|port|endpoint" ('' vip: a NodePort; '' endpoint: the service IP gained endpoints) */
function parseFlow(family: Family, k: string): StaleFlow {
  const [vip, port, endpoint] = k.split('|');
  return { family, vip, port: Number(port), endpoint };
}
