// What a receiver of a diff stream holds of it, by (set, path), and the
// reset filter over that, as kpng's filterreset: after a reconnect the
// server resends everything after a Reset, and this turns the resend into
// only what changed (a value held with the same bytes is no news; what was
// held and not sent again is stale at the Sync that ends the resend). The
// one filter of every receiver that holds a stream's state: a node agent's
// (FilterResetSink in diff/, and kpng local's HeldState) and a chained
// brain's (ApiSource in sources/api).
//
// Values are copied into a few large chunks: keeping the received bytes
// (views into gRPC message buffers, one JS object each) held whole buffers
// and cost more than the bytes.
import { LocalSet, bytesEqual } from './model.js';

const CHUNK_BYTES = 256 << 10;
/** a value above this gets a chunk of its own (a chunk's tail is not wasted on it) */
const BIG_BYTES = CHUNK_BYTES >> 2;
/** compaction once dead bytes exceed both the live ones and this */
const MIN_GARBAGE = 1 << 20;

const LIVE = 1;
const HAS_DIGEST = 2;
const HAS_HASH = 4;

/**
 * A stream's entries (set, path, value) by slot number, a slot's number
 * staying while it lives. Paths and values are bytes in shared chunks, found
 * through an open-addressing index of typed arrays: a stream's paths as
 * strings in Maps would cost more than the values.
 */
export class EntryTable {
  private chunks: Buffer[] = [];
  private pos = CHUNK_BYTES; // no current chunk yet
  private pChunk = new Uint32Array(1024);
  private pOff = new Uint32Array(1024);
  private pLen = new Uint32Array(1024);
  private vChunk = new Uint32Array(1024);
  private vOff = new Uint32Array(1024);
  private vLen = new Uint32Array(1024);
  /** the index's hash of (set, path) */
  private keyHash = new Uint32Array(1024);
  /** resume: the value's digest and the key hash of its service, cached */
  private digestLo = new Uint32Array(1024);
  private digestHi = new Uint32Array(1024);
  private hash = new Uint32Array(1024);
  private set = new Uint8Array(1024);
  private flags = new Uint8Array(1024);
  /** slot + 1 by keyHash, linear probing; 0: empty */
  private index = new Int32Array(2048);
  private next = 0;
  private readonly free: number[] = [];
  private count = 0;
  private liveBytes = 0;
  private deadBytes = 0;

  get size(): number {
    return this.count;
  }

  /** slot numbers in use are below this */
  get slots(): number {
    return this.next;
  }

  find(set: LocalSet, path: string): number | undefined {
    const h = keyHashOf(set, path);
    const mask = this.index.length - 1;
    for (let i = h & mask; this.index[i]; i = (i + 1) & mask) {
      const s = this.index[i] - 1;
      if (this.keyHash[s] === h && this.set[s] === set && this.path(s) === path) return s;
    }
    return undefined;
  }

  add(set: LocalSet, path: string, bytes: Uint8Array): number {
    const slot = this.free.pop() ?? this.grow();
    this.flags[slot] = LIVE;
    this.set[slot] = set;
    const p = Buffer.from(path);
    this.pLen[slot] = p.length;
    [this.pChunk[slot], this.pOff[slot]] = this.place(p);
    this.writeValue(slot, bytes);
    const h = (this.keyHash[slot] = keyHashOf(set, path));
    if (++this.count * 2 > this.index.length) this.rehash(this.index.length * 2);
    else this.insert(slot, h);
    return slot;
  }

  /** a new value in the slot (its path, and so its service's key hash, stays) */
  replace(slot: number, bytes: Uint8Array): void {
    this.dead(this.vLen[slot]);
    this.flags[slot] &= ~HAS_DIGEST;
    this.writeValue(slot, bytes);
  }

  release(slot: number): void {
    this.unindex(slot);
    this.dead(this.vLen[slot] + this.pLen[slot]);
    this.vLen[slot] = this.pLen[slot] = 0;
    this.flags[slot] = 0;
    this.free.push(slot);
    this.count--;
  }

  live(slot: number): boolean {
    return (this.flags[slot] & LIVE) !== 0;
  }

  setOf(slot: number): LocalSet {
    return this.set[slot];
  }

  path(slot: number): string {
    return this.chunks[this.pChunk[slot]].toString('utf8', this.pOff[slot], this.pOff[slot] + this.pLen[slot]);
  }

  /** a view of the slot's value: valid until the next change */
  value(slot: number): Uint8Array {
    const o = this.vOff[slot];
    return this.chunks[this.vChunk[slot]].subarray(o, o + this.vLen[slot]);
  }

  equals(slot: number, bytes: Uint8Array): boolean {
    return this.vLen[slot] === bytes.length && bytesEqual(this.value(slot), bytes);
  }

  digest(slot: number, compute: () => [number, number]): [number, number] {
    if (!(this.flags[slot] & HAS_DIGEST)) {
      const [lo, hi] = compute();
      this.digestLo[slot] = lo;
      this.digestHi[slot] = hi;
      this.flags[slot] |= HAS_DIGEST;
    }
    return [this.digestLo[slot], this.digestHi[slot]];
  }

  serviceHash(slot: number, compute: () => number): number {
    if (!(this.flags[slot] & HAS_HASH)) {
      this.hash[slot] = compute();
      this.flags[slot] |= HAS_HASH;
    }
    return this.hash[slot];
  }

  /** bytes in chunks (for tests and stats) */
  get bytes(): { live: number; dead: number; chunks: number } {
    return { live: this.liveBytes, dead: this.deadBytes, chunks: this.chunks.length };
  }

  private grow(): number {
    const n = this.next++;
    if (n === this.flags.length) {
      const more = <T extends Uint32Array | Uint8Array>(a: T): T => {
        const b = new (a.constructor as new (n: number) => T)(a.length * 2);
        b.set(a);
        return b;
      };
      this.pChunk = more(this.pChunk);
      this.pOff = more(this.pOff);
      this.pLen = more(this.pLen);
      this.vChunk = more(this.vChunk);
      this.vOff = more(this.vOff);
      this.vLen = more(this.vLen);
      this.keyHash = more(this.keyHash);
      this.digestLo = more(this.digestLo);
      this.digestHi = more(this.digestHi);
      this.hash = more(this.hash);
      this.set = more(this.set);
      this.flags = more(this.flags);
    }
    return n;
  }

  private insert(slot: number, h: number): void {
    const mask = this.index.length - 1;
    let i = h & mask;
    while (this.index[i]) i = (i + 1) & mask;
    this.index[i] = slot + 1;
  }

  private rehash(capacity: number): void {
    this.index = new Int32Array(capacity);
    for (let s = 0; s < this.next; s++) if (this.flags[s] & LIVE) this.insert(s, this.keyHash[s]);
  }

  /** linear probing's deletion: the entries after it move back over the hole */
  private unindex(slot: number): void {
    const mask = this.index.length - 1;
    let i = this.keyHash[slot] & mask;
    while (this.index[i] !== slot + 1) i = (i + 1) & mask;
    for (let j = (i + 1) & mask; this.index[j]; j = (j + 1) & mask) {
      const home = this.keyHash[this.index[j] - 1] & mask;
      // j's entry may fill the hole at i unless its home lies cyclically in (i, j]
      if (i <= j ? home <= i || home > j : home <= i && home > j) {
        this.index[i] = this.index[j];
        i = j;
      }
    }
    this.index[i] = 0;
  }

  private dead(n: number): void {
    this.liveBytes -= n;
    this.deadBytes += n;
  }

  private writeValue(slot: number, bytes: Uint8Array): void {
    this.vLen[slot] = bytes.length;
    [this.vChunk[slot], this.vOff[slot]] = this.place(bytes);
    if (this.deadBytes > MIN_GARBAGE && this.deadBytes > this.liveBytes) this.compact();
  }

  /** copies bytes into a chunk: [chunk, offset] */
  private place(bytes: Uint8Array): [number, number] {
    const n = bytes.length;
    this.liveBytes += n;
    if (n > BIG_BYTES) {
      this.chunks.push(Buffer.from(bytes));
      return [this.chunks.length - 1, 0];
    }
    if (this.pos + n > CHUNK_BYTES) {
      // allocUnsafeSlow: outside Buffer's shared pool, whose slabs small buffers elsewhere would pin
      this.chunks.push(Buffer.allocUnsafeSlow(CHUNK_BYTES));
      this.pos = 0;
    }
    const c = this.chunks.length - 1;
    this.chunks[c].set(bytes, this.pos);
    this.pos += n;
    return [c, this.pos - n];
  }

  /** copies the live paths and values into new chunks (slot numbers stay) */
  private compact(): void {
    const old = this.chunks;
    this.chunks = [];
    this.pos = CHUNK_BYTES;
    this.liveBytes = this.deadBytes = 0;
    for (let s = 0; s < this.next; s++) {
      if (!(this.flags[s] & LIVE)) continue;
      [this.pChunk[s], this.pOff[s]] = this.place(old[this.pChunk[s]].subarray(this.pOff[s], this.pOff[s] + this.pLen[s]));
      [this.vChunk[s], this.vOff[s]] = this.place(old[this.vChunk[s]].subarray(this.vOff[s], this.vOff[s] + this.vLen[s]));
    }
  }
}

/** FNV-1a of the set and the path's UTF-16 code units: the index's hash, not the wire's */
function keyHashOf(set: LocalSet, path: string): number {
  let h = Math.imul(0x811c9dc5 ^ set, 0x01000193);
  for (let i = 0; i < path.length; i++) h = Math.imul(h ^ path.charCodeAt(i), 0x01000193);
  return h >>> 0;
}

/** deletes after a resend: endpoints first, services last (kpng's order) */
const rank = (set: LocalSet) => (set === LocalSet.EndpointsSet ? 0 : set === LocalSet.ServicesSet ? 1 : 2);

/**
 * The reset filter's state: what is held (table) and, during a resend, what
 * it brought again. Synchronous: the receiver forwards what it says is news
 * (see FilterResetSink.send for the order of the calls).
 */
export class ResetFilter {
  readonly table = new EntryTable();
  /** ServicesSet entries held (a resume's bucket count follows it) */
  services = 0;
  /** during a resend: the slots it set again (stale at its Sync otherwise) */
  private seen?: Uint8Array;
  /** during a Resume: whether a held entry is in a resent bucket */
  private inScope?: (slot: number) => boolean;
  private resets = 0;

  /** whether a Reset was received yet (before, nothing is held) */
  get started(): boolean {
    return this.resets > 0;
  }

  /**
   * A Reset: true for the very first, which the receiver forwards (it
   * starts from nothing); any later one begins a resend, of everything or,
   * with inScope (a Resume), of the held entries it says.
   */
  reset(inScope?: (slot: number) => boolean): boolean {
    this.seen = new Uint8Array(this.table.slots);
    this.inScope = inScope;
    return ++this.resets === 1;
  }

  /** A Set of (set, path): the slot that holds it, if any, noted as sent again. */
  saw(set: LocalSet, path: string): number | undefined {
    const slot = this.table.find(set, path);
    if (slot !== undefined && slot < (this.seen?.length ?? 0)) this.seen![slot] = 1;
    return slot;
  }

  /** whether a Set's bytes are news: not held (slot undefined), or held with other bytes */
  isNews(slot: number | undefined, bytes: Uint8Array): boolean {
    return slot === undefined || !this.table.equals(slot, bytes);
  }

  /** Holds a Set's value: in its slot (from saw), or in a new one (returned). */
  hold(slot: number | undefined, set: LocalSet, path: string, bytes: Uint8Array): number {
    if (slot !== undefined) {
      this.table.replace(slot, bytes);
      return slot;
    }
    // a new slot is past seen's end, or a freed one set to 1: not stale either way
    const s = this.table.add(set, path, bytes);
    if (s < (this.seen?.length ?? 0)) this.seen![s] = 1;
    if (set === LocalSet.ServicesSet) this.services++;
    return s;
  }

  /** Lets a held entry go (a Delete, or stale). */
  release(slot: number): void {
    if (this.table.setOf(slot) === LocalSet.ServicesSet) this.services--;
    this.table.release(slot);
  }

  /**
   * A Sync: ends the resend, if one is going on, with what it did not bring
   * again (within its scope) and is still held, in kpng's order of deletes.
   * The caller releases each (find it again: it may be gone meanwhile).
   */
  stale(): [LocalSet, string][] {
    const seen = this.seen;
    if (!seen) return [];
    const t = this.table;
    const inScope = this.inScope;
    const out: [LocalSet, string][] = [];
    // slots past seen's end came with this resend
    for (let s = 0; s < seen.length; s++) {
      if (t.live(s) && !seen[s] && (!inScope || inScope(s))) out.push([t.setOf(s), t.path(s)]);
    }
    out.sort(([a], [b]) => rank(a) - rank(b));
    this.seen = undefined;
    this.inScope = undefined;
    return out;
  }
}
