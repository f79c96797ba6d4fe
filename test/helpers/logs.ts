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
