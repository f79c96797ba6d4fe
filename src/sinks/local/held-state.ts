// What `kpng local` holds of its node, once: the reset filter (a resend after
// a reconnect becomes only what changed, and a resume's HeldDigests) and the
// state socket's answer both read it. Values are copied into a few large
// chunks: keeping the received op.bytes (views into gRPC message buffers,
// one JS object each) held whole buffers and cost more than the bytes.
//
// A value the backend refused (ValidatingSink) is still what the filter
// knows (its resend is not news), but the state socket shows the last good
// one: those few are kept apart (refused).
import { LocalSet, bytesEqual } from '../../api/model.js';
import type { LocalOp, LocalSink } from '../../diff/ops.js';
import { BucketDigests, bucketCountFor, bucketOf, entryDigest, keyHash, serviceKeyOf } from '../../diff/resume.js';

const CHUNK_BYTES = 256 << 10;
/** a value above this gets a chunk of its own (a chunk's tail is not wasted on it) */
const BIG_BYTES = CHUNK_BYTES >> 2;
/** compaction once dead bytes pass both the live ones and this */
const MIN_GARBAGE = 1 << 20;

const HAS_DIGEST = 1;
const HAS_HASH = 2;

/** Byte values in shared chunks, by slot number; a slot keeps its number while it lives. */
export class ByteSlots {
  private chunks: Buffer[] = [];
  private pos = CHUNK_BYTES; // no current chunk yet
  private chunk = new Uint32Array(1024);
  private off = new Uint32Array(1024);
  private len = new Uint32Array(1024);
  /** the resume digest of the value and the key hash of its service, cached */
  private digestLo = new Uint32Array(1024);
  private digestHi = new Uint32Array(1024);
  private hash = new Uint32Array(1024);
  private flags = new Uint8Array(1024);
  private next = 0;
  private readonly free: number[] = [];
  private liveBytes = 0;
  private deadBytes = 0;

  add(bytes: Uint8Array): number {
    const slot = this.free.pop() ?? this.grow();
    this.flags[slot] = 0;
    this.write(slot, bytes);
    return slot;
  }

  /** a new value in the slot (its service, and so its key hash, stays) */
  replace(slot: number, bytes: Uint8Array): void {
    this.drop(slot);
    this.flags[slot] &= ~HAS_DIGEST;
    this.write(slot, bytes);
  }

  release(slot: number): void {
    this.drop(slot);
    this.flags[slot] = 0;
    this.free.push(slot);
  }

  /** a view of the slot's value: valid until the next change */
  get(slot: number): Uint8Array {
    const o = this.off[slot];
    return this.chunks[this.chunk[slot]].subarray(o, o + this.len[slot]);
  }

  equals(slot: number, bytes: Uint8Array): boolean {
    return this.len[slot] === bytes.length && bytesEqual(this.get(slot), bytes);
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

  keyHash(slot: number, compute: () => number): number {
    if (!(this.flags[slot] & HAS_HASH)) {
      this.hash[slot] = compute();
      this.flags[slot] |= HAS_HASH;
    }
    return this.hash[slot];
  }

  clear(): void {
    this.chunks = [];
    this.pos = CHUNK_BYTES;
    this.next = 0;
    this.free.length = 0;
    this.liveBytes = this.deadBytes = 0;
  }

  /** bytes in chunks (for tests and stats) */
  get size(): { live: number; dead: number; chunks: number } {
    return { live: this.liveBytes, dead: this.deadBytes, chunks: this.chunks.length };
  }

  private grow(): number {
    const n = this.next++;
    if (n === this.len.length) {
      const more = <T extends Uint32Array | Uint8Array>(a: T): T => {
        const b = new (a.constructor as new (n: number) => T)(a.length * 2);
        b.set(a);
        return b;
      };
      this.chunk = more(this.chunk);
      this.off = more(this.off);
      this.len = more(this.len);
      this.digestLo = more(this.digestLo);
      this.digestHi = more(this.digestHi);
      this.hash = more(this.hash);
      this.flags = more(this.flags);
    }
    return n;
  }

  private drop(slot: number): void {
    this.liveBytes -= this.len[slot];
    this.deadBytes += this.len[slot];
    this.len[slot] = 0;
  }

  private write(slot: number, bytes: Uint8Array): void {
    const n = bytes.length;
    this.len[slot] = n;
    this.liveBytes += n;
    if (n > BIG_BYTES) {
      this.chunks.push(Buffer.from(bytes));
      this.chunk[slot] = this.chunks.length - 1;
      this.off[slot] = 0;
    } else {
      if (this.pos + n > CHUNK_BYTES) {
        // allocUnsafeSlow: outside Buffer's shared pool, whose slabs small buffers elsewhere would pin
        this.chunks.push(Buffer.allocUnsafeSlow(CHUNK_BYTES));
        this.pos = 0;
      }
      const c = this.chunks.length - 1;
      this.chunks[c].set(bytes, this.pos);
      this.chunk[slot] = c;
      this.off[slot] = this.pos;
      this.pos += n;
    }
    if (this.deadBytes > MIN_GARBAGE && this.deadBytes > this.liveBytes) this.compact();
  }

  /** copies the live values into new chunks (slot numbers stay) */
  private compact(): void {
    const old = this.chunks;
    const live = new Set(Array.from({ length: this.next }, (_, i) => i));
    for (const f of this.free) live.delete(f);
    this.chunks = [];
    this.pos = CHUNK_BYTES;
    this.liveBytes = this.deadBytes = 0;
    for (const slot of live) {
      const o = this.off[slot];
      this.write(slot, old[this.chunk[slot]].subarray(o, o + this.len[slot]));
    }
  }
}

/** deletes after a resend: endpoints first, services last (kpng's order) */
const rank = (set: LocalSet) => (set === LocalSet.EndpointsSet ? 0 : set === LocalSet.ServicesSet ? 1 : 2);

/**
 * The node's state as received, as a sink: turns a Reset (after the first)
 * into only what changed, as kpng's filterreset does. Put `backend()` right
 * in front of the backend, behind ValidatingSink, to learn which Sets the
 * backend took; entries() then gives what it holds.
 */
export class HeldState implements LocalSink {
  private readonly sets = new Map<LocalSet, Map<string, number>>();
  private readonly bytes = new ByteSlots();
  /** values the backend refused: the last good one it holds (a copy), or null when none */
  private readonly refused = new Map<LocalSet, Map<string, Uint8Array | null>>();
  private seen?: Map<LocalSet, Set<string>>;
  /** during a Resume: whether a held entry is in a resent bucket */
  private inScope?: (set: LocalSet, path: string, slot: number) => boolean;
  private started = false;
  private tracking = false;
  private took = false;

  constructor(private readonly next: LocalSink) {}

  /**
   * Wraps the backend's sink; Sets that do not reach it were refused. The
   * sinks in between pass or drop an op before they return (ValidatingSink).
   */
  backend(inner: LocalSink): LocalSink {
    this.tracking = true;
    return { send: (op) => ((this.took = true), inner.send(op)) };
  }

  /** what the backend holds, set by set, paths in no order (the bytes are views valid until the next op) */
  *entries(set: LocalSet): Generator<[string, Uint8Array]> {
    const m = this.sets.get(set);
    if (!m) return;
    const refused = this.refused.get(set);
    for (const [path, slot] of m) {
      const r = refused?.get(path);
      if (r === null) continue;
      yield [path, r ?? this.bytes.get(slot)];
    }
  }

  /** bytes in chunks (for tests) */
  get stored(): { live: number; dead: number; chunks: number } {
    return this.bytes.size;
  }

  /**
   * What is held of ServicesSet and EndpointsSet as HeldDigests; empty when
   * nothing was received yet (a first stream asks for the full state).
   */
  heldDigests(): Uint8Array {
    if (!this.started) return new Uint8Array(0);
    const d = new BucketDigests(bucketCountFor(this.sets.get(LocalSet.ServicesSet)?.size ?? 0));
    for (const [set, m] of this.sets) {
      if (set !== LocalSet.ServicesSet && set !== LocalSet.EndpointsSet) continue;
      for (const [path, slot] of m) {
        d.add(bucketOf(this.hashOf(set, path, slot)!, d.buckets), this.bytes.digest(slot, () => entryDigest(set, path, this.bytes.get(slot))));
      }
    }
    return d.toBytes();
  }

  private hashOf(set: LocalSet, path: string, slot: number): number | undefined {
    const key = serviceKeyOf(set, path);
    return key === undefined ? undefined : this.bytes.keyHash(slot, () => keyHash(key));
  }

  async send(op: LocalOp): Promise<void> {
    switch (op.kind) {
      case 'reset':
        // the very first Reset goes through: the sink starts from nothing
        if (!this.started) {
          this.started = true;
          this.sets.clear();
          this.refused.clear();
          this.bytes.clear();
          await this.next.send({ kind: 'reset' });
        }
        this.seen = new Map();
        this.inScope = undefined;
        if (op.resume) {
          const { buckets } = op.resume;
          const resent = new Set(op.resume.resent);
          this.inScope = (set, path, slot) => {
            const h = this.hashOf(set, path, slot);
            return h === undefined || resent.has(bucketOf(h, buckets));
          };
        }
        return;
      case 'set': {
        if (this.seen) {
          let s = this.seen.get(op.set);
          if (!s) this.seen.set(op.set, (s = new Set()));
          s.add(op.path);
        }
        let m = this.sets.get(op.set);
        const slot = m?.get(op.path);
        if (slot !== undefined && this.bytes.equals(slot, op.bytes)) return;
        this.took = false;
        const r = this.next.send(op);
        if (this.tracking) this.noteTaken(op.set, op.path, slot);
        if (slot !== undefined) this.bytes.replace(slot, op.bytes);
        else {
          if (!m) this.sets.set(op.set, (m = new Map()));
          m.set(op.path, this.bytes.add(op.bytes));
        }
        await r;
        return;
      }
      case 'delete': {
        if (!this.forget(op.set, op.path)) return;
        await this.next.send(op);
        return;
      }
      case 'sync': {
        const seen = this.seen;
        if (seen) {
          const inScope = this.inScope;
          const stale: [LocalSet, string][] = [];
          for (const [set, m] of this.sets) {
            const s = seen.get(set);
            for (const [path, slot] of m) if (!s?.has(path) && (!inScope || inScope(set, path, slot))) stale.push([set, path]);
          }
          stale.sort(([a], [b]) => rank(a) - rank(b));
          this.seen = undefined;
          this.inScope = undefined;
          for (const [set, path] of stale) {
            this.forget(set, path);
            await this.next.send({ kind: 'delete', set, path });
          }
        }
        await this.next.send(op);
        return;
      }
    }
  }

  /** after a Set went down: whether the backend took it, and so what it holds of the path */
  private noteTaken(set: LocalSet, path: string, slot: number | undefined): void {
    let r = this.refused.get(set);
    if (this.took) {
      if (r?.delete(path) && !r.size) this.refused.delete(set);
      return;
    }
    if (r?.has(path)) return; // it still holds the last good one
    if (!r) this.refused.set(set, (r = new Map()));
    r.set(path, slot === undefined ? null : Buffer.from(this.bytes.get(slot)));
  }

  private forget(set: LocalSet, path: string): boolean {
    const m = this.sets.get(set);
    const slot = m?.get(path);
    if (slot === undefined) return false;
    m!.delete(path);
    this.bytes.release(slot);
    const r = this.refused.get(set);
    if (r?.delete(path) && !r.size) this.refused.delete(set);
    return true;
  }
}
