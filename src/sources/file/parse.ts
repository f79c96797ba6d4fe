// One input file's text to converted objects. The same code runs on the main
// thread for small files and in a worker thread for large ones (worker.ts),
// so what it returns must survive structured cloning.
import { hash as digest } from 'node:crypto';
import { yaml } from '../../runtime/lazy.js';
import { convertObject, flattenObjects, InvalidObject, objectRef } from '../objects.js';
import { encodedObject, modelKey, type ModelObject } from '../apply.js';
import { encodeServiceFast } from '../../api/fast-encode.js';

/** the file's content cannot be taken: a syntax error, Lists nested too deep */
export class ParseFailed extends Error {}

export type ParsedItem =
  /** hash: of the converted object, to tell an unchanged object without comparing it ('' when not asked for) */
  | { key: string; object: ModelObject; hash: string }
  /** an object that does not convert: key is what it would have, to keep its last good version */
  | { key: string; ref: string; field: string; reason: string; message: string }
  /** a valid object kpng does not use */
  | { ref: string; ignored: string };

/**
 * Parses a file's text (JSON, or YAML with any number of documents) and
 * converts every object in it, handing them out in chunks. Throws
 * ParseFailed when the file as a whole cannot be taken.
 */
export function parseObjects(text: string, json: boolean, onChunk: (items: ParsedItem[]) => void, chunkSize = 1000, hash = true, crossing = false): void {
  let chunk: ParsedItem[] = [];
  const flush = () => {
    if (chunk.length) onChunk(chunk);
    chunk = [];
  };
  try {
    for (const doc of documents(text, json)) {
      for (const raw of flattenObjects(doc)) {
        if (raw === null || raw === undefined) continue;
        chunk.push(convert(raw, hash, crossing));
        if (chunk.length >= chunkSize) flush();
      }
    }
  } catch (e) {
    // a syntax error, Lists nested too deep, input that overflows the parser's stack
    throw e instanceof ParseFailed ? e : new ParseFailed(e instanceof Error ? e.message : String(e));
  }
  flush();
}

function* documents(text: string, json: boolean): Generator<unknown> {
  // `kubectl get -o json` output is YAML too, and JSON.parse is much faster
  if (json || /^\s*[{[]/.test(text)) {
    try {
      yield JSON.parse(text);
      return;
    } catch (e) {
      if (json) throw e;
    }
  }
  // one document at a time, so a multi-document file never holds every
  // document's syntax tree at once
  const lines = new (yaml().LineCounter)();
  const composer = new (yaml().Composer)();
  for (const doc of composer.compose(new (yaml().Parser)(lines.addNewLine).parse(text))) {
    const err = doc.errors[0];
    if (err) {
      const at = lines.linePos(err.pos[0]);
      throw new Error(`${err.message} at line ${at.line}, column ${at.col}`);
    }
    yield doc.toJS();
  }
}

/** crossing: the items go to another thread (encodedObject) */
function convert(raw: unknown, hash: boolean, crossing: boolean): ParsedItem {
  let c;
  try {
    c = convertObject(raw);
  } catch (e) {
    if (!(e instanceof InvalidObject)) throw e;
    return { key: keyOfRaw(raw), ref: objectRef(raw), field: e.field, reason: e.reason, message: e.message };
  }
  if (c.kind === 'Ignored') return { ref: objectRef(raw), ignored: c.reason };
  // slices (most objects) as their bytes, and Services crossing threads:
  // cheap to clone, nothing to encode or copy there, and the hash comes from
  // them (a Service's is the same, parsed on either thread)
  const object = encodedObject(c, crossing);
  if (!hash) return { key: modelKey(object), object, hash: '' };
  const encoded = object.kind === 'EncodedSlice' || object.kind === 'EncodedService';
  return { key: modelKey(object), object, hash: encoded ? digest('sha1', object.bytes, 'base64') : objectHash(object) };
}

/** the model key an object would have, to find its last good version */
function keyOfRaw(raw: unknown): string {
  const o = raw as { kind?: unknown; metadata?: { name?: unknown; namespace?: unknown } };
  const kind = String(o?.kind ?? '');
  const name = String(o?.metadata?.name ?? '');
  if (kind === 'Service' || kind === 'EndpointSlice') return `${kind}/${String(o?.metadata?.namespace || 'default')}/${name}`;
  return `${kind}/${name}`;
}

function objectHash(c: ModelObject): string {
  // a Service (most of what is hashed here) by its protobuf encoding, which
  // holds every field and is several times faster to make than its JSON,
  // and a watching file source hashes every object it reads; one-shot
  // crypto.hash: a fraction of createHash's cost per small object
  if (c.kind === 'Service') return digest('sha1', encodeServiceFast(c.service), 'base64');
  return digest('sha1', JSON.stringify(c, bigintSafe), 'base64');
}

function bigintSafe(_k: string, v: unknown) {
  return typeof v === 'bigint' ? v.toString() : v;
}
