// to-api's listening sockets. grpc-js has no hook to cap connections or to
// bound the handshake: its idle timeout starts with an HTTP/2 session, which
// a TLS connection gets only after its handshake, and a plaintext connection
// that never sends the HTTP/2 preface holds its file descriptor for as long
// as the peer likes. So to-api accepts connections itself (TCP or a unix
// socket), does TLS itself (a tls.Server that never listens), and hands each
// connection to grpc-js through its public connection injector
// (Server.createConnectionInjector) with insecure credentials: TLS is done by
// then. See docs/api.md (Connections).
import net from 'node:net';
import tls from 'node:tls';
import { lookup } from 'node:dns/promises';
import { readFileSync } from 'node:fs';
import type { Logger } from '../../runtime/log.js';
import { metrics } from '../../runtime/metrics.js';
import { apiMetrics } from './metrics.js';
import { formatAddress, type ApiAddress } from '../../api/grpc/address.js';

/** the client's HTTP/2 connection preface (24 bytes) and the header of the SETTINGS frame that must follow it (9 bytes) */
const PREFACE_AND_SETTINGS_BYTES = 24 + 9;
/** file descriptors left to the rest of kpng (sources, metrics, health, logs, node itself) when the cap comes from the limit */
export const RESERVED_FDS = 256;
export const DEFAULT_MAX_CONNECTIONS = 10_000;
export const DEFAULT_HANDSHAKE_TIMEOUT_MS = 10_000;

/** The process's soft limit on open files (ulimit -n), if known. */
export function openFileLimit(): number | undefined {
  try {
    const m = /^Max open files\s+(\d+)/m.exec(readFileSync('/proc/self/limits', 'utf8'));
    return m ? Number(m[1]) : undefined; // "unlimited" does not match
  } catch {
    return undefined;
  }
}

/** 10,000 connections, or fewer if the open-file limit would leave less than RESERVED_FDS (or half of it) to the rest. */
export function defaultMaxConnections(fdLimit = openFileLimit()): number {
  if (fdLimit === undefined) return DEFAULT_MAX_CONNECTIONS;
  return Math.max(1, Math.min(DEFAULT_MAX_CONNECTIONS, Math.max(fdLimit - RESERVED_FDS, Math.floor(fdLimit / 2))));
}

/** One log line for the first occurrence, then at most one a minute, with how many happened since the last line. */
class Summary {
  private count = 0;
  private last = -Infinity;
  constructor(private readonly emit: (n: number) => void) {}
  note(): void {
    this.count++;
    const now = performance.now();
    if (now - this.last < 60_000) return;
    this.last = now;
    const n = this.count;
    this.count = 0;
    this.emit(n);
  }
}

export interface ConnectionGateOptions {
  /** open connections at most; more are closed as they come */
  maxConnections: number;
  /** the TLS handshake, then the HTTP/2 preface and SETTINGS, must each come within this */
  handshakeTimeoutMs: number;
  /** the server's TLS (serverTLSOptions); none: plaintext */
  tls?: tls.TlsOptions;
  log: Logger;
  /** hands a connection, after TLS, to grpc-js */
  serve(socket: net.Socket): void;
}

export class ConnectionGate {
  private readonly listeners: net.Server[] = [];
  /** every accepted connection (the raw socket, also under TLS) until it closes */
  private readonly sockets = new Set<net.Socket>();
  private readonly tlsServer?: tls.Server;
  private closing = false;
  private closed: Promise<void> = Promise.resolve();
  private readonly refused: Summary;
  private readonly timedOut: Summary;

  constructor(private readonly opts: ConnectionGateOptions) {
    const { log, maxConnections, handshakeTimeoutMs } = opts;
    this.refused = new Summary((n) =>
      log.warn({ maxConnections, refused: n }, `to-api: ${maxConnections} connections open (--max-connections); refused ${n} new connection${n > 1 ? 's' : ''}`),
    );
    const what = opts.tls ? 'the TLS or HTTP/2 handshake' : 'the HTTP/2 handshake';
    this.timedOut = new Summary((n) =>
      log.warn({ handshakeTimeoutMs, closed: n }, `to-api: closed ${n} connection${n > 1 ? 's' : ''} that did not complete ${what} within ${handshakeTimeoutMs} ms`),
    );
    if (opts.tls) {
      // never listens: accepted sockets are given to it
      this.tlsServer = tls.createServer({ ...opts.tls, handshakeTimeout: handshakeTimeoutMs });
      this.tlsServer.on('secureConnection', (s: tls.TLSSocket) => this.handOver(s));
      this.tlsServer.on('tlsClientError', (err: NodeJS.ErrnoException, s: tls.TLSSocket) => {
        if (err.code === 'ERR_TLS_HANDSHAKE_TIMEOUT') this.noteTimeout();
        else log.debug({ peer: peerOf(s), err: err.message }, 'to-api: TLS handshake failed');
        s.destroy();
      });
    }
  }

  /** connections open now (in handshake or served) */
  get open(): number {
    return this.sockets.size;
  }

  /** Listens on the address (a name: on each of its addresses); returns the port (0 for a unix socket). */
  async listen(a: ApiAddress): Promise<number> {
    if (a.kind === 'unix') return this.listenOn({ path: a.path });
    const hosts = a.host === '' ? ['0.0.0.0'] : net.isIP(a.host) ? [a.host] : [...new Set((await lookup(a.host, { all: true })).map((x) => x.address))];
    let port = a.port;
    let failure: Error | undefined;
    let bound = 0;
    for (const host of hosts) {
      try {
        // port 0: the others take the port the first one got
        port = await this.listenOn({ host, port });
        bound++;
      } catch (e) {
        failure ??= e as Error;
        this.opts.log.warn({ listen: formatAddress(a), address: host, err: (e as Error).message }, `to-api: cannot listen on ${host}`);
      }
    }
    if (bound === 0) throw failure;
    return port;
  }

  private listenOn(options: net.ListenOptions): Promise<number> {
    const server = net.createServer((s) => this.accept(s));
    return new Promise((resolve, reject) => {
      server.once('error', reject);
      server.listen(options, () => {
        server.off('error', reject);
        server.on('error', (e) => this.opts.log.error({ err: e.message }, 'to-api: listener failed'));
        this.listeners.push(server);
        const addr = server.address();
        resolve(typeof addr === 'object' && addr ? addr.port : 0);
      });
    });
  }

  private accept(socket: net.Socket): void {
    socket.on('error', () => {}); // followed by 'close'; the HTTP/2 session reports what matters
    if (this.closing) return void socket.destroy();
    if (this.sockets.size >= this.opts.maxConnections) {
      apiMetrics.apiConnectionsRejected.inc({ reason: 'max_connections' });
      this.refused.note();
      return void socket.destroy();
    }
    this.sockets.add(socket);
    apiMetrics.apiConnections.inc();
    socket.once('close', () => {
      this.sockets.delete(socket);
      apiMetrics.apiConnections.dec();
    });
    if (this.tlsServer) this.tlsServer.emit('connection', socket);
    else this.handOver(socket);
  }

  /** To grpc-js, with a deadline for the HTTP/2 preface and SETTINGS (counted in cleartext bytes received). */
  private handOver(socket: net.Socket): void {
    if (this.closing) return void socket.destroy();
    const timer = setTimeout(() => {
      if (socket.destroyed || socket.bytesRead >= PREFACE_AND_SETTINGS_BYTES) return;
      this.noteTimeout();
      socket.destroy();
    }, this.opts.handshakeTimeoutMs);
    timer.unref();
    socket.once('close', () => clearTimeout(timer));
    this.opts.serve(socket);
  }

  private noteTimeout(): void {
    apiMetrics.apiConnectionsRejected.inc({ reason: 'handshake_timeout' });
    this.timedOut.note();
  }

  /** Stops accepting; open connections stay (grpc-js closes its sessions). */
  stopListening(): void {
    if (this.closing) return;
    this.closing = true;
    // a listener is closed once the connections it accepted are
    this.closed = Promise.all(this.listeners.map((l) => new Promise<void>((resolve) => l.close(() => resolve())))).then(() => {});
  }

  /** Closes whatever is still open, and waits for the listeners to be closed. */
  async destroy(): Promise<void> {
    this.stopListening();
    for (const s of this.sockets) s.destroy();
    await this.closed;
  }
}

function peerOf(s: net.Socket): string | undefined {
  return s.remoteAddress ? `${s.remoteAddress}:${s.remotePort}` : undefined;
}
