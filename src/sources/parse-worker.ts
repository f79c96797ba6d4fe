// The worker thread that parses for the sources (see parser-thread.ts): a
// large input file of the file source (its bytes transferred, not copied),
// or a large list page of the kube source (its bytes too). Converted objects go
// out in small chunks, at most WINDOW of them not yet taken in by the main
// thread: it takes in all waiting messages at once, so more would stall its
// event loop.
import { parentPort } from 'node:worker_threads';
import { parseObjects, type ParsedItem } from './file/parse.js';
import { parseListPage, type ItemResource, type ListItem, type PageMeta } from './kube/list-item.js';

interface Common {
  id: number;
  /** chunks the main thread has taken in (a SharedArrayBuffer) */
  taken: Int32Array;
}

/** an input file */
export interface FileRequest extends Common {
  json: boolean;
  /** hash each object (a source that reads its files only once compares nothing) */
  hash: boolean;
  data: Uint8Array;
}

/** a kube list page (its bytes transferred: a page's text made on the main thread is a large object, costly there) */
export interface PageRequest extends Common {
  page: { bytes: Uint8Array; resource: ItemResource };
}

export type ParseRequest = FileRequest | PageRequest;

/** meta: a page's resourceVersion and continue token, before its items; error: the content cannot be taken (ParseFailed, PageFailed) */
export type ParseReply =
  | { id: number; meta: PageMeta }
  | { id: number; items: ParsedItem[] | ListItem[] }
  | { id: number; done: true }
  | { id: number; error: string };

const CHUNK = 250;
const WINDOW = 2;
const port = parentPort!;
const decoder = new TextDecoder();
port.on('message', (req: ParseRequest) => {
  let sent = 0;
  const send = (items: ParsedItem[] | ListItem[]) => {
    for (let taken = Atomics.load(req.taken, 0); sent - taken >= WINDOW; taken = Atomics.load(req.taken, 0)) Atomics.wait(req.taken, 0, taken, 1000);
    port.postMessage({ id: req.id, items } satisfies ParseReply);
    sent++;
  };
  try {
    if ('page' in req) {
      const text = decoder.decode(req.page.bytes);
      req.page.bytes = new Uint8Array(0);
      parseListPage(text, req.page.resource, (meta) => port.postMessage({ id: req.id, meta } satisfies ParseReply), send, CHUNK, true);
      port.postMessage({ id: req.id, done: true } satisfies ParseReply);
      return;
    }
    let text: string | undefined = decoder.decode(req.data);
    req.data = new Uint8Array(0);
    parseObjects(text, req.json, send, CHUNK, req.hash, true);
    text = undefined;
    port.postMessage({ id: req.id, done: true } satisfies ParseReply);
  } catch (e) {
    port.postMessage({ id: req.id, error: e instanceof Error ? e.message : String(e) } satisfies ParseReply);
  }
});
