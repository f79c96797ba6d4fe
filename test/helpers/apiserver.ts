// A test Kubernetes API server speaking the real wire protocol over TLS:
// JSON Lists with metadata.resourceVersion and continue-token pagination,
// chunked watch streams of newline-delimited {"type","object"} events
// (ADDED/MODIFIED/DELETED/BOOKMARK/ERROR), label and field selectors, bearer
// tokens and client certificates (anything else gets 401), an event history
// so a watch resumes from a resourceVersion (410 for a compacted one), and
// fault injection: dropped and closed watches, 5xx, 410 (HTTP and in-stream),
// slow answers, hung connections, answers that never end (one endless line).
// Listens on 127.0.0.1 only.
import https from 'node:https';
import { readFileSync, writeFileSync } from 'node:fs';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { TLSSocket } from 'node:tls';
import type { AddressInfo } from 'node:net';
import { fileURLToPath } from 'node:url';
import { stringify as toYAML } from 'yaml';

export const TLS_DIR = fileURLToPath(new URL('../fixtures/tls/', import.meta.url));
export const tlsFile = (name: string): string => TLS_DIR + name;

export type ResourceName = 'services' | 'endpointslices' | 'nodes' | 'servicecidrs';

interface ResourceInfo {
  name: ResourceName;
  kind: string;
  apiVersion: string;
  path: string;
  namespaced: boolean;
}

export const RESOURCES: Record<ResourceName, ResourceInfo> = {
  services: { name: 'services', kind: 'Service', apiVersion: 'v1', path: '/api/v1/services', namespaced: true },
  endpointslices: { name: 'endpointslices', kind: 'EndpointSlice', apiVersion: 'discovery.k8s.io/v1', path: '/apis/discovery.k8s.io/v1/endpointslices', namespaced: true },
  nodes: { name: 'nodes', kind: 'Node', apiVersion: 'v1', path: '/api/v1/nodes', namespaced: false },
  servicecidrs: { name: 'servicecidrs', kind: 'ServiceCIDR', apiVersion: 'networking.k8s.io/v1', path: '/apis/networking.k8s.io/v1/servicecidrs', namespaced: false },
};
const BY_KIND = new Map(Object.values(RESOURCES).map((r) => [r.kind, r]));
const BY_PATH = new Map(Object.values(RESOURCES).map((r) => [r.path, r]));

export type KubeObject = Record<string, any> & { kind?: string; metadata: Record<string, any> };

interface HistoryEvent {
  rv: number;
  resource: ResourceName;
  type: 'ADDED' | 'MODIFIED' | 'DELETED';
  key: string;
  object: KubeObject;
  prev?: KubeObject;
}

/** What a request matched against, for one-shot faults. */
export interface FaultMatch {
  resource?: ResourceName;
  /** true: watches only; false: lists only; undefined: both (and discovery) */
  watch?: boolean;
  path?: string;
  /** any other condition on the request (e.g. continue pages only) */
  when?: (r: RequestRecord) => boolean;
}

export type Fault =
  /** answer this status with a Status body */
  | { status: number; reason?: string; message?: string; retryAfterSeconds?: number }
  /** answer 200 and then an in-stream ERROR event (watches) */
  | { errorEvent: number; reason?: string }
  /** answer after this delay (then normally) */
  | { delayMs: number }
  /** accept the request and never answer (no headers) */
  | { hang: 'headers' }
  /** send 200 headers and then nothing, ever (a silent watch) */
  | { hang: 'body' }
  /** destroy the connection without an answer */
  | { drop: true }
  /** answer 200 and end at once without an event (a watch closed early) */
  | { close: true }
  /** answer 200 with this body as it is (not JSON, a list without items) */
  | { body: string }
  /**
   * answer 200 and then one line that never ends (a broken or hostile
   * server), as fast as the client reads; stops sending after maxBytes
   * (a safety valve for the test process, default 256 MiB) but keeps the
   * connection open
   */
  | { endless: true; maxBytes?: number };

export interface RequestRecord {
  path: string;
  query: Record<string, string>;
  user: string;
  status: number;
  /** body bytes sent so far (endless answers) */
  bytes?: number;
}

export interface ApiServerOptions {
  /** accepted bearer tokens (mutable later through .tokens) */
  tokens?: string[];
  /** accept client certificates signed by the test CA (default true) */
  clientCerts?: boolean;
  /** serve networking.k8s.io/v1 ServiceCIDRs (default true) */
  serveServiceCIDRs?: boolean;
  /** how a watch from a compacted resourceVersion is refused: HTTP 410, or 200 + ERROR 410 event (default) */
  expiredWatch?: 'http' | 'event';
  /** events kept for resuming watches; older resourceVersions get 410 (default 1,000,000) */
  historyLimit?: number;
  /** cap on a watch's timeoutSeconds (default: as asked) */
  maxWatchSeconds?: number;
  /** send a bookmark this often on watches that allow them (0: only on bookmark()) */
  bookmarkIntervalMs?: number;
  /** destroy each watch connection after this many events (0: never), half-way through a line */
  dropWatchEvery?: number;
}

interface Watcher {
  resource: ResourceInfo;
  match: (o: KubeObject) => boolean;
  res: ServerResponse;
  bookmarks: boolean;
  sent: number;
  timers: NodeJS.Timeout[];
}

/** a body already in JSON */
class RawJSON {
  constructor(readonly text: string) {}
}

/** an object as a typed list's item: without kind and apiVersion */
function itemText(o: KubeObject): string {
  const { kind: _k, apiVersion: _a, ...rest } = o;
  return JSON.stringify(rest);
}

export class TestApiServer {
  readonly tokens: Set<string>;
  readonly requests: RequestRecord[] = [];
  /** the current resourceVersion (etcd's: one counter for everything) */
  rv = 100;
  /** watches from a resourceVersion below this get 410 */
  compactedRV = 0;
  opts: Required<ApiServerOptions>;
  private readonly objects = new Map<ResourceName, Map<string, KubeObject>>(Object.keys(RESOURCES).map((r) => [r as ResourceName, new Map()]));
  private history: HistoryEvent[] = [];
  private readonly watchers = new Set<Watcher>();
  private readonly faults: { match: FaultMatch; fault: Fault }[] = [];
  private readonly hung = new Set<ServerResponse>();
  private readonly server: https.Server;
  private uid = 0;
  /**
   * each stored object's JSON as a list item (no kind, no apiVersion), made
   * when it is written: a list page is then a concatenation. This server
   * shares the benchmark machine's CPUs with the kpng it serves, which a
   * real API server does not; serializing 100k objects per list was its
   * largest cost there (docs/benchmarks.md).
   */
  private readonly itemJSON = new WeakMap<KubeObject, string>();
  /** what the watches were sent (events and bookmarks: their JSON lines), for benchmarks */
  readonly watchStats = { events: 0, bytes: 0 };
  url = '';

  constructor(opts: ApiServerOptions = {}) {
    this.opts = {
      tokens: [],
      clientCerts: true,
      serveServiceCIDRs: true,
      expiredWatch: 'event',
      historyLimit: 1_000_000,
      maxWatchSeconds: 0,
      bookmarkIntervalMs: 0,
      dropWatchEvery: 0,
      ...opts,
    };
    this.tokens = new Set(this.opts.tokens);
    this.server = https.createServer(
      {
        key: readFileSync(tlsFile('server.key')),
        cert: readFileSync(tlsFile('server.crt')),
        ca: readFileSync(tlsFile('ca.crt')),
        requestCert: true,
        rejectUnauthorized: false, // checked per request: no certificate means "use a token"
      },
      (req, res) => this.handle(req, res),
    );
  }

  async start(): Promise<this> {
    await new Promise<void>((resolve) => this.server.listen(0, '127.0.0.1', resolve));
    this.url = `https://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
    return this;
  }

  async close(): Promise<void> {
    for (const w of this.watchers) this.endWatch(w, true);
    for (const r of this.hung) r.destroy();
    this.hung.clear();
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  // --- objects

  static keyOf(o: KubeObject): string {
    const r = BY_KIND.get(o.kind ?? '');
    return r?.namespaced ? `${o.metadata.namespace || 'default'}/${o.metadata.name}` : o.metadata.name;
  }

  private resourceOf(kind: string): ResourceInfo {
    const r = BY_KIND.get(kind);
    if (!r) throw new Error(`test apiserver: unknown kind ${kind}`);
    return r;
  }

  /** Creates or replaces an object (a new resourceVersion each time, even if nothing changed). */
  put(obj: KubeObject): KubeObject {
    const r = this.resourceOf(obj.kind!);
    const o = structuredClone(obj);
    o.apiVersion = r.apiVersion;
    if (r.namespaced) o.metadata.namespace ||= 'default';
    const key = TestApiServer.keyOf(o);
    const prev = this.objects.get(r.name)!.get(key);
    o.metadata.uid = prev?.metadata.uid ?? `uid-${++this.uid}`;
    o.metadata.resourceVersion = String(++this.rv);
    this.objects.get(r.name)!.set(key, o);
    this.itemJSON.set(o, itemText(o));
    this.record({ rv: this.rv, resource: r.name, type: prev ? 'MODIFIED' : 'ADDED', key, object: o, prev });
    return o;
  }

  /** Changes an object in place through fn (which may change nothing: a resourceVersion bump). */
  modify(kind: string, key: string, fn: (o: KubeObject) => void = () => {}): KubeObject {
    const cur = this.get(kind, key);
    if (!cur) throw new Error(`test apiserver: no ${kind} ${key}`);
    fn(cur);
    return this.put(cur);
  }

  delete(kind: string, key: string): boolean {
    const r = this.resourceOf(kind);
    const prev = this.objects.get(r.name)!.get(key);
    if (!prev) return false;
    this.objects.get(r.name)!.delete(key);
    const o = structuredClone(prev);
    o.metadata.resourceVersion = String(++this.rv);
    this.record({ rv: this.rv, resource: r.name, type: 'DELETED', key, object: o, prev });
    return true;
  }

  get(kind: string, key: string): KubeObject | undefined {
    const o = this.objects.get(this.resourceOf(kind).name)!.get(key);
    return o && { ...structuredClone(o), kind };
  }

  /** Every object of a resource, with its kind, optionally through a label selector. */
  list(resource: ResourceName, labelSelector = '', fieldSelector = ''): KubeObject[] {
    const match = selectorMatcher(labelSelector, fieldSelector);
    const kind = RESOURCES[resource].kind;
    return [...this.objects.get(resource)!.values()].filter(match).map((o) => ({ ...structuredClone(o), kind }));
  }

  keys(resource: ResourceName): string[] {
    return [...this.objects.get(resource)!.keys()];
  }

  private record(ev: HistoryEvent) {
    this.history.push(ev);
    if (this.history.length > this.opts.historyLimit) {
      const dropped = this.history.splice(0, this.history.length - this.opts.historyLimit);
      this.compactedRV = dropped[dropped.length - 1].rv;
    }
    for (const w of this.watchers) if (w.resource.name === ev.resource) this.sendEvent(w, ev);
  }

  /**
   * Compaction as etcd does it: forgets the history, so that a watch from
   * any resourceVersion seen so far gets 410 Gone and must relist. (An
   * unrelated write moves the resourceVersion first, so a fresh list is
   * watchable.)
   */
  compact(): void {
    this.rv++;
    this.history = [];
    this.compactedRV = this.rv;
  }

  // --- faults

  /** The next matching request gets this fault (count times). */
  failNext(match: FaultMatch, fault: Fault, count = 1): void {
    for (let i = 0; i < count; i++) this.faults.push({ match, fault });
  }

  clearFaults(): void {
    this.faults.length = 0;
  }

  get watchCount(): number {
    return this.watchers.size;
  }

  /** Destroys every watch connection abruptly (half a line, then reset). */
  dropWatches(): number {
    const n = this.watchers.size;
    for (const w of this.watchers) this.endWatch(w, true);
    return n;
  }

  /** Ends every watch cleanly, as the server does at timeoutSeconds. */
  closeWatches(): number {
    const n = this.watchers.size;
    for (const w of this.watchers) this.endWatch(w, false);
    return n;
  }

  /** Sends an in-stream ERROR 410 to every watch and ends it (the watch cache lost them). */
  expireWatches(): number {
    const n = this.watchers.size;
    for (const w of this.watchers) {
      w.res.write(JSON.stringify(goneEvent()) + '\n');
      this.endWatch(w, false);
    }
    return n;
  }

  /** Sends a bookmark at the current resourceVersion to every watch that allows them. */
  bookmark(): void {
    for (const w of this.watchers) this.sendBookmark(w);
  }

  /** Releases hung requests (by destroying them). */
  releaseHung(): void {
    for (const r of this.hung) r.destroy();
    this.hung.clear();
  }

  // --- HTTP

  private takeFault(resource: ResourceInfo | undefined, watch: boolean, rec: RequestRecord): Fault | undefined {
    const i = this.faults.findIndex(
      ({ match: m }) =>
        (m.resource === undefined || m.resource === resource?.name) &&
        (m.watch === undefined || m.watch === watch) &&
        (m.path === undefined || m.path === rec.path) &&
        (m.when === undefined || m.when(rec)),
    );
    if (i < 0) return undefined;
    return this.faults.splice(i, 1)[0].fault;
  }

  private user(req: IncomingMessage): string | undefined {
    const auth = req.headers.authorization ?? '';
    if (auth.startsWith('Bearer ') && this.tokens.has(auth.slice(7))) return `token:${auth.slice(7, 12)}`;
    const sock = req.socket as TLSSocket;
    if (this.opts.clientCerts && sock.authorized) {
      const cert = sock.getPeerCertificate();
      if (cert?.subject?.CN) return `cert:${cert.subject.CN}`;
    }
    return undefined;
  }

  private async handle(req: IncomingMessage, res: ServerResponse) {
    const url = new URL(req.url ?? '/', 'https://x');
    const query = Object.fromEntries(url.searchParams);
    const rec: RequestRecord = { path: url.pathname, query, user: '', status: 0 };
    this.requests.push(rec);
    const reply = (status: number, body: unknown, headers: Record<string, string> = {}) => {
      rec.status = status;
      const text = body instanceof RawJSON ? body.text : JSON.stringify(body);
      res.writeHead(status, { 'Content-Type': 'application/json', 'Content-Length': String(Buffer.byteLength(text)), ...headers });
      res.end(text);
    };
    const user = this.user(req);
    if (!user) return reply(401, status(401, 'Unauthorized', 'Unauthorized'));
    rec.user = user;
    if (req.method !== 'GET') return reply(405, status(405, 'MethodNotAllowed', `${req.method} is not supported`));

    const resource = BY_PATH.get(url.pathname);
    const watch = query.watch === 'true' || query.watch === '1';
    const fault = this.takeFault(resource, watch, rec);
    if (fault) {
      if ('delayMs' in fault) await new Promise((r) => setTimeout(r, fault.delayMs));
      else if ('status' in fault) {
        const headers: Record<string, string> = fault.retryAfterSeconds ? { 'Retry-After': String(fault.retryAfterSeconds) } : {};
        return reply(fault.status, status(fault.status, fault.reason ?? 'InternalError', fault.message ?? `injected ${fault.status}`), headers);
      }
      else if ('drop' in fault) return void req.socket.destroy();
      else if ('hang' in fault) {
        rec.status = -1;
        this.hung.add(res);
        res.on('close', () => this.hung.delete(res));
        if (fault.hang === 'body') {
          res.writeHead(200, { 'Content-Type': 'application/json' });
          res.flushHeaders();
        }
        return;
      } else if ('close' in fault) {
        rec.status = 200;
        res.writeHead(200, { 'Content-Type': 'application/json' });
        return void res.end();
      } else if ('body' in fault) {
        rec.status = 200;
        res.writeHead(200, { 'Content-Type': 'application/json' });
        return void res.end(fault.body);
      } else if ('endless' in fault) {
        return this.endless(res, rec, fault.maxBytes ?? 256 * 2 ** 20);
      } else if ('errorEvent' in fault) {
        rec.status = 200;
        res.writeHead(200, { 'Content-Type': 'application/json' });
        res.end(JSON.stringify({ type: 'ERROR', object: status(fault.errorEvent, fault.reason ?? 'Expired', `injected ${fault.errorEvent}`) }) + '\n');
        return;
      }
    }

    if (!resource) return this.discovery(url.pathname, reply);
    if (resource.name === 'servicecidrs' && !this.opts.serveServiceCIDRs) return reply(404, status(404, 'NotFound', 'the server could not find the requested resource'));
    let match: (o: KubeObject) => boolean;
    try {
      match = selectorMatcher(query.labelSelector ?? '', query.fieldSelector ?? '');
    } catch (e) {
      return reply(400, status(400, 'BadRequest', (e as Error).message));
    }
    if (watch) return this.watch(resource, query, match, res, rec);
    return this.listPage(resource, query, match, reply);
  }

  /** 200, then an unterminated line at the client's pace (backpressure), until the client goes or maxBytes were sent. */
  private endless(res: ServerResponse, rec: RequestRecord, maxBytes: number) {
    rec.status = 200;
    rec.bytes = 0;
    this.hung.add(res);
    res.on('close', () => this.hung.delete(res));
    res.writeHead(200, { 'Content-Type': 'application/json', 'Transfer-Encoding': 'chunked' });
    const filler = Buffer.alloc(64 * 1024, 'x');
    let first: Buffer | undefined = Buffer.from('{"type":"ADDED","object":{"metadata":{"name":"');
    const pump = () => {
      while (!res.destroyed && rec.bytes! < maxBytes) {
        const chunk = first ?? filler;
        first = undefined;
        rec.bytes! += chunk.length;
        if (!res.write(chunk)) return void res.once('drain', pump);
      }
    };
    pump();
  }

  private discovery(path: string, reply: (s: number, b: unknown) => void) {
    const groups = new Map<string, ResourceInfo[]>();
    for (const r of Object.values(RESOURCES)) {
      if (r.name === 'servicecidrs' && !this.opts.serveServiceCIDRs) continue;
      const gv = r.apiVersion;
      groups.set(gv, [...(groups.get(gv) ?? []), r]);
    }
    const gv = path === '/api/v1' ? 'v1' : path.startsWith('/apis/') ? path.slice('/apis/'.length) : '';
    const list = groups.get(gv);
    if (!list) return reply(404, status(404, 'NotFound', 'the server could not find the requested resource'));
    reply(200, {
      kind: 'APIResourceList',
      apiVersion: 'v1',
      groupVersion: gv,
      resources: list.map((r) => ({ name: r.name, kind: r.kind, namespaced: r.namespaced, verbs: ['get', 'list', 'watch'] })),
    });
  }

  /** The objects of a resource as they were at resourceVersion rv (undoing later history). */
  private stateAt(resource: ResourceName, rv: number): Map<string, KubeObject> {
    const state = new Map(this.objects.get(resource)!);
    for (let i = this.history.length - 1; i >= 0 && this.history[i].rv > rv; i--) {
      const ev = this.history[i];
      if (ev.resource !== resource) continue;
      if (ev.prev) state.set(ev.key, ev.prev);
      else state.delete(ev.key);
    }
    return state;
  }

  /**
   * A list's matching keys in order, with the objects as of its
   * resourceVersion, kept for its continue pages (the last few lists): a
   * page is a binary search and a slice, as etcd's range reads are, not a
   * copy and sort of the whole resource (200 pages of 100k objects took
   * this server most of a benchmark's time).
   */
  private lists: { id: string; state: Map<string, KubeObject>; keys: string[] }[] = [];

  private listAt(r: ResourceInfo, rv: number, query: Record<string, string>, match: (o: KubeObject) => boolean) {
    const id = `${r.name}@${rv}?${query.labelSelector ?? ''}&${query.fieldSelector ?? ''}`;
    let l = this.lists.find((x) => x.id === id);
    if (!l) {
      const state = rv === this.rv ? new Map(this.objects.get(r.name)!) : this.stateAt(r.name, rv);
      l = { id, state, keys: [...state.keys()].filter((k) => match(state.get(k)!)).sort() };
      this.lists.push(l);
      if (this.lists.length > 4) this.lists.shift();
    }
    return l;
  }

  private listPage(r: ResourceInfo, query: Record<string, string>, match: (o: KubeObject) => boolean, reply: (s: number, b: unknown) => void) {
    let listRV = this.rv;
    let after: string | undefined;
    if (query.continue) {
      let tok: { rv: number; after: string };
      try {
        tok = JSON.parse(Buffer.from(query.continue, 'base64url').toString());
      } catch {
        return reply(400, status(400, 'BadRequest', 'invalid continue token'));
      }
      if (tok.rv < this.compactedRV) {
        return reply(410, status(410, 'Expired', 'The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.'));
      }
      listRV = tok.rv;
      after = tok.after;
    }
    const { state, keys: all } = this.listAt(r, listRV, query, match);
    // the first key after `after`
    let lo = 0;
    if (after !== undefined) {
      let hi = all.length;
      while (lo < hi) {
        const mid = (lo + hi) >> 1;
        if (all[mid] > after) hi = mid;
        else lo = mid + 1;
      }
    }
    const limit = Number(query.limit) > 0 ? Number(query.limit) : Infinity;
    const page = all.slice(lo, lo + Math.min(limit, all.length));
    const metadata: Record<string, unknown> = { resourceVersion: String(listRV) };
    if (all.length - lo > page.length) {
      metadata.continue = Buffer.from(JSON.stringify({ rv: listRV, after: page[page.length - 1] })).toString('base64url');
      metadata.remainingItemCount = all.length - lo - page.length;
    }
    // typed lists leave the items' kind and apiVersion out, as the API server does
    const items = page.map((k) => {
      const o = state.get(k)!;
      let text = this.itemJSON.get(o);
      if (text === undefined) this.itemJSON.set(o, (text = itemText(o)));
      return text;
    });
    const head = JSON.stringify({ kind: `${r.kind}List`, apiVersion: r.apiVersion, metadata });
    reply(200, new RawJSON(`${head.slice(0, -1)},"items":[${items.join(',')}]}`));
  }

  private watch(r: ResourceInfo, query: Record<string, string>, match: (o: KubeObject) => boolean, res: ServerResponse, rec: RequestRecord) {
    const from = query.resourceVersion ?? '';
    const fromRV = from === '' || from === '0' ? undefined : Number(from);
    if (fromRV !== undefined && (!Number.isInteger(fromRV) || fromRV < this.compactedRV)) {
      const gone = status(410, 'Expired', `too old resource version: ${from} (${this.compactedRV})`);
      if (this.opts.expiredWatch === 'http') {
        rec.status = 410;
        res.writeHead(410, { 'Content-Type': 'application/json' });
        return res.end(JSON.stringify(gone));
      }
      rec.status = 200;
      res.writeHead(200, { 'Content-Type': 'application/json' });
      return res.end(JSON.stringify({ type: 'ERROR', object: gone }) + '\n');
    }
    rec.status = 200;
    res.writeHead(200, { 'Content-Type': 'application/json', 'Transfer-Encoding': 'chunked' });
    res.flushHeaders();
    const w: Watcher = { resource: r, match, res, bookmarks: query.allowWatchBookmarks === 'true', sent: 0, timers: [] };
    this.watchers.add(w);
    res.on('close', () => this.endWatch(w, false));
    if (fromRV === undefined) {
      // no resourceVersion: the current state as ADDED events, then changes
      for (const o of this.objects.get(r.name)!.values()) if (match(o)) this.write(w, 'ADDED', o);
    } else {
      for (const ev of this.history) if (ev.rv > fromRV && ev.resource === r.name) this.sendEvent(w, ev);
    }
    if (!this.watchers.has(w)) return; // cut during the replay
    let secs = Number(query.timeoutSeconds) || 0;
    if (this.opts.maxWatchSeconds) secs = secs ? Math.min(secs, this.opts.maxWatchSeconds) : this.opts.maxWatchSeconds;
    if (secs) w.timers.push(setTimeout(() => this.endWatch(w, false), secs * 1000));
    if (w.bookmarks && this.opts.bookmarkIntervalMs) w.timers.push(setInterval(() => this.sendBookmark(w), this.opts.bookmarkIntervalMs));
  }

  /** One history event as this watcher sees it through its selectors. */
  private sendEvent(w: Watcher, ev: HistoryEvent) {
    const now = ev.type !== 'DELETED' && w.match(ev.object);
    const before = ev.prev !== undefined && w.match(ev.prev);
    if (ev.type === 'DELETED') {
      if (before) this.write(w, 'DELETED', ev.object);
    } else if (now && before) this.write(w, 'MODIFIED', ev.object);
    else if (now) this.write(w, 'ADDED', ev.object);
    else if (before) this.write(w, 'DELETED', ev.object); // no longer selected
  }

  private write(w: Watcher, type: string, o: KubeObject) {
    if (!this.watchers.has(w)) return;
    const line = JSON.stringify({ type, object: { kind: w.resource.kind, ...o } }) + '\n';
    if (this.opts.dropWatchEvery && ++w.sent > this.opts.dropWatchEvery) {
      // cut the connection half-way through an event, once what was written is on its way
      this.watchers.delete(w);
      for (const t of w.timers) clearTimeout(t);
      w.res.write(line.slice(0, line.length >> 1), () => w.res.socket?.destroy());
      return;
    }
    this.watchStats.events++;
    this.watchStats.bytes += Buffer.byteLength(line);
    w.res.write(line);
  }

  private sendBookmark(w: Watcher) {
    if (!w.bookmarks || !this.watchers.has(w)) return;
    w.res.write(JSON.stringify({ type: 'BOOKMARK', object: { kind: w.resource.kind, apiVersion: w.resource.apiVersion, metadata: { resourceVersion: String(this.rv) } } }) + '\n');
  }

  private endWatch(w: Watcher, abrupt: boolean) {
    if (!this.watchers.delete(w)) return;
    for (const t of w.timers) clearTimeout(t);
    if (abrupt) w.res.socket?.destroy();
    else w.res.end();
  }
}

function status(code: number, reason: string, message: string) {
  return { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message, reason, code };
}

function goneEvent() {
  return { type: 'ERROR', object: status(410, 'Expired', 'too old resource version') };
}

// --- selectors (the subset of labels.Parse and fields.ParseSelector clients use)

function splitTop(s: string): string[] {
  const out: string[] = [];
  let depth = 0;
  let cur = '';
  for (const ch of s) {
    if (ch === '(') depth++;
    if (ch === ')') depth--;
    if (ch === ',' && depth === 0) {
      out.push(cur);
      cur = '';
    } else cur += ch;
  }
  if (cur.trim()) out.push(cur);
  return out.map((x) => x.trim()).filter(Boolean);
}

export function labelMatcher(selector: string): (labels: Record<string, string>) => boolean {
  const reqs = splitTop(selector).map((req): ((l: Record<string, string>) => boolean) => {
    let m: RegExpMatchArray | null;
    if ((m = req.match(/^!\s*([\w./-]+)$/))) {
      const k = m[1];
      return (l) => !(k in l);
    }
    if ((m = req.match(/^([\w./-]+)\s+(in|notin)\s*\(([^)]*)\)$/))) {
      const [, k, op, list] = m;
      const vals = new Set(list.split(',').map((v) => v.trim()));
      return op === 'in' ? (l) => k in l && vals.has(l[k]) : (l) => !(k in l) || !vals.has(l[k]);
    }
    if ((m = req.match(/^([\w./-]+)\s*(!=|==|=)\s*([\w./-]*)$/))) {
      const [, k, op, v] = m;
      return op === '!=' ? (l) => l[k] !== v : (l) => l[k] === v;
    }
    if ((m = req.match(/^([\w./-]+)$/))) {
      const k = m[1];
      return (l) => k in l;
    }
    throw new Error(`unable to parse requirement: ${JSON.stringify(req)}`);
  });
  return (labels) => reqs.every((r) => r(labels));
}

export function fieldMatcher(selector: string): (o: KubeObject) => boolean {
  const reqs = splitTop(selector).map((req) => {
    const m = req.match(/^([\w.]+)\s*(!=|==|=)\s*(.*)$/);
    if (!m) throw new Error(`invalid field selector: ${JSON.stringify(req)}`);
    const [, field, op, v] = m;
    if (field !== 'metadata.name' && field !== 'metadata.namespace') throw new Error(`field label not supported: ${field}`);
    const get = (o: KubeObject) => String(field === 'metadata.name' ? o.metadata.name : o.metadata.namespace ?? '');
    return op === '!=' ? (o: KubeObject) => get(o) !== v : (o: KubeObject) => get(o) === v;
  });
  return (o) => reqs.every((r) => r(o));
}

export function selectorMatcher(labelSelector: string, fieldSelector: string): (o: KubeObject) => boolean {
  const l = labelMatcher(labelSelector);
  const f = fieldMatcher(fieldSelector);
  return (o) => l(o.metadata.labels ?? {}) && f(o);
}

// --- kubeconfig files for tests

export interface KubeconfigUser {
  token?: string;
  tokenFile?: string;
  'client-certificate'?: string;
  'client-key'?: string;
  'client-certificate-data'?: string;
  'client-key-data'?: string;
  exec?: Record<string, unknown>;
}

export interface KubeconfigSpec {
  server: string;
  /** a path, base64 data, or nothing (then insecure-skip-tls-verify decides) */
  ca?: { file: string } | { data: string };
  insecure?: boolean;
  user?: KubeconfigUser;
  context?: string;
  /** more contexts (name -> user) sharing the cluster */
  extraContexts?: Record<string, KubeconfigUser>;
}

/** Writes a kubeconfig and returns its path. */
export function writeKubeconfig(path: string, spec: KubeconfigSpec): string {
  const cluster: Record<string, unknown> = { server: spec.server };
  if (spec.ca && 'file' in spec.ca) cluster['certificate-authority'] = spec.ca.file;
  if (spec.ca && 'data' in spec.ca) cluster['certificate-authority-data'] = spec.ca.data;
  if (spec.insecure) cluster['insecure-skip-tls-verify'] = true;
  const ctx = spec.context ?? 'test';
  const users = [{ name: ctx, user: spec.user ?? {} }, ...Object.entries(spec.extraContexts ?? {}).map(([name, user]) => ({ name, user }))];
  const doc = {
    apiVersion: 'v1',
    kind: 'Config',
    'current-context': ctx,
    clusters: [{ name: 'test', cluster }],
    users,
    contexts: users.map((u) => ({ name: u.name, context: { cluster: 'test', user: u.name } })),
  };
  writeFileSync(path, toYAML(doc));
  return path;
}

/** A kubeconfig trusting the test CA with the test client certificate. */
export function certKubeconfig(path: string, server: string): string {
  return writeKubeconfig(path, { server, ca: { file: tlsFile('ca.crt') }, user: { 'client-certificate': tlsFile('client.crt'), 'client-key': tlsFile('client.key') } });
}
