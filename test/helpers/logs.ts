// A logger that keeps what it logs, to assert on log lines: each line as
// written (lines) and parsed (records).
import { pino, type Logger } from 'pino';

export interface Recorded {
  level: number;
  msg: string;
  [k: string]: unknown;
}

export function recordingLogger(level = 'debug'): { log: Logger; records: Recorded[]; lines: string[]; text: () => string } {
  const records: Recorded[] = [];
  const lines: string[] = [];
  const log = pino(
    { level, base: undefined },
    {
      write: (line: string) => {
        lines.push(line);
        records.push(JSON.parse(line));
      },
    },
  );
  return { log, records, lines, text: () => records.map((r) => JSON.stringify(r)).join('\n') };
}

/** A time of kpng's text log ("HH:MM:SS.mmm", UTC) as epoch ms: the one nearest now. */
export function logTime(hhmmss: string): number {
  const [h, m, s, ms] = hhmmss.split(/[:.]/).map(Number);
  const today = new Date();
  const t = Date.UTC(today.getUTCFullYear(), today.getUTCMonth(), today.getUTCDate(), h, m, s, ms);
  const day = 86_400_000;
  return [t - day, t, t + day].reduce((a, b) => (Math.abs(b - Date.now()) < Math.abs(a - Date.now()) ? b : a));
}

/** When each sync a backend committed ended (epoch ms, in order), from kpng's text log at --log-level debug ("nft: synced", "iptables: synced", ...). */
export function syncEnds(stderr: string, backend = 'nft'): number[] {
  return [...stderr.matchAll(new RegExp(`^(\\d\\d:\\d\\d:\\d\\d\\.\\d{3}) DEBUG ${backend}: synced `, 'gm'))].map((m) => logTime(m[1]));
}
