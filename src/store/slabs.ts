// Byte strings packed into shared slabs: an ArrayBuffer of its own per
// stored slice costs as much again as the bytes themselves (a Uint8Array,
// an ArrayBuffer and V8's native bookkeeping for each;
// docs/design/slabs.md). A record keeps its slab and where its bytes start;
// a read is a subarray.
//
// A slab is only ever appended to: bytes once written never change, so a
// subarray a caller got stays right for as long as it keeps it. Space a
// record gave up is counted per slab; compaction copies the records of
// mostly-dead slabs to the current one, and the old slab goes when nothing
// views it any more.

/** a shared slab's size: large enough that its own overhead is nothing, small enough that its unused tail is (calloc'd pages not touched are not resident) */
export const SLAB_SIZE = 256 * 1024;
/** bytes this long or longer get a slab of their own (nothing to compact there) */
const OWN_SLAB = SLAB_SIZE / 4;

export class Slab {
  readonly buf: Uint8Array;
  /** bytes written: the next record goes here */
  used = 0;
  /** bytes of the records still stored here */
  live = 0;
  constructor(size: number) {
    this.buf = new Uint8Array(size);
  }
}

/** Where a record's bytes are; Slabs moves them (compaction) by setting these. */
export interface SlabRef {
  slab: Slab;
  off: number;
  readonly len: number;
}

export class Slabs {
  private cur: Slab | undefined;
  /** bytes of the records held */
  private liveBytes = 0;
  /** bytes written into slabs still holding a record (or the current one) */
  private heldBytes = 0;
  /** compact when the dead bytes exceed this */
  private compactAt = SLAB_SIZE;

  /** counts for tests */
  get live(): number { return this.liveBytes; }
  get held(): number { return this.heldBytes; }

  /** Copies bytes into a slab; the record is held (counted live) from now. */
  put(bytes: Uint8Array): { slab: Slab; off: number } {
    const len = bytes.length;
    let slab: Slab;
    if (len >= OWN_SLAB) {
      slab = new Slab(len);
      this.heldBytes += len;
    } else {
      if (!this.cur || this.cur.used + len > this.cur.buf.length) {
        const old = this.cur;
        this.cur = new Slab(SLAB_SIZE);
        // the old one stays counted only while it holds a record
        if (old && old.live === 0) this.heldBytes -= old.used;
      }
      slab = this.cur;
      this.heldBytes += len;
    }
    const off = slab.used;
    slab.buf.set(bytes, off);
    slab.used += len;
    slab.live += len;
    this.liveBytes += len;
    return { slab, off };
  }

  /** A record gives its bytes up (deleted or replaced); they stay as they are for whoever views them. */
  release(r: SlabRef): void {
    r.slab.live -= r.len;
    this.liveBytes -= r.len;
    if (r.slab.live === 0 && r.slab !== this.cur) this.heldBytes -= r.slab.used;
  }

  /** A released record back (a batch undone): its slab was not written over (nothing ever is). */
  rehold(r: SlabRef): void {
    if (r.slab.live === 0 && r.slab !== this.cur) this.heldBytes += r.slab.used;
    r.slab.live += r.len;
    this.liveBytes += r.len;
  }

  /** whether dead bytes have grown enough since the last compaction to pay for one (a walk over every record) */
  get wantsCompaction(): boolean {
    return this.heldBytes - this.liveBytes > this.compactAt;
  }

  /**
   * Moves the records of slabs at least a quarter dead to the current slab:
   * what stays is at most a third dead, and the copying is at most three
   * times the space it frees. The next compaction waits for a quarter of the
   * live bytes (or a slab) more dead, so walks over the records are paid
   * for by what they free: held bytes stay within 1.6 times the live ones.
   */
  compact(records: Iterable<SlabRef>): void {
    for (const r of records) {
      const s = r.slab;
      if (s === this.cur || s.live * 4 > s.used * 3) continue;
      const bytes = s.buf.subarray(r.off, r.off + r.len);
      this.release(r);
      const at = this.put(bytes);
      r.slab = at.slab;
      r.off = at.off;
    }
    this.compactAt = this.heldBytes - this.liveBytes + Math.max(this.liveBytes / 4, SLAB_SIZE);
  }
}
