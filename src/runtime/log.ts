// Structured logs (pino) on stderr, so stdout stays free for state dumps.
// "text" (default) is one human line per record; "json" is pino's own.
import { pino, type Logger, type Level } from 'pino';

export type { Logger };
export type LogFormat = 'text' | 'json';

const LEVEL_NAMES: Record<number, string> = { 10: 'TRACE', 20: 'DEBUG', 30: 'INFO', 40: 'WARN', 50: 'ERROR', 60: 'FATAL' };

function textStream(out: NodeJS.WritableStream) {
  return {
    write(line: string) {
      let rec: Record<string, unknown>;
      try {
        rec = JSON.parse(line);
      } catch {
        out.write(line);
        return;
      }
      const { level, time, msg, pid: _p, hostname: _h, ...rest } = rec;
      const ts = new Date(Number(time)).toISOString().slice(11, 23);
      const kv = Object.entries(rest)
        .map(([k, v]) => `${k}=${typeof v === 'string' && !/\s/.test(v) ? v : JSON.stringify(v)}`)
        .join(' ');
      out.write(`${ts} ${LEVEL_NAMES[Number(level)] ?? level} ${msg ?? ''}${kv ? ' ' + kv : ''}\n`);
    },
  };
}

export function createLogger(opts: { level?: Level; format?: LogFormat; out?: NodeJS.WritableStream } = {}): Logger {
  const out = opts.out ?? process.stderr;
  const level = opts.level ?? 'info';
  if (opts.format === 'json') return pino({ level, base: undefined }, pino.destination({ fd: 2, sync: true }));
  return pino({ level, base: undefined }, textStream(out));
}

let current: Logger = createLogger({ level: (process.env.KPNG_LOG_LEVEL as Level) || 'info' });

/** The process-wide logger; the CLI replaces it from --log-level/--log-format. */
export function log(): Logger {
  return current;
}

export function setLogger(l: Logger): void {
  current = l;
}
