// The file source: Kubernetes objects exactly as `kubectl get -o yaml|json`
// prints them (Service, EndpointSlice, Node, ServiceCIDR, Lists, multi-
// document YAML), from a file or a directory. Changes are re-applied as a
// diff when the files change (file-system events, debounced; no polling).
// A file that does not parse keeps its last good objects; an invalid object
// keeps its last good version. Only regular files are read, never blocking
// the event loop: large ones are parsed in a worker thread (parser-thread.ts),
// and a file rewritten in place is not taken for its half-written states.
// See docs/file-source.md.
import { constants, watch, type BigIntStats, type Dirent, type FSWatcher } from 'node:fs';
import { open, readdir, stat } from 'node:fs/promises';
import { dirname, extname, join, resolve, sep } from 'node:path';
import { setImmediate as nextTurn } from 'node:timers/promises';
import { availableParallelism } from 'node:os';
import type { Logger } from '../../runtime/log.js';
import type { Store, StoreTx } from '../../store/store.js';
import { KINDS } from '../../store/store.js';
import { applyObject, deleteByKey, type ModelObject } from '../apply.js';
import { ParseFailed, parseObjects, type ParsedItem } from './parse.js';
import { ParserThread } from '../parser-thread.js';

const EXTENSIONS = new Set(['.yaml', '.yml', '.json']);
/** larger files are parsed in the worker thread (the yaml library reads about 2 MB/s) */
const INLINE_MAX = { yaml: 64 * 1024, json: 1024 * 1024 };
/** files read at once */
const READ_CONCURRENCY = 8;
const PARSER_THREADS = Math.min(2, availableParallelism());
/** files larger than this are parsed by the first thread only */
const SHARED_PARSE_MAX = 8 * 1024 * 1024;
/** store writes between two looks at the clock: a reload is one store update unless it takes longer than SLICE_MS */
const BATCH_MIN = 100;
/** main-thread work between two turns of the event loop */
const SLICE_MS = 20;
/** file times are coarse: a file changed this recently is read again even if its stat looks the same */
const SETTLED_MS = 2000;
const RETRY_MIN_MS = 1000;
const RETRY_MAX_MS = 30_000;
/** errors that say the process is short of something, not that the input is wrong: retry later */
const RESOURCE_ERRORS = new Set(['EMFILE', 'ENFILE', 'ENOMEM']);

export interface FileSourceOptions {
  input: string;
  /** quiet time after the last file event before reloading */
  debounceMs?: number;
  /** watch for changes (default true) */
  watch?: boolean;
  /**
   * how long a file rewritten in place may look unfinished (emptied, lost
   * objects, cut mid-line, does not parse) before that counts
   */
  writeGraceMs?: number;
}

interface Entry {
  /**
   * until it is in the store: the store keeps it then, and a second copy
   * here would be a third of kpng's memory (the file is read again in the
   * rare case it is needed: an object two files define, one of them gone)
   */
  object?: ModelObject;
  /** of the converted object: an unchanged object keeps its entry and is not written again */
  hash: string;
}

/** the definition of a key that counts, and its file */
interface Desired {
  entry: Entry;
  file: string;
}

interface FileState {
  /** what the file contributes: its last good objects by model key */
  objects: Map<string, Entry>;
  /** the stat of the content last read, good or not; unset: read it again */
  seen?: string;
  /** dev:ino of the last good read: a change under the same inode is an in-place write */
  inode?: string;
  /** the last good read ended with a line break (kubectl and editors end files so) */
  newline: boolean;
  /** a read held back as an unfinished in-place write: its stat, and since when it looks so */
  held?: { seen: string; since: number };
  /** the stat of content that did not parse and was logged: not held back nor logged again */
  refused?: string;
}

const errCode = (e: unknown) => (e as NodeJS.ErrnoException)?.code ?? '';
const gone = (e: unknown) => errCode(e) === 'ENOENT' || errCode(e) === 'ENOTDIR';
const isResource = (e: unknown) => RESOURCE_ERRORS.has(errCode(e));
const message = (e: unknown) => (e instanceof Error ? e.message : String(e));
const inodeOf = (st: BigIntStats) => `${st.dev}:${st.ino}`;
const fingerprint = (st: BigIntStats) => `${st.dev}:${st.ino}:${st.size}:${st.mtimeNs}:${st.ctimeNs}`;

export class FileSource {
  private readonly input: string;
  private readonly debounceMs: number;
  private readonly graceMs: number;
  private readonly watching: boolean;
  private files = new Map<string, FileState>();
  /** what is in the store from us: the hash of each object by model key */
  private readonly applied = new Map<string, string>();
  /** per directory: its watcher and the directory's dev:ino when it was set up */
  private readonly watchers = new Map<string, { w: FSWatcher; id?: string }>();
  /** per path: the last problem logged about it, so it is logged once */
  private readonly noted = new Map<string, string>();
  // while the threads parse a directory of large files, the main thread
  // mostly waits: on two cores, two threads halve a cold start's parsing.
  // Read once, the main thread is busy too (it writes each file to the store
  // as it comes): one thread less (on two cores, a third thread adds its
  // start, its memory and CPU time and parses no sooner)
  private readonly parsers: ParserThread[];
  private running?: Promise<void>;
  private queued?: Promise<void>;
  private stopped = false;
  private debounceTimer?: NodeJS.Timeout;
  private firstEventAt?: number;
  /** known files that events named since the last reload began: a reload reads just those */
  private dirty = new Set<string>();
  /** an event the dirty files do not cover (a new file, a directory, a watcher lost): the next reload lists everything */
  private dirtyAll = false;
  /** a full reload was asked for (start, retry, grace over, FileSource.reload()) */
  private fullAsked = false;
  /** JSON files read at their first event since the debounce last fired: once per file per quiet time */
  private quickTried = new Set<string>();
  private heldTimer?: NodeJS.Timeout;
  private retryTimer?: NodeJS.Timeout;
  private retryMs = RETRY_MIN_MS;
  /** errors met in the reload under way that are not the input's fault (EMFILE, ...): retry */
  private shortOf: unknown[] = [];
  private sliceStart = 0;
  /** not watching, objects are not hashed: each read object gets a number of its own instead (never equal to another read's) */
  private serial = 0;
  /** reloads completed */
  reloads = 0;
  /** files read (a reload reads the files whose stat moved, or those events named) */
  reads = 0;

  constructor(
    private readonly store: Store,
    private readonly log: Logger,
    opts: FileSourceOptions,
  ) {
    this.input = resolve(opts.input);
    this.debounceMs = opts.debounceMs ?? 100;
    this.graceMs = opts.writeGraceMs ?? 3000;
    this.watching = opts.watch !== false;
    this.parsers = Array.from({ length: this.watching ? PARSER_THREADS : Math.max(1, PARSER_THREADS - 1) }, () => new ParserThread());
  }

  /** Loads the input (and, watching, sets up the watchers), then marks the store synced. */
  async start(): Promise<void> {
    await this.reload();
    // read once: the parser threads' memory goes now, not after their idle time (a retry starts them again)
    if (!this.watching) await Promise.all(this.parsers.map((p) => p.close()));
    if (!this.stopped) this.store.update((tx) => KINDS.forEach((k) => tx.setSynced(k)));
  }

  async stop(): Promise<void> {
    this.stopped = true;
    for (const { w } of this.watchers.values()) w.close();
    this.watchers.clear();
    clearTimeout(this.debounceTimer);
    clearTimeout(this.heldTimer);
    clearTimeout(this.retryTimer);
    await Promise.all(this.parsers.map((p) => p.close()));
    await this.running;
  }

  /**
   * Re-reads what changed and applies the difference. One reload runs at a
   * time; asked for while one runs, one more runs after it (however many
   * asked). Resolves when a reload that started after the call is done.
   */
  reload(): Promise<void> {
    this.fullAsked = true;
    return this.reloadDirty();
  }

  /** a reload of what events named (everything, when they named something else) */
  private reloadDirty(tentative = false): Promise<void> {
    if (this.stopped) return Promise.resolve();
    if (!this.running) {
      this.running = this.runReload(tentative).finally(() => (this.running = undefined));
      return this.running;
    }
    this.queued ??= this.running.then(() => {
      this.queued = undefined;
      return this.reloadDirty();
    });
    return this.queued;
  }

  /**
   * A file event (path: the file it names, if any): reload once events have
   * been quiet for the debounce, or at the latest 10 debounces after the
   * first. A known JSON file is read at once as well (tentatively: JSON cut
   * short never parses, so a file that parses whole is the finished one).
   */
  private changed(path?: string) {
    if (this.stopped) return;
    if (path !== undefined && this.files.has(path)) this.dirty.add(path);
    else this.dirtyAll = true;
    const now = Date.now();
    this.firstEventAt ??= now;
    const latest = this.firstEventAt + Math.max(10 * this.debounceMs, 1000);
    clearTimeout(this.debounceTimer);
    this.debounceTimer = setTimeout(() => {
      this.firstEventAt = undefined;
      this.quickTried.clear();
      if (this.dirtyAll || this.dirty.size) void this.reloadDirty();
    }, Math.max(0, Math.min(this.debounceMs, latest - now)));
    if (path !== undefined && !this.running && !this.dirtyAll && extname(path) === '.json' && this.dirty.has(path) && !this.quickTried.has(path)) {
      this.quickTried.add(path);
      void this.reloadDirty(true);
    }
  }

  /** a watcher's event: dot files are never read (editors' temporary files) */
  private watched(dir: string, name: string | Buffer | null) {
    const file = typeof name === 'string' ? name : '';
    const path = file ? join(dir, file) : undefined;
    if (file.startsWith('.') && path !== this.input) return;
    this.changed(path);
  }

  /**
   * tentative: only the dirty files, and those that do not read cleanly
   * (do not parse, look unfinished, change while read) stay as they were,
   * still dirty, for the debounced reload to judge
   */
  private async runReload(tentative = false): Promise<void> {
    const full = this.fullAsked || this.dirtyAll || !this.files.size;
    const named = this.dirty;
    this.dirty = new Set();
    if (full) (this.fullAsked = false), (this.dirtyAll = false);
    const asked = full ? undefined : this.namedFiles(named);
    // the files events named were all read since (by a reload that listed everything)
    if (asked && !asked.size) return;
    this.shortOf = [];
    this.sliceStart = performance.now();
    try {
      const files = asked ?? (await this.list());
      if (files && !this.stopped) {
        const before = this.files;
        // the first load goes to the store file by file as they are read, in their order
        // (the store is empty: nothing to compare, and nothing waits for the last file to be parsed)
        const inOrder = !before.size && !this.applied.size;
        const read = await this.loadFiles(files, inOrder, tentative && !full);
        this.files = asked ? this.withRead(read, asked) : read;
        // a named file gone, or no longer a regular file (a directory now?): everything is listed again
        if (asked && read.size < asked.size) this.changed();
        if (!this.stopped && !inOrder) await this.apply(before);
      }
    } catch (e) {
      if (this.stopped) return;
      this.shortOf.push(e);
    }
    if (this.stopped) return;
    this.reloads++;
    if (this.shortOf.length) {
      // out of file descriptors or memory, say: what could not be read stays as it was; try again later
      this.log.error({ err: message(this.shortOf[0]), count: this.shortOf.length, retryInMs: this.retryMs }, `file source: reload incomplete (${message(this.shortOf[0])}); keeping the last good state, retrying`);
      clearTimeout(this.retryTimer);
      this.retryTimer = setTimeout(() => void this.reload(), this.retryMs);
      this.retryMs = Math.min(this.retryMs * 2, RETRY_MAX_MS);
    } else {
      this.retryMs = RETRY_MIN_MS;
    }
    this.recheckHeld();
  }

  /** A turn of the event loop now and then, so health and metrics keep answering. */
  private async breathe() {
    if (performance.now() - this.sliceStart < SLICE_MS) return;
    await nextTurn();
    this.sliceStart = performance.now();
  }

  // --- listing and watching

  /**
   * The input files, in order. Watching, each directory's watcher is set up
   * before it is listed, so nothing written after the listing goes unseen.
   * undefined: the input itself cannot be read (the last good state stays).
   */
  private async list(): Promise<Map<string, FileState | undefined> | undefined> {
    let st: BigIntStats;
    try {
      st = await stat(this.input, { bigint: true });
      this.noted.delete(this.input);
    } catch (e) {
      if (isResource(e)) throw e;
      this.note(this.input, `input not readable: ${message(e)}`, () => this.log.error({ path: this.input, err: message(e) }, 'file source: input not readable; keeping the last good state'));
      // it may appear: its directory is watched
      if (this.watching) await this.watchOnly([dirname(this.input)]);
      return undefined;
    }
    const out = new Map<string, FileState | undefined>();
    if (!st.isDirectory()) {
      if (this.watching) await this.watchOnly([dirname(this.input)]);
      out.set(this.input, this.files.get(this.input));
      return out;
    }
    const dirs = new Set<string>();
    const unlisted: string[] = [];
    const walk = async (d: string) => {
      dirs.add(d);
      if (this.watching) await this.watchDir(d);
      let ents: Dirent[];
      try {
        ents = await readdir(d, { withFileTypes: true });
        this.noted.delete(d);
      } catch (e) {
        if (gone(e)) return; // removed meanwhile: so are its files
        if (isResource(e)) throw e;
        this.note(d, message(e), () => this.log.error({ path: d, err: message(e) }, 'file source: cannot list directory; its files keep their last good objects'));
        unlisted.push(d + sep);
        return;
      }
      ents.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
      for (const ent of ents) {
        if (ent.name.startsWith('.')) continue;
        const p = join(d, ent.name);
        if (ent.isDirectory()) await walk(p);
        else if (EXTENSIONS.has(extname(ent.name))) out.set(p, this.files.get(p));
      }
      await this.breathe();
    };
    await walk(this.input);
    // a directory that could not be listed keeps its files as they were
    for (const [f, s] of this.files) if (!out.has(f) && unlisted.some((d) => f.startsWith(d))) out.set(f, s);
    // what is no longer there needs no note
    for (const p of this.noted.keys()) {
      const path = p.startsWith('watch ') ? p.slice('watch '.length) : p;
      if (path !== this.input && !out.has(path) && !dirs.has(path)) this.noted.delete(p);
    }
    if (this.watching) {
      for (const [d, { w }] of this.watchers) {
        if (dirs.has(d) || unlisted.some((u) => d.startsWith(u))) continue;
        w.close();
        this.watchers.delete(d);
      }
    }
    return out;
  }

  /** the named files, as listed, where they still are known (a reload that listed everything since may have dropped one) */
  private namedFiles(named: Set<string>): Map<string, FileState | undefined> {
    const out = new Map<string, FileState | undefined>();
    for (const f of named) if (this.files.has(f)) out.set(f, this.files.get(f));
    return out;
  }

  /** the files' states with those read replaced, in their order (which file wins a key depends on it); a file gone is dropped */
  private withRead(read: Map<string, FileState>, asked: Map<string, FileState | undefined>): Map<string, FileState> {
    const out = new Map<string, FileState>();
    for (const [f, st] of this.files) {
      if (!asked.has(f)) out.set(f, st);
      else if (read.has(f)) out.set(f, read.get(f)!);
    }
    return out;
  }

  private async watchOnly(dirs: string[]) {
    for (const [d, { w }] of this.watchers) if (!dirs.includes(d)) (w.close(), this.watchers.delete(d));
    for (const d of dirs) await this.watchDir(d);
  }

  /**
   * One plain (non-recursive) watch per directory: Node 20's recursive watch
   * on Linux loses a file once it is replaced by rename, which is how editors
   * and config tools save. A directory replaced by another of the same name
   * gets a new watch.
   */
  private async watchDir(d: string) {
    let id: string | undefined;
    try {
      id = inodeOf(await stat(d, { bigint: true }));
    } catch (e) {
      if (isResource(e)) throw e;
      return; // gone: the listing finds out
    }
    const have = this.watchers.get(d);
    if (have && have.id === id) return;
    have?.w.close();
    this.watchers.delete(d);
    try {
      const w = watch(d, (_event, name) => this.watched(d, name));
      w.on('error', () => {
        w.close();
        if (this.watchers.get(d)?.w === w) this.watchers.delete(d);
        this.changed();
      });
      this.watchers.set(d, { w, id });
      this.noted.delete(`watch ${d}`);
    } catch (e) {
      if (isResource(e)) throw e;
      this.note(`watch ${d}`, message(e), () => this.log.error({ err: message(e), path: d }, 'file source: cannot watch; changes there are not seen'));
    }
  }

  // --- reading

  /**
   * The files' new states. inOrder (a first load into an empty store): each
   * file's objects are written to the store as soon as it
   * and every file before it are read, and let go at once, while later
   * files are still being read and parsed.
   */
  private async loadFiles(files: Map<string, FileState | undefined>, inOrder = false, tentative = false): Promise<Map<string, FileState>> {
    const list = [...files];
    const results: (FileState | undefined)[] = new Array(list.length);
    const done = new Uint8Array(list.length);
    let applied = 0;
    // one writer at a time, the files in order; a failure ends the writing
    // and is the reload's (caught here: the readers go on meanwhile)
    let applying = Promise.resolve();
    let applyFailed: { e: unknown } | undefined;
    const applyReady = () => {
      applying = applying
        .then(async () => {
          for (; applied < list.length && done[applied] && !this.stopped && !applyFailed; applied++) {
            const st = results[applied];
            if (st?.objects.size) await this.applyFile(list[applied][0], st);
          }
        })
        .catch((e: unknown) => void (applyFailed ??= { e }));
    };
    // In order, the files for the parser threads have readers of their own,
    // so that the threads start on them at once while this thread parses the
    // small ones and writes what comes in order (in name order alone, the
    // threads waited for this one to go through the small files before).
    const queues = inOrder ? await this.readQueues(list.map(([f]) => f)) : [list.map((_, i) => i)];
    const taken = queues.map(() => 0);
    /** the next file of queue q, or of the other one once q is done */
    const take = (q: number): number | undefined => {
      for (const k of [q, 1 - q]) if (k < queues.length && taken[k] < queues[k].length) return queues[k][taken[k]++];
      return undefined;
    };
    const reader = async (q: number) => {
      for (let i = take(q); i !== undefined && !this.stopped; i = take(q)) {
        const [file, prev] = list[i];
        try {
          results[i] = await this.loadFile(file, prev, tentative);
        } catch (e) {
          if (this.stopped) return;
          // not the file's fault (the parser thread could not start, died): as it was, and retry
          this.shortOf.push(e);
          results[i] = prev && { ...prev, seen: undefined };
        }
        done[i] = 1;
        if (inOrder && !this.stopped) applyReady();
        await this.breathe();
      }
    };
    // two readers keep a thread busy: one file parsing, one waiting
    const threadReaders = queues.length > 1 ? 2 * this.parsers.length : 0;
    await Promise.all(Array.from({ length: Math.min(READ_CONCURRENCY, list.length) }, (_, r) => reader(r < threadReaders ? 1 : 0)));
    await applying;
    if (applyFailed) throw applyFailed.e;
    const out = new Map<string, FileState>();
    list.forEach(([f], i) => results[i] && out.set(f, results[i]!));
    return out;
  }

  /** A file's new state; undefined once it is no longer a file. Tentative: one that does not read cleanly stays as it was, dirty. */
  private async loadFile(file: string, prev: FileState | undefined, tentative = false): Promise<FileState | undefined> {
    let st: BigIntStats;
    try {
      st = await stat(file, { bigint: true });
    } catch (e) {
      return gone(e) ? undefined : this.unreadable(file, prev, e);
    }
    if (!st.isFile()) return this.notRegular(file);
    if (prev && !prev.held && prev.seen === fingerprint(st)) return prev;

    const readAt = Date.now();
    this.reads++;
    let data: Buffer;
    try {
      const r = await readRegular(file);
      if (r === 'not regular') return this.notRegular(file);
      if (r === 'changing') {
        // written while it was read: again once the writer is quiet
        this.changed(file);
        return prev ?? { objects: new Map(), newline: false };
      }
      ({ data, st } = r);
    } catch (e) {
      return gone(e) ? undefined : this.unreadable(file, prev, e);
    }
    this.noted.delete(file);
    const seen = fingerprint(st);
    const json = extname(file) === '.json';
    const newline = data.length > 0 && data[data.length - 1] === 0x0a;

    let items: ParsedItem[] | undefined;
    let error: string | undefined;
    try {
      items = await this.parse(data, json);
    } catch (e) {
      // the content, or a file too big for the worker's memory: that file is refused;
      // the worker failing otherwise: the reload keeps the file as it was and is retried
      if (this.stopped || !(e instanceof ParseFailed || errCode(e) === 'ERR_WORKER_OUT_OF_MEMORY')) throw e;
      error = message(e);
    }
    // `kubectl get -o yaml > file` truncates, then writes: until it is done
    // the file looks emptied, cut short, or broken. Rewritten in place and
    // looking so, it keeps its objects until it has stayed so for the grace.
    const unfinished = !!prev && prev.objects.size > 0 && prev.inode === inodeOf(st) && (error !== undefined || (prev.newline && !newline) || lostObjects(prev.objects, items!));
    if (tentative && prev && (error !== undefined || prev.held || unfinished)) {
      // the debounced reload judges it, as any file event's
      this.changed(file);
      return prev;
    }
    if (prev && unfinished && prev.refused !== seen) {
      const since = prev.held?.seen === seen ? prev.held.since : Date.now();
      if (Date.now() - since < this.graceMs) {
        if (!prev.held) this.log.debug({ file, graceMs: this.graceMs }, 'file source: file rewritten in place looks unfinished; keeping its objects until it is done or the grace is over');
        return { ...prev, held: { seen, since } };
      }
    }
    // a stat taken so soon after the change may not tell the next change
    const settled = readAt - Number(st.mtimeMs) > SETTLED_MS && readAt - Number(st.ctimeMs) > SETTLED_MS ? seen : undefined;
    if (error !== undefined) {
      if (prev?.refused !== seen) this.log.error({ file, err: error }, prev ? 'file source: cannot parse file; keeping its last good objects' : 'file source: cannot parse file; skipping it');
      return { objects: prev?.objects ?? new Map(), seen: settled, refused: seen, inode: prev?.inode, newline: prev?.newline ?? false };
    }
    return { objects: this.merge(file, items!, prev), seen: settled, inode: inodeOf(st), newline };
  }

  /** The indexes of files in order: [parsed here, parsed by a thread] by their size now (one that cannot be stat'ed: here, reading it says why). */
  private async readQueues(files: string[]): Promise<[number[], number[]]> {
    const sizes = await Promise.all(files.map((f) => stat(f).then((st) => st.size, () => 0)));
    const here: number[] = [];
    const thread: number[] = [];
    files.forEach((f, i) => (this.inline(sizes[i], extname(f) === '.json') ? here : thread).push(i));
    return [here, thread];
  }

  /** a file of this size is parsed here, not by a thread */
  private inline(size: number, json: boolean): boolean {
    return size <= (json ? INLINE_MAX.json : INLINE_MAX.yaml);
  }

  private parse(data: Buffer, json: boolean): Promise<ParsedItem[]> | ParsedItem[] {
    const items: ParsedItem[] = [];
    const take = (chunk: ParsedItem[]) => {
      for (const it of chunk) items.push(it);
    };
    // hashes tell an unchanged object at the next read: not watching, there is none
    const hash = this.watching;
    if (this.inline(data.length, json)) {
      parseObjects(data.toString('utf8'), json, take, undefined, hash);
      return items;
    }
    // a large file's parse takes ~60 times its size in memory: those go to one thread, one at a time
    const parser = data.length > SHARED_PARSE_MAX ? this.parsers[0] : this.parsers.reduce((a, b) => (b.pending < a.pending ? b : a));
    // (its buffer goes to the worker)
    return parser.parse(data, json, take, hash).then(() => items);
  }

  /** the file's objects from a good read; invalid ones keep their last good version */
  private merge(file: string, items: ParsedItem[], prev: FileState | undefined): Map<string, Entry> {
    const out = new Map<string, Entry>();
    for (const it of items) {
      if ('ignored' in it) {
        this.log.debug({ file, object: it.ref, reason: it.ignored }, 'file source: ignoring object');
        continue;
      }
      const last = prev?.objects.get(it.key);
      if ('field' in it) {
        this.log.error({ file, object: it.ref, field: it.field, reason: it.reason }, `file source: skipping invalid ${it.ref}: ${it.message}${last ? ' (keeping its last good version)' : ''}`);
        if (last) out.set(it.key, last);
        continue;
      }
      if (out.has(it.key)) this.log.warn({ file, object: it.key }, 'file source: object defined twice in this file; the later one wins');
      // the last entry may have let its object go: kept only while the store has it
      out.set(it.key, last && last.hash === it.hash && (last.object || this.applied.get(it.key) === it.hash) ? last : { object: it.object, hash: it.hash || `#${++this.serial}` });
    }
    return out;
  }

  private unreadable(file: string, prev: FileState | undefined, e: unknown): FileState {
    if (isResource(e)) this.shortOf.push(e);
    else this.note(file, message(e), () => this.log.error({ file, err: message(e) }, 'file source: cannot read file; keeping its last good objects'));
    return prev ? { ...prev, seen: undefined } : { objects: new Map(), newline: false };
  }

  private notRegular(file: string): undefined {
    this.note(file, 'not a regular file', () => this.log.warn({ file }, 'file source: not a regular file; skipping it'));
    return undefined;
  }

  private note(path: string, what: string, log: () => void) {
    if (this.noted.get(path) === what) return;
    this.noted.set(path, what);
    log();
  }

  // --- applying

  /**
   * Writes to the store what differs between the files' objects and what it
   * has from us: one update, or several with turns of the event loop between
   * when it takes long. Only the keys of the files that changed since
   * `before` are looked at when that is less work than all of them: one
   * changed slice file is then work for its objects, not for the cluster.
   */
  private async apply(before: Map<string, FileState>): Promise<void> {
    const keys = this.changedKeys(before);
    const desired = keys ? this.desiredOf(keys) : await this.allDesired();
    const writes: [string, Entry | undefined][] = [];
    if (keys) {
      for (const k of keys) if (!desired.has(k) && this.applied.has(k)) writes.push([k, undefined]);
    } else {
      for (const k of this.applied.keys()) if (!desired.has(k)) writes.push([k, undefined]);
    }
    const reread = new Set<string>();
    for (const [k, { entry, file }] of desired) {
      if (this.applied.get(k) === entry.hash) continue;
      if (entry.object) writes.push([k, entry]);
      else {
        // its object was let go once applied, and another file's version replaced it since
        this.files.get(file)!.seen = undefined;
        reread.add(file);
      }
    }
    for (const file of reread) this.changed(file);
    await this.updateInTurns(writes, (tx, [k, entry]) => {
      if (entry) {
        applyObject(tx, entry.object!);
        this.applied.set(k, entry.hash);
        entry.object = undefined;
      } else {
        deleteByKey(tx, k);
        this.applied.delete(k);
      }
    });
  }

  /** Store updates of at most SLICE_MS each, with turns of the event loop between (a large file must not hold the process). */
  private async updateInTurns<T>(items: readonly T[], apply: (tx: StoreTx, item: T) => void): Promise<void> {
    let i = 0;
    while (i < items.length) {
      if (i) await nextTurn();
      if (this.stopped) return;
      const t0 = performance.now();
      this.store.update((tx) => {
        for (; i < items.length; i++) {
          if (i % BATCH_MIN === 0 && i && performance.now() - t0 > SLICE_MS) break;
          apply(tx, items[i]);
        }
      });
    }
  }

  /**
   * One file's objects to the store (a first load in order: a key an earlier
   * file defined goes to this one), let go once there; in several updates
   * with turns of the event loop between when it takes long (updateInTurns).
   */
  private async applyFile(file: string, st: FileState) {
    await this.updateInTurns([...st.objects], (tx, [k, entry]) => {
      if (!entry.object) return;
      if (this.applied.has(k)) this.log.warn({ file, object: k }, 'file source: object defined twice; the later file wins');
      applyObject(tx, entry.object);
      this.applied.set(k, entry.hash);
      entry.object = undefined;
    });
  }

  /** every file's objects; a key two files define goes to the later one */
  private async allDesired(): Promise<Map<string, Desired>> {
    const desired = new Map<string, Desired>();
    for (const [file, st] of this.files) {
      for (const [k, entry] of st.objects) {
        const other = desired.get(k);
        if (other) this.definedTwice(file, st, other.file, k);
        desired.set(k, { entry, file });
      }
      await this.breathe();
    }
    return desired;
  }

  /** the winning definitions of some keys (absent: no file defines it) */
  private desiredOf(keys: Set<string>): Map<string, Desired> {
    const desired = new Map<string, Desired>();
    for (const k of keys) {
      let win: Desired | undefined;
      for (const [file, st] of this.files) {
        const entry = st.objects.get(k);
        if (!entry) continue;
        if (win) this.definedTwice(file, st, win.file, k);
        win = { entry, file };
      }
      if (win) desired.set(k, win);
    }
    return desired;
  }

  private definedTwice(file: string, st: FileState, other: string, key: string) {
    // a file held back may still have what another file has taken over
    if (!st.held && !this.files.get(other)!.held) this.log.warn({ file, object: key }, 'file source: object defined twice; the later file wins');
  }

  /**
   * The keys of the files whose objects changed since `before` (added and
   * removed files too), or undefined when looking at every key is as cheap
   * or the files' order changed (which file wins a key depends on it).
   */
  private changedKeys(before: Map<string, FileState>): Set<string> | undefined {
    if (!before.size) return undefined;
    const changed: string[] = [];
    for (const [file, st] of this.files) if (before.get(file)?.objects !== st.objects) changed.push(file);
    for (const file of before.keys()) if (!this.files.has(file)) changed.push(file);
    // the files both maps have, in the same order?
    const kept = [...before.keys()].filter((f) => this.files.has(f));
    let i = 0;
    for (const f of this.files.keys()) if (before.has(f) && kept[i++] !== f) return undefined;
    let total = 0;
    for (const st of this.files.values()) total += st.objects.size;
    const keys = new Set<string>();
    for (const file of changed) {
      for (const k of before.get(file)?.objects.keys() ?? []) keys.add(k);
      for (const k of this.files.get(file)?.objects.keys() ?? []) keys.add(k);
      if (keys.size * this.files.size > total) return undefined;
    }
    return keys;
  }

  /** a reload when the first held-back file's grace is over */
  private recheckHeld() {
    clearTimeout(this.heldTimer);
    let at = Infinity;
    for (const s of this.files.values()) if (s.held) at = Math.min(at, s.held.since + this.graceMs);
    if (at !== Infinity) this.heldTimer = setTimeout(() => void this.reload(), Math.max(0, at - Date.now()) + 10);
  }
}

/** A regular file's content, read without ever blocking (a FIFO must not wait for a writer). */
async function readRegular(file: string): Promise<{ data: Buffer; st: BigIntStats } | 'not regular' | 'changing'> {
  const fh = await open(file, constants.O_RDONLY | constants.O_NONBLOCK);
  try {
    const before = await fh.stat({ bigint: true });
    if (!before.isFile()) return 'not regular';
    const data = await fh.readFile();
    const st = await fh.stat({ bigint: true });
    if (st.size !== BigInt(data.length) || st.mtimeNs !== before.mtimeNs) return 'changing';
    return { data, st };
  } finally {
    await fh.close().catch(() => {});
  }
}

function lostObjects(prev: Map<string, Entry>, items: ParsedItem[]): boolean {
  const now = new Set<string>();
  for (const it of items) if ('key' in it) now.add(it.key);
  for (const k of prev.keys()) if (!now.has(k)) return true;
  return false;
}
