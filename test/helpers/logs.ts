// A logger that records what it logs, to assert on log lines.
import { pino, type Logger } from 'pino';

export interface Recorded {
  level: number;
  msg: string;
  [k: string]: unknown;
}

export function recordingLogger(): { log: Logger; records: Recorded[]; text: () => string } {
  const records: Recorded[] = [];
  const log = pino({ level: 'debug', base: undefined }, { write: (line: string) => void records.push(JSON.parse(line)) });
  return { log, records, text: () => records.map((r) => JSON.stringify(r)).join('\n') };
}
