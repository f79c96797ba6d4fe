// API addresses: unix:///path/to.sock, tcp://HOST:PORT, or kpng's bare
// HOST:PORT. Shared by the server (to-api) and the clients (local, api).
import { isIPv4, isIPv6 } from 'node:net';
import { runSocket } from '../../runtime/run-dir.js';

export const DEFAULT_API = runSocket('kpng.sock');

export type ApiAddress =
  | { readonly kind: 'unix'; readonly path: string }
  | { readonly kind: 'tcp'; readonly host: string; readonly port: number };

export function parseAddress(s: string): ApiAddress {
  if (s.startsWith('unix://')) {
    const path = s.slice('unix://'.length);
    if (!path.startsWith('/')) throw new Error(`${s}: a unix socket needs an absolute path (unix:///run/kpng/kpng.sock)`);
    return { kind: 'unix', path };
  }
  if (s.startsWith('unix:')) {
    const path = s.slice('unix:'.length);
    if (!path.startsWith('/')) throw new Error(`${s}: a unix socket needs an absolute path (unix:///run/kpng/kpng.sock)`);
    return { kind: 'unix', path };
  }
  const hp = s.startsWith('tcp://') ? s.slice('tcp://'.length) : s;
  const m = /^(?:\[([^\]]+)\]|([^:[\]]*)):(\d+)$/.exec(hp);
  if (!m) throw new Error(`${s}: not an API address (unix:///path, tcp://host:port or host:port)`);
  const host = m[1] ?? m[2] ?? '';
  const port = Number(m[3]);
  if (port > 65535) throw new Error(`${s}: port out of range`);
  if (m[1] !== undefined && !isIPv6(host)) throw new Error(`${s}: [${host}] is not an IPv6 address`);
  return { kind: 'tcp', host, port };
}

export function formatAddress(a: ApiAddress): string {
  if (a.kind === 'unix') return `unix://${a.path}`;
  return `tcp://${isIPv6(a.host) ? `[${a.host}]` : a.host}:${a.port}`;
}

/** An empty host (all interfaces) or any non-loopback address or name is not loopback. */
export function isLoopback(a: ApiAddress): boolean {
  if (a.kind === 'unix') return true;
  const h = a.host.toLowerCase();
  if (h === 'localhost') return true;
  if (isIPv4(h)) return h.startsWith('127.');
  if (isIPv6(h)) return h === '::1' || h === '0:0:0:0:0:0:0:1' || /^::ffff:127\./.test(h);
  return false;
}

/** grpc-js target / bind string */
export function grpcTarget(a: ApiAddress, forBind = false): string {
  if (a.kind === 'unix') return `unix://${a.path}`;
  const host = a.host === '' ? (forBind ? '0.0.0.0' : '127.0.0.1') : a.host;
  return isIPv6(host) ? `[${host}]:${a.port}` : `${host}:${a.port}`;
}
