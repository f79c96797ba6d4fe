// A worker thread that parses for the sources (parse-worker.ts): a large
// YAML file never stalls the event loop, and a kube list page's slices are
// parsed and converted beside the main thread. Started on first use, ended
// once idle: the memory a big parse took goes with it.
import { Worker } from 'node:worker_threads';
import { ParseFailed, type ParsedItem } from './file/parse.js';
import { PageFailed, type ItemResource, type ListItem, type PageMeta } from './kube/list-item.js';
import type { ParseReply, ParseRequest } from './parse-worker.js';

interface Job {
  worker: Worker;
  /** chunks the main thread has taken in, shared with the worker */
  taken: Int32Array;
  onChunk: (items: never[]) => void;
  onMeta?: (meta: PageMeta) => void;
  /** what the content's error is (the file's or the page's) */
  failed: (msg: string) => Error;
  resolve: () => void;
  reject: (e: Error) => void;
}

export class ParserThread {
  private worker?: Worker;
  private readonly jobs = new Map<number, Job>();
  private nextId = 0;
  private idleTimer?: NodeJS.Timeout;

  constructor(private readonly idleMs = 2000) {}

  /** parses under way */
  get pending(): number {
    return this.jobs.size;
  }

  /**
   * Parses data (its buffer is transferred unless data is a view of a
   * buffer it shares: the caller must not use it again), handing out
   * converted objects as they come. Fails with
   * ParseFailed for content that cannot be taken; with other errors when
   * the worker cannot start or dies (ERR_WORKER_OUT_OF_MEMORY: the file was
   * too much for it).
   */
  parse(data: Uint8Array, json: boolean, onChunk: (items: ParsedItem[]) => void, hash = true): Promise<void> {
    const own = owned(data);
    return this.run((id, taken) => [{ id, json, hash, data: own, taken }, [own.buffer as ArrayBuffer]], { onChunk: onChunk as (items: never[]) => void, failed: (m) => new ParseFailed(m) });
  }

  /**
   * Parses a kube list page (its bytes, transferred as parse's are): its
   * resourceVersion and continue token first, then its items (listItem) as
   * they come. Fails with PageFailed for a page that cannot be taken; with
   * other errors when the worker cannot start or dies.
   */
  parsePage(bytes: Uint8Array, resource: ItemResource, onMeta: (meta: PageMeta) => void, onChunk: (items: ListItem[]) => void): Promise<void> {
    const own = owned(bytes);
    return this.run((id, taken) => [{ id, page: { bytes: own, resource }, taken }, [own.buffer as ArrayBuffer]], { onChunk: onChunk as (items: never[]) => void, onMeta, failed: (m) => new PageFailed(m) });
  }

  private run(request: (id: number, taken: Int32Array) => [ParseRequest, ArrayBuffer[]], job: Pick<Job, 'onChunk' | 'onMeta' | 'failed'>): Promise<void> {
    clearTimeout(this.idleTimer);
    const w = this.start();
    w.ref();
    const id = ++this.nextId;
    return new Promise<void>((resolve, reject) => {
      const taken = new Int32Array(new SharedArrayBuffer(4));
      this.jobs.set(id, { ...job, worker: w, taken, resolve, reject });
      const [req, transfer] = request(id, taken);
      w.postMessage(req, transfer);
    }).finally(() => {
      if (this.worker !== w || [...this.jobs.values()].some((j) => j.worker === w)) return;
      w.unref();
      this.idleTimer = setTimeout(() => void this.close(), this.idleMs).unref();
    });
  }

  /** Ends the worker; parses under way fail. */
  async close(): Promise<void> {
    clearTimeout(this.idleTimer);
    const w = this.worker;
    this.worker = undefined;
    if (!w) return;
    this.fail(w, new Error('parser stopped'));
    await w.terminate();
  }

  private start(): Worker {
    if (this.worker) return this.worker;
    const here = import.meta.url;
    let w: Worker;
    if (here.endsWith('.ts')) {
      // running from the sources through tsx: the worker needs tsx as well
      const tsx = import.meta.resolve('tsx/esm/api');
      const entry = new URL('./parse-worker.ts', here).href;
      w = new Worker(`import(${JSON.stringify(tsx)}).then((m) => { m.register(); return import(${JSON.stringify(entry)}); });`, { eval: true });
    } else {
      w = new Worker(new URL('./parse-worker.js', here));
    }
    w.on('message', (m: ParseReply) => {
      const job = this.jobs.get(m.id);
      if (!job) return;
      if ('meta' in m) return job.onMeta?.(m.meta);
      if ('items' in m) {
        job.onChunk(m.items as never[]);
        // one more chunk taken: the worker may send the next
        Atomics.add(job.taken, 0, 1);
        Atomics.notify(job.taken, 0);
        return;
      }
      this.jobs.delete(m.id);
      if ('error' in m) job.reject(job.failed(m.error));
      else job.resolve();
    });
    // out of memory, or a bug: the parses under way fail, the next one starts a new worker
    w.on('error', (e) => {
      if (this.worker === w) this.worker = undefined;
      this.fail(w, e);
    });
    w.on('exit', (code) => {
      if (this.worker === w) this.worker = undefined;
      this.fail(w, new Error(`parser thread exited (${code})`));
    });
    this.worker = w;
    return w;
  }

  private fail(w: Worker, e: Error) {
    for (const [id, j] of this.jobs) {
      if (j.worker !== w) continue;
      this.jobs.delete(id);
      j.reject(e);
    }
  }
}

/** bytes that can be transferred: a view of a buffer it shares (one of Node's pools, a larger buffer) is copied */
function owned(bytes: Uint8Array): Uint8Array {
  return bytes.byteOffset === 0 && bytes.byteLength === bytes.buffer.byteLength ? bytes : new Uint8Array(bytes);
}
