// Reading outcomes in the words of the packet-flow scenarios: which endpoint
// answered (DNAT), REJECT, DROP, or "" (not translated), and whether the
// endpoint saw the client or the node (masquerade).
import { canonicalIP } from '../api/ip.js';
import { sleep } from '../runtime/backoff.js';

export { sleep };
import type { Outcome } from './agent.js';

export function hostPort(ip: string, port: number): string {
  const c = canonicalIP(ip) ?? ip;
  return c.includes(':') ? `[${c}]:${port}` : `${c}:${port}`;
}

export function splitHostPort(s: string): { ip: string; port: number } {
  const m = /^\[(.*)\]:(\d+)$/.exec(s) ?? /^([^:]*):(\d+)$/.exec(s);
  if (!m) throw new Error(`not ip:port: ${s}`);
  return { ip: canonicalIP(m[1]) ?? m[1], port: Number(m[2]) };
}

/**
 * What a connection to dst:port turned into, as the scenarios write it: the
 * endpoint "ip:port" that answered when the destination was translated, ""
 * when the answer came from the destination itself (no DNAT: the packet went
 * on as if kpng were not there), "REJECT" (ICMP port unreachable), "DROP" (no
 * answer at all). Anything else is spelled out (STALLED: the TCP handshake
 * completed but nothing answered; UNREACHABLE: no such host or nobody listens
 * on that port in the lab).
 */
export function verdict(o: Outcome, dst: string, port: number): string {
  switch (o.kind) {
    case 'answered':
      return o.local === hostPort(dst, port) ? '' : o.local;
    case 'refused':
      return 'REJECT';
    case 'timeout':
      return o.connected ? 'STALLED' : 'DROP';
    default:
      return `${o.kind.toUpperCase()}${o.code ? ` (${o.code})` : ''}`;
  }
}

/** The source address the server saw (the client's own unless masqueraded). */
export function seenSource(o: Outcome): string | undefined {
  return o.kind === 'answered' ? splitHostPort(o.remote).ip : undefined;
}

/** True when the server saw another source address than the client's own. */
export function masqueraded(o: Outcome): boolean {
  return o.kind === 'answered' && splitHostPort(o.remote).ip !== splitHostPort(o.client).ip;
}

export function describeOutcome(o: Outcome): string {
  switch (o.kind) {
    case 'answered':
      return `answered by ${o.by} at ${o.local}, which saw the client ${o.client} as ${o.remote} (${o.ms} ms)`;
    case 'timeout':
      return `${o.connected ? 'connected, then no answer' : 'no answer'} (${o.ms} ms)`;
    default:
      return `${o.kind}${o.code ? ` ${o.code}` : ''} (${o.ms} ms)`;
  }
}

/** How many times each endpoint answered, e.g. { "10.0.0.1:80": 7, ... }. */
export function spread(outcomes: Outcome[]): Map<string, number> {
  const m = new Map<string, number>();
  for (const o of outcomes) {
    const k = o.kind === 'answered' ? o.local : o.kind.toUpperCase();
    m.set(k, (m.get(k) ?? 0) + 1);
  }
  return m;
}

/** Calls fn until ok(result) or timeoutMs; returns the last result and whether it was ok. */
export async function poll<T>(fn: () => Promise<T>, ok: (t: T) => boolean, opts: { timeoutMs?: number; everyMs?: number; signal?: AbortSignal } = {}): Promise<{ value: T; ok: boolean; ms: number }> {
  const t0 = Date.now();
  let value = await fn();
  while (!ok(value) && Date.now() - t0 < (opts.timeoutMs ?? 15_000)) {
    if (!(await sleep(opts.everyMs ?? 100, opts.signal))) break;
    value = await fn();
  }
  return { value, ok: ok(value), ms: Date.now() - t0 };
}
