// --stats: one line per second with the original kpng columns. Unlike the
// original, each API event is counted once and memory is the real RSS.
import type { Store } from '../store/store.js';

export const STATS_HEADER = 'stats:\ttime(ms)\tevents\trevisions\tusr-cpu(ms)\tsys-cpu(ms)\tcpu(%)\trss(MiB)\trevs/events(%)';

export interface StatsSample {
  timeMs: number;
  events: number;
  revisions: number;
  usrMs: number;
  sysMs: number;
  cpuPct: number;
  rssMiB: number;
  revsPerEventPct: number;
}

export function formatStats(s: StatsSample): string {
  return `stats:\t${s.timeMs}\t${s.events}\t${s.revisions}\t${s.usrMs}\t${s.sysMs}\t${s.cpuPct.toFixed(3)}\t${s.rssMiB.toFixed(2)}\t${s.revsPerEventPct.toFixed(3)}`;
}

/** Samples usage over intervals: CPU columns are per interval, counts are totals. */
export class StatsSampler {
  private readonly start = performance.now();
  private lastCpu = process.cpuUsage();
  private lastTime = performance.now();

  constructor(private readonly store: Store) {}

  sample(): StatsSample {
    const now = performance.now();
    const cpu = process.cpuUsage();
    const usr = (cpu.user - this.lastCpu.user) / 1000;
    const sys = (cpu.system - this.lastCpu.system) / 1000;
    const elapsed = now - this.lastTime;
    this.lastCpu = cpu;
    this.lastTime = now;
    const events = this.store.events;
    return {
      timeMs: Math.round(now - this.start),
      events,
      revisions: this.store.rev,
      usrMs: Math.round(usr),
      sysMs: Math.round(sys),
      cpuPct: elapsed > 0 ? ((usr + sys) * 100) / elapsed : 0,
      rssMiB: process.memoryUsage.rss() / 2 ** 20,
      revsPerEventPct: events ? (this.store.rev * 100) / events : 0,
    };
  }
}

export function startStats(store: Store, out: NodeJS.WritableStream = process.stderr, periodMs = 1000): () => void {
  const sampler = new StatsSampler(store);
  out.write(STATS_HEADER + '\n');
  const t = setInterval(() => out.write(formatStats(sampler.sample()) + '\n'), periodMs);
  t.unref();
  return () => clearInterval(t);
}
