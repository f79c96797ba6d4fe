// One object of a list or a watch event, taken as far as it can be without
// the reflector's state: its key, resourceVersion and converted form, or why
// it cannot be used. The same code runs on the main thread (watch events,
// small pages) and in the parser thread (large pages of EndpointSlices,
// parse-worker.ts), so what it returns must survive structured cloning.
import { convertObject, InvalidObject, objectRef } from '../objects.js';
import { encodedObject, type ModelObject } from '../apply.js';
import { flat } from '../../runtime/memory.js';

/** The kinds the kube source lists and watches. */
export type KubeKind = 'Service' | 'EndpointSlice' | 'Node' | 'ServiceCIDR';

/** what a list item is taken as: enough of a Resource to take it */
export interface ItemResource {
  readonly kind: KubeKind;
  readonly plural: string;
  readonly namespaced: boolean;
}

export type ListItem =
  /** converted (a slice as its bytes: cheap to clone and to keep while a list runs) */
  | { key: string; rv: string; object: ModelObject }
  /** a valid object kpng does not use */
  | { key: string; rv: string; ref: string; ignored: string }
  /** an object that does not convert */
  | { key: string; rv: string; ref: string; invalid: { field?: string; reason: string; message: string } }
  /** no metadata.name: it cannot even be named */
  | { key?: undefined; ref: string };

/** the key the reflector knows an object by (namespace/name, or name) */
export function keyOf(obj: any, namespaced: boolean): string | undefined {
  const md = obj?.metadata;
  const name = md?.name;
  if (typeof name !== 'string' || !name) return undefined;
  // kept for the object's life (known): flat, not a rope (src/runtime/memory.ts)
  return namespaced ? flat(md.namespace || 'default', '/', name) : name;
}

/** crossing: the item goes to another thread (encodedObject) */
export function listItem(obj: any, r: ItemResource, crossing = false): ListItem {
  const key = keyOf(obj, r.namespaced);
  if (key === undefined) return { ref: objectRef(obj) };
  const rv = String(obj.metadata.resourceVersion ?? '');
  // list items carry no kind
  if (obj.kind === undefined) obj.kind = r.kind;
  try {
    const c = convertObject(obj);
    if (c.kind === 'Ignored') return { key, rv, ref: objectRef(obj), ignored: c.reason };
    if (c.kind !== r.kind) throw new InvalidObject('kind', `${c.kind} in a ${r.plural} stream`);
    return { key, rv, object: encodedObject(c, crossing) };
  } catch (e) {
    const inv = e instanceof InvalidObject ? e : undefined;
    return { key, rv, ref: objectRef(obj), invalid: { field: inv?.field, reason: inv?.reason ?? String(e), message: inv ? inv.message : (e as Error).message } };
  }
}

/** a page's text cannot be taken: not JSON, no items */
export class PageFailed extends Error {}

/** a list page's resourceVersion and continue token */
export interface PageMeta {
  rv: string;
  cont?: string;
}

/** how far into a page its metadata is looked for (a ListMeta is a few hundred bytes) */
const HEAD_BYTES = 16 * 1024;

/**
 * A list page's resourceVersion and continue token read from its first
 * bytes, before the page is parsed: API servers write a list's metadata
 * before its items, so the next page can be asked for while this one is
 * parsed and taken. Undefined when the page does not start that way (its
 * whole parse tells).
 */
export function pageHead(bytes: Uint8Array): PageMeta | undefined {
  const buf = Buffer.from(bytes.buffer, bytes.byteOffset, Math.min(bytes.byteLength, HEAD_BYTES));
  const at = buf.indexOf('"items"');
  if (at < 0) return undefined;
  let head: any;
  try {
    head = JSON.parse(`${buf.toString('utf8', 0, at)}"items":[]}`);
  } catch {
    return undefined;
  }
  const md = head?.metadata;
  if (typeof md !== 'object' || md === null) return undefined;
  return { rv: String(md.resourceVersion ?? ''), cont: md.continue || undefined };
}

/**
 * A list page's text: its resourceVersion and continue token first (the
 * next page can be asked for meanwhile), then its items taken (listItem),
 * handed out in chunks.
 */
export function parseListPage(text: string, r: ItemResource, onMeta: (meta: PageMeta) => void, onChunk: (items: ListItem[]) => void, chunkSize = 250, crossing = false): void {
  let page: any;
  try {
    page = JSON.parse(text);
  } catch {
    throw new PageFailed('the answer is not JSON');
  }
  if (!Array.isArray(page?.items)) throw new PageFailed('the list has no items');
  onMeta({ rv: String(page.metadata?.resourceVersion ?? ''), cont: page.metadata?.continue || undefined });
  const items: unknown[] = page.items;
  for (let i = 0; i < items.length; i += chunkSize) {
    const chunk: ListItem[] = [];
    for (let j = i; j < Math.min(items.length, i + chunkSize); j++) {
      chunk.push(listItem(items[j], r, crossing));
      // taken: its parsed form may go (a page is 500 objects)
      items[j] = undefined;
    }
    onChunk(chunk);
  }
}
