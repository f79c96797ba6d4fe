// The thread that renders to-file --once's YAML (render-thread.ts): the main
// thread computes each Service's view and its JSON form and sends them as
// JSON text in batches; this renders each in YAML and writes it, in order.
import { parentPort } from 'node:worker_threads';
import { DocumentParts } from './stream.js';
import { FdWriter } from './fd-writer.js';

export type RenderRequest =
  | { start: { fd: number; listKey: string } }
  /** items as JSON text, one a line */
  | { batch: string }
  | { end: true };

/** done: a batch written (then the end: everything flushed) */
export type RenderReply = { done: 'batch' | 'end' } | { error: string };

const port = parentPort!;
let parts: DocumentParts | undefined;
let out: FdWriter | undefined;
let first = true;

port.on('message', (m: RenderRequest) => {
  try {
    if ('start' in m) {
      parts = new DocumentParts('yaml', m.start.listKey);
      out = new FdWriter(m.start.fd);
      first = true;
      return;
    }
    if ('end' in m) {
      out!.flush();
      port.postMessage({ done: 'end' } satisfies RenderReply);
      return;
    }
    for (const line of m.batch.split('\n')) {
      out!.write(parts!.item(JSON.parse(line), first));
      first = false;
    }
    port.postMessage({ done: 'batch' } satisfies RenderReply);
  } catch (e) {
    port.postMessage({ error: e instanceof Error ? e.message : String(e) } satisfies RenderReply);
  }
});
