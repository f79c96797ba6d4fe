// gRPC's streaming calls, server side, on node:http2 (PROTOCOL-HTTP2 of
// grpc: length-prefixed messages in DATA frames, grpc-status in trailers).
//
// Why not grpc-js's Server: a brain writes the same small diff (a Set and a
// Sync, ~90 bytes) to thousands of nodes per change. grpc-js frames and
// writes each message on its own (a buffer, a write request, a completion
// callback and a DATA frame per message) and decodes each request through
// its interceptor chain; here a diff's messages go out as one write of one
// buffer, and requests are handed over as bytes. Only what kpng serves is
// implemented: streaming methods, identity/gzip/deflate request messages,
// keepalive pings, an idle-connection timeout. The clients (src/api/grpc/
// client.ts, the original kpng's Go client) are unchanged.
import http2 from 'node:http2';
import type net from 'node:net';
import zlib from 'node:zlib';

/** gRPC status codes used here */
export const GrpcStatus = {
  OK: 0,
  CANCELLED: 1,
  INVALID_ARGUMENT: 3,
  FAILED_PRECONDITION: 9,
  RESOURCE_EXHAUSTED: 8,
  UNIMPLEMENTED: 12,
  INTERNAL: 13,
  UNAVAILABLE: 14,
} as const;

const GRPC_CONTENT_TYPE = 'application/grpc';
const ACCEPT_ENCODING = 'identity,deflate,gzip';
/** largest request message accepted (grpc's default) */
const DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024;

/** grpc-message is percent-encoded outside printable ASCII */
function encodeMessage(s: string): string {
  return s.replace(/[^\x20-\x24\x26-\x7e]/gu, (c) => encodeURIComponent(c));
}

/** Prefixes each message with gRPC's 5 bytes (not compressed, length) and writes them as one buffer. */
export function grpcFrames(messages: readonly Uint8Array[], bytes = messages.reduce((n, m) => n + m.length + 5, 0)): Buffer {
  const out = Buffer.allocUnsafe(bytes);
  let o = 0;
  for (const m of messages) {
    out[o] = 0;
    out.writeUInt32BE(m.length, o + 1);
    out.set(m, o + 5);
    o += m.length + 5;
  }
  return out;
}

export interface ServerCallHandlers {
  /** one request message (decompressed) */
  message(bytes: Buffer): void;
  /** the client half-closed */
  end(): void;
  /** the stream is gone (ended by either side, reset or its connection lost) */
  close(): void;
}

/** One call of a streaming method. */
export class ServerCall {
  private handlers?: ServerCallHandlers;
  private pending: Buffer[] = [];
  private pendingBytes = 0;
  private headersSent = false;
  private ended = false;
  private status: { code: number; message: string } = { code: GrpcStatus.OK, message: '' };

  constructor(
    private readonly stream: http2.ServerHttp2Stream,
    readonly headers: http2.IncomingHttpHeaders,
    readonly peer: string,
    private readonly maxMessageBytes: number,
  ) {
    stream.on('data', (chunk: Buffer) => this.receive(chunk));
    stream.on('end', () => this.handlers?.end());
    stream.on('close', () => this.handlers?.close());
    stream.on('error', () => {}); // followed by 'close'
    stream.on('wantTrailers', () => stream.sendTrailers({ 'grpc-status': String(this.status.code), 'grpc-message': encodeMessage(this.status.message) }));
  }

  /** Receives the call's events; messages that came before are delivered now. */
  listen(h: ServerCallHandlers): void {
    this.handlers = h;
    this.receive(Buffer.alloc(0));
    if (this.stream.readableEnded) h.end();
    if (this.stream.closed) h.close();
  }

  /** request metadata (one value) */
  header(name: string): string | undefined {
    const v = this.headers[name];
    return Array.isArray(v) ? v[0] : v;
  }

  get isOpen(): boolean {
    return !this.ended && !this.stream.closed && !this.stream.destroyed;
  }

  /** Sends the response headers (if not yet sent): the client knows the call is served. */
  sendHeaders(): void {
    if (this.headersSent || !this.isOpen) return;
    this.headersSent = true;
    this.stream.respond({ ':status': 200, 'content-type': GRPC_CONTENT_TYPE, 'grpc-accept-encoding': ACCEPT_ENCODING }, { waitForTrailers: true });
  }

  /** Writes framed messages (grpcFrames); done is called once HTTP/2 has sent them (or the stream is gone). */
  write(frames: Buffer, done: () => void): void {
    if (!this.isOpen) return void done();
    this.sendHeaders();
    this.stream.write(frames, done);
  }

  /** Ends the call with a status (once; later calls do nothing). */
  end(code: number = GrpcStatus.OK, message = ''): void {
    if (!this.isOpen) return;
    this.ended = true;
    this.status = { code, message };
    if (this.headersSent) {
      this.stream.end(); // then 'wantTrailers'
      return;
    }
    // trailers-only response
    this.headersSent = true;
    this.stream.respond({ ':status': 200, 'content-type': GRPC_CONTENT_TYPE, 'grpc-status': String(code), 'grpc-message': encodeMessage(message) }, { endStream: true });
  }

  private receive(chunk: Buffer): void {
    if (chunk.length) {
      this.pending.push(chunk);
      this.pendingBytes += chunk.length;
    }
    if (!this.handlers) return;
    while (this.pendingBytes >= 5 && this.isOpen) {
      if (this.pending[0].length < 5) this.pending = [Buffer.concat(this.pending)];
      const length = this.pending[0].readUInt32BE(1);
      if (length > this.maxMessageBytes) return this.end(GrpcStatus.RESOURCE_EXHAUSTED, `request message of ${length} bytes, more than ${this.maxMessageBytes}`);
      // joined once the whole message is there (not at every chunk of a big one)
      if (this.pendingBytes < 5 + length) return;
      const head = this.pending.length === 1 ? this.pending[0] : Buffer.concat(this.pending);
      const compressed = head[0];
      const body = head.subarray(5, 5 + length);
      const rest = head.subarray(5 + length);
      this.pending = rest.length ? [rest] : [];
      this.pendingBytes = rest.length;
      const message = compressed ? this.decompress(body) : body;
      if (message) this.handlers.message(message);
    }
  }

  private decompress(body: Buffer): Buffer | undefined {
    const encoding = this.header('grpc-encoding') ?? 'identity';
    const options = { maxOutputLength: this.maxMessageBytes };
    try {
      if (encoding === 'gzip') return zlib.gunzipSync(body, options);
      if (encoding === 'deflate') return zlib.inflateSync(body, options);
    } catch (e) {
      this.end(GrpcStatus.INTERNAL, `cannot decompress a request message (${encoding}): ${(e as Error).message}`);
      return undefined;
    }
    this.end(GrpcStatus.UNIMPLEMENTED, `compressed request message with grpc-encoding ${encoding}`);
    return undefined;
  }
}

export interface StreamServerOptions {
  /** a ping every this long notices a peer that vanished (0: none) */
  keepaliveMs: number;
  /** ... which must answer within this */
  keepaliveTimeoutMs: number;
  /** a connection without a call for this long is closed */
  idleMs: number;
  maxMessageBytes?: number;
  /** calls at once on one connection (a node needs one or two) */
  maxCallsPerConnection?: number;
}

/** Serves streaming methods by path, on connections handed to it (injectConnection). */
export class StreamServer {
  private readonly h2: http2.Http2Server;
  private readonly sessions = new Set<http2.ServerHttp2Session>();

  constructor(
    private readonly methods: ReadonlyMap<string, (call: ServerCall) => void>,
    private readonly opts: StreamServerOptions,
  ) {
    this.h2 = http2.createServer({ settings: { maxConcurrentStreams: opts.maxCallsPerConnection ?? 100 } });
    this.h2.on('session', (s) => this.track(s));
    this.h2.on('stream', (stream, headers) => this.serve(stream, headers));
  }

  /** Serves a connection whose TLS, if any, is done (its ALPN must be h2). */
  injectConnection(socket: net.Socket): void {
    this.h2.emit('connection', socket);
  }

  /** Sends GOAWAY on every connection; those still open after graceMs are destroyed. */
  async close(graceMs: number): Promise<void> {
    const open = [...this.sessions];
    if (open.length === 0) return;
    await new Promise<void>((resolve) => {
      let left = open.length;
      const timer = setTimeout(() => (open.forEach((s) => s.destroy()), resolve()), graceMs);
      for (const s of open) {
        s.once('close', () => {
          if (--left === 0) (clearTimeout(timer), resolve());
        });
        s.close();
      }
    });
  }

  private track(session: http2.ServerHttp2Session): void {
    this.sessions.add(session);
    session.on('error', () => {}); // followed by 'close'
    let idle: NodeJS.Timeout | undefined;
    let calls = 0;
    const idleFrom = () => {
      idle = setTimeout(() => session.close(), this.opts.idleMs);
      idle.unref();
    };
    idleFrom();
    session.on('stream', (stream) => {
      calls++;
      clearTimeout(idle);
      stream.once('close', () => {
        if (--calls === 0 && !session.closed) idleFrom();
      });
    });
    let keepalive: NodeJS.Timeout | undefined;
    if (this.opts.keepaliveMs > 0) {
      keepalive = setInterval(() => {
        if (session.destroyed || session.closed) return;
        const timeout = setTimeout(() => session.destroy(), this.opts.keepaliveTimeoutMs);
        timeout.unref();
        // false: too many pings unanswered already (the timeout above still runs)
        session.ping((err) => (clearTimeout(timeout), err && session.destroy()));
      }, this.opts.keepaliveMs);
      keepalive.unref();
    }
    session.once('close', () => {
      this.sessions.delete(session);
      clearTimeout(idle);
      clearInterval(keepalive);
    });
  }

  private serve(stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders): void {
    stream.on('error', () => {});
    const contentType = String(headers['content-type'] ?? '');
    if (headers[':method'] !== 'POST' || !contentType.startsWith(GRPC_CONTENT_TYPE)) {
      stream.respond({ ':status': headers[':method'] !== 'POST' ? 405 : 415 }, { endStream: true });
      return;
    }
    const socket = stream.session?.socket;
    const peer = socket?.remoteAddress ? `${socket.remoteAddress}:${socket.remotePort}` : 'unix';
    const call = new ServerCall(stream, headers, peer, this.opts.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES);
    const method = this.methods.get(String(headers[':path']));
    if (!method) return call.end(GrpcStatus.UNIMPLEMENTED, `unknown method ${headers[':path']}`);
    method(call);
  }
}
