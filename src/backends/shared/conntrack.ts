// Stale UDP conntrack entries: when an endpoint stops serving a service IP
// (or NodePort), its UDP "connections" would keep going to it until they time
// out; delete exactly those. Nothing is flushed wholesale, and nothing at
// start-up (upstream #122740: a restart must not break UDP flows).
import { spawn } from 'node:child_process';
import type { Logger } from '../../log.js';
import type { Family } from '../../api/ip.js';
import { metrics } from './metrics.js';

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
