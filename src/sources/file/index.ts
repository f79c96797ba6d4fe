// The file source: Kubernetes objects exactly as `kubectl get -o yaml|json`
// prints them (Service, EndpointSlice, Node, ServiceCIDR, Lists, multi-
// document YAML), from a file or a directory. Changes are re-applied as a
// diff when the files change (file-system events, debounced; no polling).
// A file that does not parse keeps its last good objects; an invalid object
// keeps its last good version.
import { readFileSync, readdirSync, statSync, watch, type FSWatcher } from 'node:fs';
import { basename, dirname, extname, join, resolve } from 'node:path';
import { parseAllDocuments } from 'yaml';
import type { Logger } from '../../log.js';
import type { Store } from '../../store/store.js';
import { KINDS } from '../../store/store.js';
import { convertObject, flattenObjects, InvalidObject, objectRef } from '../objects.js';
import { applyObject, deleteObject, modelKey, type ModelObject } from '../apply.js';
import { registerSource } from '../registry.js';

const EXTENSIONS = new Set(['.yaml', '.yml', '.json']);

export interface FileSourceOptions {
  input: string;
  /** quiet time after the last file event before reloading */
  debounceMs?: number;
  /** watch for changes (default true) */
  watch?: boolean;
}

export class FileSource {
  private readonly input: string;
  /** per file: its last good objects by model key */
  private files = new Map<string, Map<string, ModelObject>>();
  /** what is in the store from us */
  private applied = new Map<string, ModelObject>();
  private readonly watchers = new Map<string, FSWatcher>();
  private only?: string;
  private timer?: NodeJS.Timeout;
  reloads = 0;

  constructor(
    private readonly store: Store,
    private readonly log: Logger,
    private readonly opts: FileSourceOptions,
  ) {
    this.input = resolve(opts.input);
  }

  start(): void {
    this.reload();
    this.store.update((tx) => KINDS.forEach((k) => tx.setSynced(k)));
    if (this.opts.watch !== false) this.watch();
  }

  stop(): void {
    for (const w of this.watchers.values()) w.close();
    this.watchers.clear();
    clearTimeout(this.timer);
  }

  // One plain (non-recursive) watch per directory: Node 20's recursive watch
  // on Linux loses a file once it is replaced by rename, which is how editors
  // and config tools save.
  private watch() {
    let isDir = false;
    try {
      isDir = statSync(this.input).isDirectory();
    } catch {
      // a missing input may appear later: its directory is watched
    }
    this.only = isDir ? undefined : basename(this.input);
    this.syncWatchers(isDir ? this.directories() : [dirname(this.input)]);
  }

  private directories(): string[] {
    const out: string[] = [];
    const walk = (d: string) => {
      out.push(d);
      try {
        for (const e of readdirSync(d, { withFileTypes: true })) if (e.isDirectory() && !e.name.startsWith('.')) walk(join(d, e.name));
      } catch {
        // vanished meanwhile
      }
    };
    walk(this.input);
    return out;
  }

  private syncWatchers(dirs: string[]) {
    const want = new Set(dirs);
    for (const [d, w] of this.watchers) if (!want.has(d)) (w.close(), this.watchers.delete(d));
    for (const d of want) {
      if (this.watchers.has(d)) continue;
      try {
        const w = watch(d, (_event, name) => {
          if (this.only && name && name.toString() !== this.only) return;
          clearTimeout(this.timer);
          this.timer = setTimeout(() => this.reload(), this.opts.debounceMs ?? 100);
        });
        w.on('error', () => this.watchers.delete(d));
        this.watchers.set(d, w);
      } catch (e) {
        this.log.error({ err: (e as Error).message, path: d }, 'file source: cannot watch; changes there are not seen');
      }
    }
  }

  private listFiles(): string[] {
    let st;
    try {
      st = statSync(this.input);
    } catch (e) {
      this.log.error({ path: this.input, err: (e as Error).message }, 'file source: input not readable; keeping the last good state');
      return [...this.files.keys()];
    }
    if (!st.isDirectory()) return [this.input];
    const out: string[] = [];
    const walk = (d: string) => {
      for (const ent of readdirSync(d, { withFileTypes: true }).sort((a, b) => (a.name < b.name ? -1 : 1))) {
        if (ent.name.startsWith('.')) continue;
        const p = join(d, ent.name);
        if (ent.isDirectory()) walk(p);
        else if (EXTENSIONS.has(extname(ent.name))) out.push(p);
      }
    };
    walk(this.input);
    return out;
  }

  /** Re-reads every file and applies what changed as one store update. */
  reload(): void {
    this.reloads++;
    const next = new Map<string, Map<string, ModelObject>>();
    for (const file of this.listFiles()) next.set(file, this.readFile(file, this.files.get(file)));
    this.files = next;

    const desired = new Map<string, ModelObject>();
    for (const [file, objs] of next) {
      for (const [k, o] of objs) {
        if (desired.has(k)) this.log.warn({ file, object: k }, 'file source: object defined twice; the later file wins');
        desired.set(k, o);
      }
    }
    this.store.update((tx) => {
      for (const [k, o] of this.applied) if (!desired.has(k)) deleteObject(tx, o);
      for (const [k, o] of desired) if (this.applied.get(k) !== o) applyObject(tx, o);
    });
    this.applied = desired;
    // directories may have come or gone
    if (this.watchers.size && this.only === undefined) this.syncWatchers(this.directories());
  }

  private readFile(file: string, previous: Map<string, ModelObject> | undefined): Map<string, ModelObject> {
    let raws: unknown[];
    try {
      const text = readFileSync(file, 'utf8');
      const docs = extname(file) === '.json' ? [JSON.parse(text)] : parseYAMLDocs(text);
      // a List nested absurdly deep refuses the file
      raws = docs.flatMap(flattenObjects);
    } catch (e) {
      if (previous) {
        this.log.error({ file, err: (e as Error).message }, 'file source: cannot parse file; keeping its last good objects');
        return previous;
      }
      this.log.error({ file, err: (e as Error).message }, 'file source: cannot parse file; skipping it');
      return new Map();
    }
    const out = new Map<string, ModelObject>();
    for (const raw of raws) {
      if (raw === null || raw === undefined) continue;
      let c;
      try {
        c = convertObject(raw);
      } catch (e) {
        if (!(e instanceof InvalidObject)) throw e;
        const ref = objectRef(raw);
        const k = keyOfRaw(raw);
        const prev = previous?.get(k);
        this.log.error({ file, object: ref, field: e.field, reason: e.reason }, `file source: skipping invalid ${ref}: ${e.message}${prev ? ' (keeping its last good version)' : ''}`);
        if (prev) out.set(k, prev);
        continue;
      }
      if (c.kind === 'Ignored') {
        this.log.debug({ file, object: objectRef(raw), reason: c.reason }, 'file source: ignoring object');
        continue;
      }
      const k = modelKey(c);
      if (out.has(k)) this.log.warn({ file, object: k }, 'file source: object defined twice in this file; the later one wins');
      // keep the identical object from the last load so unchanged objects are not re-applied
      const old = previous?.get(k);
      out.set(k, old && sameObject(old, c) ? old : c);
    }
    return out;
  }
}

function parseYAMLDocs(text: string): unknown[] {
  const docs = parseAllDocuments(text);
  const out: unknown[] = [];
  for (const d of Array.isArray(docs) ? docs : [docs]) {
    if (d.errors.length) throw new Error(d.errors[0].message);
    out.push(d.toJS());
  }
  return out;
}

/** the model key an object would have, to find its last good version */
function keyOfRaw(raw: unknown): string {
  const o = raw as { kind?: unknown; metadata?: { name?: unknown; namespace?: unknown } };
  const kind = String(o?.kind ?? '');
  const name = String(o?.metadata?.name ?? '');
  if (kind === 'Service' || kind === 'EndpointSlice') return `${kind}/${String(o?.metadata?.namespace || 'default')}/${name}`;
  return `${kind}/${name}`;
}

function sameObject(a: ModelObject, b: ModelObject): boolean {
  return JSON.stringify(a, bigintSafe) === JSON.stringify(b, bigintSafe);
}

function bigintSafe(_k: string, v: unknown) {
  return typeof v === 'bigint' ? v.toString() : v;
}

registerSource({
  name: 'file',
  description: 'read Kubernetes objects (kubectl get -o yaml|json) from a file or a directory, and follow their changes',
  options(cmd) {
    cmd
      .requiredOption('-i, --input <path>', 'file or directory of Service, EndpointSlice, Node and ServiceCIDR objects')
      .option('--debounce <ms>', 'wait this long after the last file change before reloading', (v) => Number(v), 100)
      .option('--no-watch', 'read the input once; do not follow changes');
  },
  async start(opts, ctx) {
    const src = new FileSource(ctx.store, ctx.log, { input: opts.input, debounceMs: opts.debounce, watch: opts.watch });
    src.start();
    return { stop: async () => src.stop() };
  },
});
