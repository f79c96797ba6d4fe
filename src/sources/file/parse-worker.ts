// The worker thread that parses large input files (see parser-thread.ts):
// text in (transferred, not copied), converted objects out in small chunks,
// at most WINDOW of them not yet taken in by the main thread: it takes in
// all waiting messages at once, so more would stall its event loop.
import { parentPort } from 'node:worker_threads';
import { parseObjects } from './parse.js';

export interface ParseRequest {
  id: number;
  json: boolean;
  /** hash each object (a source that reads its files only once compares nothing) */
  hash: boolean;
  data: Uint8Array;
  /** chunks the main thread has taken in (a SharedArrayBuffer) */
  taken: Int32Array;
}

/** error: the file's content cannot be taken (ParseFailed) */
export type ParseReply = { id: number; items: import('./parse.js').ParsedItem[] } | { id: number; done: true } | { id: number; error: string };

const CHUNK = 250;
const WINDOW = 2;
const port = parentPort!;
const decoder = new TextDecoder();
port.on('message', (req: ParseRequest) => {
  try {
    let text: string | undefined = decoder.decode(req.data);
    req.data = new Uint8Array(0);
    let sent = 0;
    parseObjects(
      text,
      req.json,
      (items) => {
        for (let taken = Atomics.load(req.taken, 0); sent - taken >= WINDOW; taken = Atomics.load(req.taken, 0)) Atomics.wait(req.taken, 0, taken, 1000);
        port.postMessage({ id: req.id, items } satisfies ParseReply);
        sent++;
      },
      CHUNK,
      req.hash,
    );
    text = undefined;
    port.postMessage({ id: req.id, done: true } satisfies ParseReply);
  } catch (e) {
    port.postMessage({ id: req.id, error: e instanceof Error ? e.message : String(e) } satisfies ParseReply);
  }
});
