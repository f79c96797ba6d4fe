// TLS for the API: the server's --tls-cert/--tls-key (+ --tls-ca: client
// certificates required, i.e. mTLS), the clients' --tls-ca (+ cert/key for
// mTLS). Files are read once at start.
import { readFileSync } from 'node:fs';
import type { TlsOptions } from 'node:tls';
import type { Command } from 'commander';
import type * as grpc from '@grpc/grpc-js';
import { grpcJs } from '../../runtime/lazy.js';

export interface TLSFiles {
  cert?: string;
  key?: string;
  ca?: string;
}

export interface ClientTLS extends TLSFiles {
  /** name to verify in the server certificate (default: the host dialled; "localhost" for unix sockets) */
  serverName?: string;
}

export function tlsFromOpts(opts: Record<string, any>): TLSFiles | undefined {
  const t: TLSFiles = { cert: opts.tlsCert, key: opts.tlsKey, ca: opts.tlsCa };
  return t.cert || t.key || t.ca ? t : undefined;
}

export function clientTLSFromOpts(opts: Record<string, any>): ClientTLS | undefined {
  const t = tlsFromOpts(opts);
  if (!t && !opts.tlsServerName) return undefined;
  return { ...t, serverName: opts.tlsServerName };
}

export function addClientTLSOptions(cmd: Command): void {
  cmd
    .option('--tls-ca <file>', 'verify the API server with this CA (enables TLS)')
    .option('--tls-cert <file>', 'client certificate, for a server that requires one (mTLS)')
    .option('--tls-key <file>', 'key of --tls-cert')
    .option('--tls-server-name <name>', 'name to expect in the server certificate (default: the host in --api)');
}

const read = (f: string, what: string) => {
  try {
    return readFileSync(f);
  } catch (e) {
    throw new Error(`cannot read ${what} ${f}: ${(e as Error).message}`);
  }
};

/**
 * The server's TLS, for to-api's own TLS server (src/sinks/api/listener.ts:
 * it does the handshake itself, to see how long it takes). What grpc-js's
 * ServerCredentials.createSsl would do: with a CA, a client certificate
 * signed by it is required (mTLS); ALPN h2.
 */
export function serverTLSOptions(t: TLSFiles | undefined): TlsOptions | undefined {
  if (!t) return undefined;
  if (!t.cert || !t.key) throw new Error('TLS needs both --tls-cert and --tls-key');
  const ca = t.ca ? read(t.ca, '--tls-ca') : undefined;
  return { cert: read(t.cert, '--tls-cert'), key: read(t.key, '--tls-key'), ca, requestCert: !!ca, rejectUnauthorized: true, ALPNProtocols: ['h2'] };
}

export function channelCredentials(t: ClientTLS | undefined): grpc.ChannelCredentials {
  if (!t || (!t.ca && !t.cert && !t.key)) return grpcJs().credentials.createInsecure();
  if (!!t.cert !== !!t.key) throw new Error('a client certificate needs both --tls-cert and --tls-key');
  return grpcJs().credentials.createSsl(
    t.ca ? read(t.ca, '--tls-ca') : null,
    t.key ? read(t.key, '--tls-key') : null,
    t.cert ? read(t.cert, '--tls-cert') : null,
  );
}
