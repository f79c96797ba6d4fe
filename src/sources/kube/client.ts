// A minimal read-only Kubernetes API client on node:https / node:http (Node
// 20's fetch cannot take a custom CA). GET only: lists, watches, discovery.
import http from 'node:http';
import https from 'node:https';
import type { IncomingMessage } from 'node:http';
import type { Connection } from './config.js';
import type { Auth } from './credentials.js';
import { initRestClientSeries, observeRequest } from './metrics.js';

/** A non-2xx answer, or an ERROR event in a watch: code and reason from the Status. */
export class StatusError extends Error {
  constructor(
    readonly code: number,
    readonly reason: string,
    message: string,
    /** Retry-After (429, 503): wait at least this long */
    readonly retryAfterMs = 0,
  ) {
    super(message);
  }
}

/** No byte for too long: a hung server or a half-open connection. */
export class IdleTimeout extends Error {}

/** An answer (list page, Status) or a watch event longer than its bound. */
export class TooLarge extends Error {
  constructor(
    readonly what: 'answer' | 'event',
    readonly limit: number,
  ) {
    super(`the ${what === 'answer' ? 'answer' : 'watch event'} is larger than ${formatBytes(limit)}`);
  }
}

export function formatBytes(n: number): string {
  const mib = n / 2 ** 20;
  return Number.isInteger(mib) ? `${mib} MiB` : `${n} bytes`;
}

export interface RequestOptions {
  signal?: AbortSignal;
  /** abort if the response headers take longer than this */
  timeoutMs?: number;
}

export class KubeClient {
  private readonly agent: http.Agent;
  private readonly secure: boolean;

  constructor(
    readonly conn: Connection,
    private readonly userAgent = 'kpng',
  ) {
    this.secure = conn.server.protocol === 'https:';
    initRestClientSeries(conn.server.host);
    // watches each hold a socket; lists reuse idle ones
    this.agent = this.secure ? new https.Agent({ keepAlive: true }) : new http.Agent({ keepAlive: true });
  }

  close(): void {
    this.agent.destroy();
  }

  url(path: string, query: Record<string, string | undefined> = {}): URL {
    const base = this.conn.server.pathname.replace(/\/$/, '');
    const u = new URL(base + path, this.conn.server);
    for (const [k, v] of Object.entries(query)) if (v !== undefined && v !== '') u.searchParams.set(k, v);
    return u;
  }

  /**
   * GET; resolves with the response of any status once its headers arrive.
   * A 401 is retried once with fresh credentials (rotated token, re-run
   * exec plugin).
   */
  async get(path: string, query: Record<string, string | undefined>, opts: RequestOptions = {}): Promise<IncomingMessage> {
    const url = this.url(path, query);
    const auth = await this.conn.credentials.get();
    const res = await this.request(url, auth, opts);
    if (res.statusCode !== 401 || !this.conn.credentials.invalidate()) return res;
    res.resume();
    return this.request(url, await this.conn.credentials.get(), opts);
  }

  /** GET a document of at most maxBytes, as bytes; non-2xx throws StatusError. */
  async getBytes(path: string, query: Record<string, string | undefined>, opts: RequestOptions & { idleMs?: number; maxBytes: number }): Promise<Buffer> {
    const res = await this.get(path, query, opts);
    const body = await readBodyBytes(res, opts.idleMs ?? opts.timeoutMs ?? 60_000, opts.maxBytes);
    if (!res.statusCode || res.statusCode < 200 || res.statusCode > 299) throw statusError(res, body.toString('utf8'));
    return body;
  }

  /** GET a document of at most maxBytes, as text; non-2xx throws StatusError. */
  async getText(path: string, query: Record<string, string | undefined>, opts: RequestOptions & { idleMs?: number; maxBytes: number }): Promise<string> {
    return (await this.getBytes(path, query, opts)).toString('utf8');
  }

  /** GET a JSON document of at most maxBytes; non-2xx throws StatusError. */
  async getJSON(path: string, query: Record<string, string | undefined>, opts: RequestOptions & { idleMs?: number; maxBytes: number }): Promise<any> {
    const body = await this.getText(path, query, opts);
    try {
      return JSON.parse(body);
    } catch {
      throw new Error(`${path}: the answer is not JSON`);
    }
  }

  private request(url: URL, auth: Auth, opts: RequestOptions): Promise<IncomingMessage> {
    const { tls } = this.conn;
    const headers: Record<string, string> = { Accept: 'application/json', 'User-Agent': this.userAgent };
    if (auth.token) headers.Authorization = `Bearer ${auth.token}`;
    else if (auth.basic) headers.Authorization = `Basic ${auth.basic}`;
    const options: https.RequestOptions = { method: 'GET', headers, agent: this.agent, signal: opts.signal };
    if (this.secure) {
      Object.assign(options, {
        ca: tls.ca,
        cert: auth.cert ?? tls.cert,
        key: auth.key ?? tls.key,
        rejectUnauthorized: !tls.insecure,
        servername: tls.servername,
      });
    }
    const started = performance.now();
    const host = this.conn.server.host;
    let answered = false;
    return new Promise((resolve, reject) => {
      const req = (this.secure ? https : http).request(url, options, (res) => {
        clearTimeout(timer);
        answered = true;
        observeRequest(host, res.statusCode, (performance.now() - started) / 1000);
        resolve(res);
      });
      const timer = opts.timeoutMs
        ? setTimeout(() => req.destroy(new IdleTimeout(`no answer in ${opts.timeoutMs} ms`)), opts.timeoutMs)
        : undefined;
      req.on('error', (e) => {
        clearTimeout(timer);
        // (an error after the answer is the body's: the request itself was counted)
        if (!answered) observeRequest(host, undefined, (performance.now() - started) / 1000);
        reject(e);
      });
      req.end();
    });
  }
}

/** The whole body as text; fails if no byte arrives for idleMs or it grows past maxBytes. */
export async function readBody(res: IncomingMessage, idleMs: number, maxBytes: number): Promise<string> {
  return (await readBodyBytes(res, idleMs, maxBytes)).toString('utf8');
}

/** The whole body as bytes; fails as readBody does. */
export async function readBodyBytes(res: IncomingMessage, idleMs: number, maxBytes: number): Promise<Buffer> {
  const timer = setTimeout(() => res.destroy(new IdleTimeout(`no data for ${idleMs} ms`)), idleMs);
  const chunks: Buffer[] = [];
  let size = 0;
  try {
    for await (const c of res) {
      timer.refresh();
      size += (c as Buffer).length;
      if (size > maxBytes) throw new TooLarge('answer', maxBytes);
      chunks.push(c as Buffer);
    }
  } finally {
    // leaving the loop early (too large) destroys the response and its connection
    clearTimeout(timer);
  }
  return Buffer.concat(chunks, size);
}

/**
 * The lines of a watch stream (newline-delimited JSON events), without the
 * newline. A chunk is searched once: the start of a line waits in a list of
 * chunks until its newline comes, and a line longer than maxBytes throws.
 * onChunk sees every chunk (the idle watchdog).
 */
export async function* watchLines(res: AsyncIterable<Buffer>, maxBytes: number, onChunk: () => void): AsyncGenerator<Buffer> {
  let pending: Buffer[] = [];
  let pendingBytes = 0;
  for await (const chunk of res) {
    onChunk();
    let start = 0;
    for (let nl = chunk.indexOf(10); nl >= 0; nl = chunk.indexOf(10, start)) {
      if (pendingBytes + nl - start > maxBytes) throw new TooLarge('event', maxBytes);
      const line = pending.length ? Buffer.concat([...pending, chunk.subarray(start, nl)]) : chunk.subarray(start, nl);
      pending = [];
      pendingBytes = 0;
      start = nl + 1;
      yield line;
    }
    if (start < chunk.length) {
      pendingBytes += chunk.length - start;
      if (pendingBytes > maxBytes) throw new TooLarge('event', maxBytes);
      pending.push(chunk.subarray(start));
    }
  }
}

/** A non-2xx answer and its body (a Status, or whatever came) as a StatusError. */
export function statusError(res: IncomingMessage, body: string): StatusError {
  const code = res.statusCode ?? 0;
  const retryAfter = Number(res.headers['retry-after']);
  let reason = '';
  let message = body.trim().slice(0, 200);
  try {
    const st = JSON.parse(body);
    if (st && typeof st === 'object') {
      reason = String(st.reason ?? '');
      message = String(st.message ?? message);
    }
  } catch {
    // not a Status: keep the text
  }
  return new StatusError(code, reason, `HTTP ${code}${reason ? ` ${reason}` : ''}${message ? `: ${message}` : ''}`, retryAfter > 0 ? retryAfter * 1000 : 0);
}
