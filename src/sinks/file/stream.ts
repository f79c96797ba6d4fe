// The state documents as a stream of text: the same bytes as rendering the
// whole document (JSON.stringify(doc, null, 2), or the yaml library with
// lineWidth 0), produced one Service at a time, so that neither the whole
// document, nor a YAML tree of it, nor the output string is ever held: for
// a large cluster those would take seconds and gigabytes.
//
// YAML is written here for the JSON values protobuf's toJson gives (maps,
// arrays, strings, numbers, booleans, null), in the yaml library's block
// layout; every scalar the plain form might not read back the same is
// rendered by the library itself (remembered per value), and a value this
// cannot lay out for sure (a string across lines, a key not plain) is
// rendered whole by it.
import { yaml } from '../../runtime/lazy.js';

export type Format = 'yaml' | 'json';

type Json = null | boolean | number | string | Json[] | { [k: string]: Json };

const YAML_OPTIONS = { lineWidth: 0 } as const;

// --- JSON

/**
 * JSON.stringify(v, null, 2) as it reads at nesting depth `depth` of a
 * document: stringified inside `depth` arrays, which indent it, and cut out
 * (one walk over the value; indenting every line afterwards would cost a
 * good part of a JSON state's rendering)
 */
function jsonAt(v: unknown, depth: number): string {
  let wrapped: unknown = v;
  for (let i = 0; i < depth; i++) wrapped = [wrapped];
  const text = JSON.stringify(wrapped, null, 2);
  // depth 2: "[\n  [\n    " before, "\n  ]\n]" after
  return text.slice(depth * (depth + 3), text.length - depth * (depth + 1));
}

// --- YAML scalars

/**
 * Strings the yaml library writes plain (unquoted): letters, digits and
 * `_ . / -`, not starting with an indicator, a digit, `.`, `-`, or a sign,
 * not one of YAML 1.2's null and boolean words; and dotted ones (DOTTED).
 * Anything else is asked of the library.
 */
const PLAIN = /^[A-Za-z_][A-Za-z0-9_./-]*$/;
const RESERVED = /^(?:[Nn]ull|NULL|[Tt]rue|TRUE|[Ff]alse|FALSE)$/;
/** IPv4 addresses and CIDRs, versions: two dots or more are never a number (most of a state's strings) */
const DOTTED = /^[0-9][0-9]*(?:\.[0-9A-Za-z_-]+){2,}(?:\/[0-9]+)?$/;
const SINGLE_LINE = /^[^\n]*\n$/;

class Scalars {
  private readonly values = new Map<string, string | undefined>();

  /** a scalar value as the library writes it in block context, or undefined when it would take more than a line */
  value(v: null | boolean | number | string): string | undefined {
    if (v === null) return 'null';
    if (typeof v === 'boolean') return v ? 'true' : 'false';
    if (typeof v === 'number') {
      if (Number.isSafeInteger(v) && !Object.is(v, -0)) return String(v);
      return this.ask(this.values, `n:${v}`, () => yaml().stringify(v, YAML_OPTIONS));
    }
    if ((PLAIN.test(v) && !RESERVED.test(v)) || DOTTED.test(v)) return v;
    return this.ask(this.values, v, () => yaml().stringify(v, YAML_OPTIONS));
  }

  private readonly keys = new Map<string, boolean>();

  /** a map key written plain, or undefined: how the library writes others depends on where they are ("---" at the start of a line) */
  key(k: string): string | undefined {
    // a document has few distinct keys
    let plain = this.keys.get(k);
    if (plain === undefined) {
      plain = PLAIN.test(k) && !RESERVED.test(k);
      if (this.keys.size < 10_000) this.keys.set(k, plain);
    }
    return plain ? k : undefined;
  }

  private ask(cache: Map<string, string | undefined>, k: string, render: () => string): string | undefined {
    if (cache.has(k)) return cache.get(k);
    const text = render();
    const r = SINGLE_LINE.test(text) ? text.slice(0, -1) : undefined;
    // bounded: distinct odd strings (IPv6 addresses) could be many
    if (cache.size > 100_000) cache.clear();
    cache.set(k, r);
    return r;
  }
}

/** thrown inside the YAML writer when a value needs the library's own layout */
class NotPlain extends Error {}

function isEmpty(v: Json[] | { [k: string]: Json }): boolean {
  if (Array.isArray(v)) return v.length === 0;
  for (const _ in v) return false;
  return true;
}
const isCollection = (v: Json): v is Json[] | { [k: string]: Json } => typeof v === 'object' && v !== null;

const PADS: string[] = [];
const padOf = (n: number) => (PADS[n] ??= ' '.repeat(n));

class YamlWriter {
  constructor(private readonly scalars: Scalars) {}

  /**
   * The text of a value in block context at `indent` spaces, each line
   * ending in \n (a non-empty collection); `lead` in place of the first
   * line's indentation (an item's "- ", of the same width).
   */
  block(v: Json[] | { [k: string]: Json }, indent: number, lead?: string): string {
    const pad = padOf(indent);
    let p = lead ?? pad;
    let out = '';
    if (Array.isArray(v)) {
      for (const item of v) {
        // a collection laid out 2 deeper, its first line's indentation taken by "- "
        if (isCollection(item) && !isEmpty(item)) out += this.block(item, indent + 2, p + '- ');
        else out += p + '- ' + this.inline(item) + '\n';
        p = pad;
      }
      return out;
    }
    for (const k in v) {
      const key = this.scalars.key(k);
      if (key === undefined) throw new NotPlain();
      const x = v[k];
      if (isCollection(x) && !isEmpty(x)) out += p + key + ':\n' + this.block(x, indent + 2);
      else out += p + key + ': ' + this.inline(x) + '\n';
      p = pad;
    }
    return out;
  }

  /** a scalar or an empty collection, on the line it belongs to */
  private inline(v: Json): string {
    if (Array.isArray(v)) return '[]';
    if (typeof v === 'object' && v !== null) return '{}';
    const s = this.scalars.value(v);
    if (s === undefined) throw new NotPlain();
    return s;
  }

  /** an item of the sequence under top-level key `key` (indentSeq: items 2 deeper than the key) */
  item(key: string, v: Json): string {
    try {
      return this.block([v], 2);
    } catch (e) {
      if (!(e instanceof NotPlain)) throw e;
      // the library's own layout of the item, where it stands
      const text = yaml().stringify({ [key]: [v] }, YAML_OPTIONS);
      return text.slice(text.indexOf('\n') + 1);
    }
  }

  /** a top-level "key: value" pair */
  pair(k: string, v: Json): string {
    try {
      return this.block({ [k]: v }, 0);
    } catch (e) {
      if (!(e instanceof NotPlain)) throw e;
      return yaml().stringify({ [k]: v }, YAML_OPTIONS);
    }
  }
}

// --- documents

/**
 * The parts of a document `{ ...head, [listKey]: items }`: its head (the
 * head's fields and the list's opening), each item, its tail.
 */
class DocumentParts {
  private readonly yaml?: YamlWriter;

  constructor(
    readonly format: Format,
    readonly listKey: string,
  ) {
    if (format === 'yaml') this.yaml = new YamlWriter(new Scalars());
  }

  /** the head's fields, then the list's opening (or the whole empty list) */
  head(head: Record<string, unknown>, empty: boolean): string {
    if (this.format === 'json') {
      let text = '{\n';
      for (const [k, v] of Object.entries(head)) text += `  ${JSON.stringify(k)}: ${jsonAt(v, 1)},\n`;
      return text + `  ${JSON.stringify(this.listKey)}: ` + (empty ? '[]\n}\n' : '[\n');
    }
    let text = '';
    for (const [k, v] of Object.entries(head)) text += this.yaml!.pair(k, v as Json);
    return text + (empty ? this.yaml!.pair(this.listKey, []) : `${this.listKey}:\n`);
  }

  /** an item of a non-empty list */
  item(v: unknown, first: boolean): string {
    // JSON: the comma goes before each item after the first: the last one is known only when the items end
    if (this.format === 'json') return `${first ? '' : ',\n'}    ${jsonAt(v, 2)}`;
    return this.yaml!.item(this.listKey, v as Json);
  }

  /** after the last item of a non-empty list */
  tail(): string {
    return this.format === 'json' ? '\n  ]\n}\n' : '';
  }
}

/**
 * A document `{ ...head, [listKey]: items }` as text chunks: the head's
 * fields, then the list one item at a time (items is iterated once; an
 * item is rendered only when its turn comes, and how many there are need
 * not be known: a one-shot state computes each item as it is written).
 */
export function* documentChunks(format: Format, head: Record<string, unknown>, listKey: string, items: Iterable<unknown>): Generator<string> {
  const parts = new DocumentParts(format, listKey);
  const it = items[Symbol.iterator]();
  let next = it.next();
  yield parts.head(head, !!next.done);
  if (next.done) return;
  for (let first = true; !next.done; next = it.next(), first = false) yield parts.item(next.value, first);
  const tail = parts.tail();
  if (tail) yield tail;
}
