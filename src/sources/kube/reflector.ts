// client-go's reflector for one resource: list (paginated), then watch from
// the list's resourceVersion; resume after a drop from the last version seen
// (bookmarks move it); relist and reconcile on 410 Gone; an idle watchdog;
// jittered exponential backoff on errors, each retry logged with its cause.
// It keeps only key -> resourceVersion; the store holds the converted model.
import type { Logger } from '../../runtime/log.js';
import type { Kind, StoreTx } from '../../store/store.js';
import { objectRef } from '../objects.js';
import { applyObject } from '../apply.js';
import type { ParserThread } from '../parser-thread.js';
import { formatBytes, IdleTimeout, readBody, statusError, StatusError, TooLarge, watchLines, type KubeClient } from './client.js';
import { keyOf, listItem, pageHead, PageFailed, parseListPage, type ListItem, type PageMeta, type KubeKind } from './list-item.js';

export type { KubeKind };


export interface Resource {
  kind: KubeKind;
  storeKind: Kind;
  /** plural, for logs and discovery: "services" */
  plural: string;
  /** collection path: /api/v1/services */
  path: string;
  namespaced: boolean;
  labelSelector?: string;
  fieldSelector?: string;
  /** ask discovery first: a group-version that may not serve it */
  groupVersion?: string;
  /** optional kinds (ServiceCIDRs) are skipped on 403 too: old RBAC roles lack them */
  optional?: boolean;
}

export interface ReflectorOptions {
  pageSize: number;
  /** the watch's timeoutSeconds is drawn at random in [min, max] */
  watchTimeoutSeconds: readonly [number, number];
  /** no byte (event, bookmark, list data) for this long: drop the connection */
  idleTimeoutMs: number;
  /** response headers must arrive within this */
  requestTimeoutMs: number;
  backoffMinMs: number;
  backoffMaxMs: number;
  /** a watch event (one line) longer than this drops the connection and relists */
  maxEventBytes: number;
  /** a list page (or any other answer) longer than this is a failure */
  maxListBytes: number;
  /**
   * an EndpointSlice or Service list page at least this long is parsed and
   * converted in the parser thread, beside the main thread (a slice costs
   * the main thread about ten times as much to parse, convert and encode as
   * to take in converted; a Service encoded, its decoding and copy)
   */
  pageInThreadBytes: number;
}

export const DEFAULT_REFLECTOR_OPTIONS: ReflectorOptions = {
  pageSize: 500,
  // client-go: 5 to 10 minutes, so that watches of many clients spread out
  watchTimeoutSeconds: [300, 600],
  // real API servers send a bookmark about once a minute
  idleTimeoutMs: 90_000,
  requestTimeoutMs: 60_000,
  backoffMinMs: 100,
  backoffMaxMs: 30_000,
  // an object is at most etcd's request limit (1.5 MiB by default) and the
  // API server's 3 MB request body; its JSON in an event, well below this
  maxEventBytes: 16 * 2 ** 20,
  // 500 objects of 512 KiB each; V8 cannot make a string of more than 512 MiB anyway
  maxListBytes: 256 * 2 ** 20,
  pageInThreadBytes: 64 * 1024,
};

/** A watch that ends this fast without one event counts as an error (no tight loop). */
const SHORT_WATCH_MS = 1000;

/** Exponential backoff with jitter: delay in [d/2, d], d doubling from min to max. */
export class Backoff {
  private attempt = 0;
  constructor(
    private readonly minMs: number,
    private readonly maxMs: number,
    private readonly random: () => number = Math.random,
  ) {}
  next(): number {
    const d = Math.min(this.maxMs, this.minMs * 2 ** this.attempt);
    if (d < this.maxMs) this.attempt++;
    return Math.round(d / 2 + (this.random() * d) / 2);
  }
  reset(): void {
    this.attempt = 0;
  }
}

/** Collects store writes and applies those that arrive together in one update. */
export class StoreWriter {
  private queue: ((tx: StoreTx) => void)[] = [];
  private scheduled = false;

  constructor(
    private readonly update: (fn: (tx: StoreTx) => void) => unknown,
    private readonly log: Logger,
  ) {}

  enqueue(fn: (tx: StoreTx) => void): void {
    this.queue.push(fn);
    if (!this.scheduled) {
      this.scheduled = true;
      setImmediate(() => this.flush());
    }
  }

  /** Applies everything queued now, as one update (one revision at most). */
  flush(): void {
    this.scheduled = false;
    if (!this.queue.length) return;
    const q = this.queue;
    this.queue = [];
    this.update((tx) => {
      for (const fn of q) {
        try {
          fn(tx);
        } catch (e) {
          this.log.error({ err: (e as Error).stack ?? String(e) }, 'kube source: store write failed; skipping it');
        }
      }
    });
  }
}

export class Reflector {
  /** namespace/name (or name) -> resourceVersion of every object seen: enough to reconcile a relist */
  private known = new Map<string, string>();
  /** last resourceVersion seen (list, event or bookmark) */
  resourceVersion = '';
  synced = false;
  /** false once the server said it does not serve this resource */
  served = true;
  readonly stats = { lists: 0, watches: 0, events: 0, bookmarks: 0, gone: 0, oversized: 0, errors: 0, pagesInThread: 0 };
  private readonly backoff: Backoff;
  private readonly ac = new AbortController();
  private running?: Promise<void>;
  /** an invalid object is reported once per version */
  private reported = new Map<string, string>();
  /** a list succeeded or an event arrived since the last error: the next backoff starts over */
  private progressed = false;
  /**
   * Relists forced by the watch (410 Gone, an event too large) since the
   * last event: the first relists at once, the next ones back off with
   * relistBackoff (a successful list does not reset it: only an event does)
   */
  private relistsInARow = 0;
  private readonly relistBackoff: Backoff;
  /** the relist after a 410 that was logged at debug only is logged so too (unless it changed something) */
  private quietRelist = false;

  constructor(
    private readonly client: KubeClient,
    readonly resource: Resource,
    private readonly writer: StoreWriter,
    private readonly log: Logger,
    private readonly opts: ReflectorOptions = DEFAULT_REFLECTOR_OPTIONS,
    /** where large list pages of slices are parsed (none: on the main thread) */
    private parser?: ParserThread,
  ) {
    this.backoff = new Backoff(opts.backoffMinMs, opts.backoffMaxMs);
    this.relistBackoff = new Backoff(opts.backoffMinMs, opts.backoffMaxMs);
  }

  /** objects currently known (the size of the reconciliation map) */
  get size(): number {
    return this.known.size;
  }

  start(): void {
    this.running ??= this.run().catch((e) => {
      // a bug, not a fault of the server: say so loudly, never silently stop
      this.log.fatal({ err: (e as Error).stack ?? String(e) }, `kube source: ${this.resource.plural} reflector crashed`);
      throw e;
    });
  }

  async stop(): Promise<void> {
    this.ac.abort();
    await this.running?.catch(() => {});
  }

  private get signal(): AbortSignal {
    return this.ac.signal;
  }

  private async run(): Promise<void> {
    const r = this.resource;
    let mustList = true;
    while (!this.signal.aborted) {
      let delay = 0;
      try {
        if (mustList) {
          if (!this.synced && r.groupVersion && !(await this.discover())) {
            return this.skip('info', `${r.plural} are not served by this API server (${r.groupVersion}); skipping them`);
          }
          await this.list();
          mustList = false;
        }
        const events = await this.watch();
        // a watch that lived until the server ended it: the server is fine
        this.endRelistSeries();
        this.log.debug({ resource: r.plural, resourceVersion: this.resourceVersion, events }, `kube source: ${r.plural} watch ended; resuming`);
        continue;
      } catch (e) {
        if (this.signal.aborted) return;
        this.stats.errors++;
        if (this.progressed) this.backoff.reset();
        this.progressed = false;
        const err = e as Error;
        const gone = err instanceof StatusError && err.code === 410;
        if (gone || (err instanceof TooLarge && err.what === 'event')) {
          // the version is compacted, or an event we cannot take (resuming would get it again): relist
          if (gone) this.stats.gone++;
          else this.stats.oversized++;
          mustList = true;
          // relist at once, but not in a loop if the server keeps saying 410:
          // the next ones back off, and only the 1st, 2nd, 4th, 8th... are logged
          const n = ++this.relistsInARow;
          delay = n > 1 ? this.relistBackoff.next() : 0;
          const loud = (n & (n - 1)) === 0;
          this.quietRelist = !loud;
          const cause = gone
            ? `resourceVersion ${this.resourceVersion} expired (410 Gone)${n > 1 ? ` again, ${n} times in a row without an event` : ''}; relisting`
            : `a watch event is larger than ${formatBytes(this.opts.maxEventBytes)}${n > 1 ? ` (${n} times in a row without an event)` : ''}; dropping the connection and relisting`;
          this.log[loud ? 'warn' : 'debug'](
            { resource: r.plural, resourceVersion: this.resourceVersion, retryInMs: delay, inARow: n },
            `kube source: ${r.plural}: ${cause}${delay ? ` in ${delay} ms` : ''}`,
          );
        } else if (mustList && err instanceof StatusError && (err.code === 404 || (err.code === 403 && r.optional))) {
          return this.skip(
            'warn',
            err.code === 404
              ? `${r.plural}: not found on this API server (404); skipping them`
              : `${r.plural}: forbidden (403; does the RBAC role grant list/watch on ${r.plural}?); skipping them`,
          );
        } else {
          // the server may say how long to wait (429 from priority and fairness, 503)
          const retryAfter = err instanceof StatusError ? Math.min(err.retryAfterMs, this.opts.backoffMaxMs) : 0;
          delay = Math.max(this.backoff.next(), retryAfter);
          this.log.warn(
            { resource: r.plural, resourceVersion: this.resourceVersion || undefined, retryInMs: delay, err: describe(err) },
            `kube source: ${r.plural} ${mustList ? 'list' : 'watch'} failed: ${describe(err)}; retrying in ${delay} ms`,
          );
        }
      }
      if (delay > 0) await sleep(delay, this.signal);
    }
  }

  /** The kind is not served: it is complete as it is (empty). */
  private skip(level: 'info' | 'warn', msg: string): void {
    this.served = false;
    this.synced = true;
    this.log[level]({ resource: this.resource.plural }, `kube source: ${msg}`);
    const kind = this.resource.storeKind;
    // the API went away after we had listed it: forget what it had
    const gone = [...this.known.keys()];
    this.known.clear();
    this.writer.enqueue((tx) => {
      for (const key of gone) this.deleteKey(tx, key);
      tx.setSynced(kind);
    });
  }

  private async discover(): Promise<boolean> {
    const r = this.resource;
    try {
      const doc = await this.client.getJSON(`/apis/${r.groupVersion}`, {}, {
        signal: this.signal,
        timeoutMs: this.opts.requestTimeoutMs,
        idleMs: this.opts.idleTimeoutMs,
        maxBytes: this.opts.maxListBytes,
      });
      return Array.isArray(doc?.resources) && doc.resources.some((x: { name?: unknown }) => x?.name === r.plural);
    } catch (e) {
      if (e instanceof StatusError && e.code === 404) return false;
      throw e;
    }
  }

  private query(extra: Record<string, string | undefined>): Record<string, string | undefined> {
    return { labelSelector: this.resource.labelSelector, fieldSelector: this.resource.fieldSelector, ...extra };
  }

  /**
   * Lists every page, then applies the difference to what we had in one
   * store update. The first list (nothing reaches the sinks before every
   * kind is synced) writes each page as it comes instead: held until the
   * last page, the converted objects would outlive many young collections,
   * be copied to V8's old space and die there after the store's update,
   * leaving its pages half empty (docs/design/memory-trimming.md).
   */
  private async list(): Promise<void> {
    const r = this.resource;
    const t0 = performance.now();
    const first = !this.synced;
    // a first list writes each object as it comes (known at once): what it
    // saw is what it knows, one map (two large ones would each cost their growth)
    let seen = first && this.known.size === 0 ? this.known : new Map<string, string>();
    let writes: ((tx: StoreTx) => void)[] = [];
    let changed = 0;
    let cont: string | undefined;
    let rv = '';
    let restarted = false;
    const fetchPage = (c: string | undefined) =>
      this.client.getBytes(r.path, this.query({ limit: String(this.opts.pageSize), continue: c }), {
        signal: this.signal,
        timeoutMs: this.opts.requestTimeoutMs,
        idleMs: this.opts.idleTimeoutMs,
        maxBytes: this.opts.maxListBytes,
      });
    /**
     * the next page, asked for as soon as this one's continue token is
     * known (from its first bytes, else once it is parsed): the server
     * prepares it while this one is parsed and taken
     */
    let next: Promise<Buffer> | undefined;
    /** the continue token next was asked with */
    let nextCont: string | undefined;
    const askNext = (c: string) => {
      nextCont = c;
      next = fetchPage(c);
      // (awaited in a later turn; failing before that is not unhandled)
      next.catch(() => {});
    };
    for (;;) {
      let page: PageMeta = { rv: '' };
      try {
        const bytes = await (next ?? fetchPage(cont));
        next = undefined;
        const head = pageHead(bytes);
        if (head?.cont) askNext(head.cont);
        // a first list's pages are written (and known) at once: a list that
        // fails or starts over after them compares with them and deletes
        // what it no longer finds
        await this.takePage(
          bytes,
          (meta) => {
            page = meta;
            // the page's own metadata differs from its first bytes' (a key twice): what was asked for is not wanted
            if (next && nextCont !== meta.cont) next = undefined;
            if (!next && meta.cont) askNext(meta.cont);
          },
          (items) => {
            for (const it of items) {
              const w = this.take(it, seen, first);
              if (w) writes.push(w);
            }
          },
        );
      } catch (e) {
        // this page failed (or the next one, asked for early): nothing asked for is wanted
        next = undefined;
        // the continue token expired between pages: start over, once
        if (e instanceof StatusError && e.code === 410 && cont && !restarted) {
          this.log.warn({ resource: r.plural }, `kube source: ${r.plural}: list continue token expired; listing again from the start`);
          restarted = true;
          seen = new Map();
          writes = [];
          changed = 0;
          cont = undefined;
          continue;
        }
        throw e;
      }
      changed += writes.length;
      if (first && writes.length) {
        const batch = writes;
        writes = [];
        this.writer.enqueue((tx) => {
          for (const w of batch) w(tx);
        });
      }
      rv = page.rv;
      cont = page.cont;
      if (!cont) break;
    }
    if (!rv) throw new Error(`${r.path}: the list has no resourceVersion`);
    // whatever disappeared while we were not watching
    let deleted = 0;
    for (const key of this.known.keys()) {
      if (seen.has(key)) continue;
      deleted++;
      changed++;
      writes.push((tx) => this.deleteKey(tx, key));
    }
    this.known = seen;
    this.resourceVersion = rv;
    this.synced = true;
    this.progressed = true;
    this.stats.lists++;
    const kind = r.storeKind;
    this.writer.enqueue((tx) => {
      for (const w of writes) w(tx);
      if (first) tx.setSynced(kind);
    });
    const quiet = this.quietRelist && changed === 0;
    this.quietRelist = false;
    this.log[first ? 'info' : quiet ? 'debug' : 'warn'](
      { resource: r.plural, objects: seen.size, changed, deleted, resourceVersion: rv, ms: Math.round(performance.now() - t0) },
      first ? `kube source: listed ${seen.size} ${r.plural}` : `kube source: relisted ${r.plural}: ${changed} changes (${deleted} deleted)`,
    );
    for (const k of this.reported.keys()) if (!seen.has(k)) this.reported.delete(k);
  }

  /**
   * Watches from the last resourceVersion until the server ends the watch
   * (returns the number of events) or something fails (throws).
   */
  private async watch(): Promise<number> {
    const r = this.resource;
    const [lo, hi] = this.opts.watchTimeoutSeconds;
    const started = performance.now();
    this.stats.watches++;
    const res = await this.client.get(
      r.path,
      this.query({
        watch: 'true',
        allowWatchBookmarks: 'true',
        resourceVersion: this.resourceVersion,
        timeoutSeconds: String(lo + Math.floor(Math.random() * (hi - lo + 1))),
      }),
      { signal: this.signal, timeoutMs: this.opts.requestTimeoutMs },
    );
    if (res.statusCode !== 200) throw statusError(res, await readBody(res, this.opts.idleTimeoutMs, this.opts.maxEventBytes));
    const idleMs = this.opts.idleTimeoutMs;
    const idle = setTimeout(() => res.destroy(new IdleTimeout(`no event or bookmark for ${idleMs} ms`)), idleMs);
    let events = 0;
    try {
      for await (const line of watchLines(res, this.opts.maxEventBytes, () => idle.refresh())) {
        const text = line.toString('utf8');
        if (!text.trim()) continue;
        let ev: any;
        try {
          ev = JSON.parse(text);
        } catch {
          throw new Error(`malformed watch event: ${text.slice(0, 100)}`);
        }
        this.handle(ev);
        events++;
      }
    } finally {
      clearTimeout(idle);
      res.destroy();
    }
    if (events === 0 && performance.now() - started < SHORT_WATCH_MS) throw new Error('the watch closed at once without an event');
    return events;
  }

  private handle(ev: { type?: unknown; object?: any }): void {
    const obj = ev.object;
    if (ev.type !== 'ERROR') {
      this.progressed = true;
      this.endRelistSeries();
    }
    switch (ev.type) {
      case 'ADDED':
      case 'MODIFIED': {
        this.stats.events++;
        const w = this.observe(obj, this.known);
        if (w) this.writer.enqueue(w);
        break;
      }
      case 'DELETED': {
        this.stats.events++;
        const key = keyOf(obj, this.resource.namespaced);
        if (key !== undefined && this.known.delete(key)) {
          this.reported.delete(key);
          this.writer.enqueue((tx) => this.deleteKey(tx, key));
        }
        break;
      }
      case 'BOOKMARK':
        this.stats.bookmarks++;
        break;
      case 'ERROR': {
        const code = Number(obj?.code ?? 0);
        throw new StatusError(code, String(obj?.reason ?? ''), `watch ERROR event ${code}${obj?.reason ? ` ${obj.reason}` : ''}: ${String(obj?.message ?? '')}`);
      }
      default:
        throw new Error(`unknown watch event type ${JSON.stringify(ev.type)}`);
    }
    const rv = obj?.metadata?.resourceVersion;
    if (typeof rv === 'string' && rv) this.resourceVersion = rv;
  }

  private endRelistSeries(): void {
    if (this.relistsInARow === 0) return;
    this.relistsInARow = 0;
    this.relistBackoff.reset();
  }

  /**
   * A page's text: onMeta gets its resourceVersion and continue token, then
   * onItems its items. Parsed and converted in the parser thread when it is
   * a large page of slices or Services (both come back encoded: a
   * converted Service cost more to clone than to parse), else here. A
   * parser thread that fails is not used again (the list is retried).
   */
  private async takePage(bytes: Buffer, onMeta: (meta: PageMeta) => void, onItems: (items: ListItem[]) => void): Promise<void> {
    const r = this.resource;
    try {
      if (this.parser && (r.kind === 'EndpointSlice' || r.kind === 'Service') && bytes.length >= this.opts.pageInThreadBytes) {
        try {
          // (its bytes go to the thread: not used here again)
          await this.parser.parsePage(bytes, r, onMeta, onItems);
          this.stats.pagesInThread++;
          return;
        } catch (e) {
          if (e instanceof PageFailed || this.signal.aborted) throw e;
          this.parser = undefined;
          this.log.warn({ resource: r.plural, err: (e as Error).message }, `kube source: ${r.plural}: the parser thread failed (${(e as Error).message}); parsing here from now on`);
          throw e;
        }
      }
      parseListPage(bytes.toString('utf8'), r, onMeta, onItems, Number.MAX_SAFE_INTEGER);
    } catch (e) {
      throw e instanceof PageFailed ? new Error(`${r.path}: ${e.message}`) : e;
    }
  }

  /**
   * Records one object in `into` (and in `known` too if `written`: its write
   * goes to the store now) and returns the store write it needs: none
   * when we already have this version, the converted object, a delete when a
   * known object became irrelevant (Ignored). An invalid object keeps its
   * last good version and is reported once.
   */
  private observe(obj: any, into: Map<string, string>, written = false): ((tx: StoreTx) => void) | undefined {
    return this.take(listItem(obj, this.resource), into, written);
  }

  /** observe() of an item already taken as far as it goes without this reflector's state (listItem) */
  private take(it: ListItem, into: Map<string, string>, written = false): ((tx: StoreTx) => void) | undefined {
    if (it.key === undefined) {
      this.log.error({ resource: this.resource.plural, object: it.ref, field: 'metadata.name', reason: 'missing' }, `kube source: skipping ${it.ref}: metadata.name: missing`);
      return undefined;
    }
    const { key, rv } = it;
    const prev = this.known.get(key);
    into.set(key, rv);
    if (rv && prev === rv) return undefined;
    if (written && into !== this.known) this.known.set(key, rv);
    if ('invalid' in it) {
      if (this.reported.get(key) !== rv) {
        this.reported.set(key, rv);
        const inv = it.invalid;
        this.log.error(
          { resource: this.resource.plural, object: it.ref, resourceVersion: rv, field: inv.field, reason: inv.reason },
          `kube source: skipping invalid ${it.ref}: ${inv.message}${prev !== undefined ? ' (keeping its last good version)' : ''}`,
        );
      }
      return undefined;
    }
    this.reported.delete(key);
    if ('ignored' in it) {
      this.log.debug({ resource: this.resource.plural, object: it.ref, reason: it.ignored }, 'kube source: ignoring object');
      return prev === undefined ? undefined : (tx) => this.deleteKey(tx, key);
    }
    const object = it.object;
    return (tx) => applyObject(tx, object);
  }

  private deleteKey(tx: StoreTx, key: string): void {
    const slash = key.indexOf('/');
    const ns = key.slice(0, slash);
    const name = key.slice(slash + 1);
    switch (this.resource.kind) {
      case 'Service': return tx.deleteService(ns, name);
      case 'EndpointSlice': return tx.deleteSlice(ns, name);
      case 'Node': return tx.deleteNode(key);
      case 'ServiceCIDR': return tx.deleteServiceCIDR(key);
    }
  }
}

function describe(e: Error): string {
  const code = (e as NodeJS.ErrnoException).code;
  if (e instanceof StatusError || e instanceof IdleTimeout) return e.message;
  if (code === 'ECONNRESET' && e.message === 'aborted') return 'connection dropped mid-stream';
  return code && !e.message.includes(code) ? `${e.message} (${code})` : e.message;
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const t = setTimeout(done, ms);
    signal.addEventListener('abort', done, { once: true });
    function done() {
      clearTimeout(t);
      signal.removeEventListener('abort', done);
      resolve();
    }
  });
}
