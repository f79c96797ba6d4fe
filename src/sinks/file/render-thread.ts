// to-file --once renders its YAML in a thread of its own: the main thread
// computes each Service's view (it has the store) and its JSON form, and
// sends it as JSON text in batches; the thread renders the YAML (the
// larger half of the text's cost: JSON.stringify is native, the YAML
// writer is not) and writes it (render-worker.ts). On two cores the halves
// overlap.
import { Worker } from 'node:worker_threads';
import type { RenderReply, RenderRequest } from './render-worker.js';

/** characters of JSON per message */
const BATCH_CHARS = 256 * 1024;
/** batches sent and not yet written: enough to keep the thread busy, few to hold */
const WINDOW = 4;

export class RenderThread {
  private readonly worker: Worker;
  private readonly replies: Exclude<RenderReply, { error: string }>[] = [];
  private wake?: () => void;
  private failed?: Error;

  /** Starts the thread (it loads its modules meanwhile). */
  constructor() {
    const here = import.meta.url;
    if (here.endsWith('.ts')) {
      // running from the sources through tsx: the worker needs tsx as well
      const tsx = import.meta.resolve('tsx/esm/api');
      const entry = new URL('./render-worker.ts', here).href;
      this.worker = new Worker(`import(${JSON.stringify(tsx)}).then((m) => { m.register(); return import(${JSON.stringify(entry)}); });`, { eval: true });
    } else {
      this.worker = new Worker(new URL('./render-worker.js', here));
    }
    this.worker.on('message', (m: RenderReply) => {
      if ('error' in m) this.failed ??= new Error(`to-file: rendering failed: ${m.error}`);
      else this.replies.push(m);
      this.wake?.();
    });
    this.worker.on('error', (e) => {
      this.failed ??= e;
      this.wake?.();
    });
    this.worker.on('exit', (code) => {
      this.failed ??= new Error(`to-file: the render thread exited (${code})`);
      this.wake?.();
    });
  }

  private post(m: RenderRequest) {
    this.worker.postMessage(m);
  }

  private async reply(): Promise<Exclude<RenderReply, { error: string }>> {
    for (;;) {
      if (this.failed) throw this.failed;
      const r = this.replies.shift();
      if (r) return r;
      await new Promise<void>((resolve) => (this.wake = resolve));
      this.wake = undefined;
    }
  }

  /**
   * Renders the items of a YAML list (DocumentParts.item, JSON values, the
   * first one first) into fd after what is written there, in order;
   * resolves once they are all written. Write nothing to fd meanwhile.
   */
  async render(fd: number, listKey: string, items: Iterable<unknown>): Promise<void> {
    this.post({ start: { fd, listKey } });
    let lines: string[] = [];
    let size = 0;
    let inFlight = 0;
    const send = async () => {
      const batch = lines.join('\n');
      lines = [];
      size = 0;
      this.post({ batch });
      for (inFlight++; inFlight >= WINDOW; inFlight--) await this.reply();
    };
    for (const item of items) {
      const line = JSON.stringify(item);
      lines.push(line);
      size += line.length;
      if (size >= BATCH_CHARS) await send();
    }
    if (lines.length) await send();
    this.post({ end: true });
    for (;;) if ((await this.reply()).done === 'end') return;
  }

  async close(): Promise<void> {
    this.worker.removeAllListeners('exit');
    await this.worker.terminate();
  }
}
