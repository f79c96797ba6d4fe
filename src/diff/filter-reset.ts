// Makes a Reset invisible to the sink behind it, as kpng's filterreset does:
// after a reconnect the server resends everything, and this turns the resend
// into the minimal set of changes (unchanged Sets dropped, vanished paths
// deleted at the next Sync), so a backend never sees a flush and refill. The
// filter itself is api/reset-filter.ts; this is it as a sink of the diff
// stream.
//
// kpng-ts resume: it also knows what it holds as bucket digests
// (heldDigests, sent in a new stream's first request), and a Reset that is a
// Resume resends only some buckets: only what it held in those and did not
// get again is deleted at the Sync.
import { LocalSet } from '../api/model.js';
import { ResetFilter } from '../api/reset-filter.js';
import type { LocalOp, LocalSink } from './ops.js';
import { BucketDigests, bucketCountFor, bucketOf, entryDigest, keyHash, serviceKeyOf } from './resume.js';

const RESET: LocalOp = { kind: 'reset' };

export class FilterResetSink implements LocalSink {
  protected readonly filter = new ResetFilter();

  constructor(protected readonly next: LocalSink) {}

  /**
   * What is held of ServicesSet and EndpointsSet as HeldDigests; empty when
   * nothing was received yet (a first stream asks for the full state).
   */
  heldDigests(): Uint8Array {
    const f = this.filter;
    if (!f.started) return new Uint8Array(0);
    const t = f.table;
    const d = new BucketDigests(bucketCountFor(f.services));
    for (let s = 0; s < t.slots; s++) {
      const h = t.live(s) ? this.hashOf(s) : undefined;
      if (h === undefined) continue;
      d.add(bucketOf(h, d.buckets), t.digest(s, () => entryDigest(t.setOf(s), t.path(s), t.value(s))));
    }
    return d.toBytes();
  }

  /** the key hash of a held entry's Service; undefined: in no bucket (a node, a ServiceCIDR) */
  private hashOf(slot: number): number | undefined {
    const t = this.filter.table;
    const set = t.setOf(slot);
    if (set !== LocalSet.ServicesSet && set !== LocalSet.EndpointsSet) return undefined;
    return t.serviceHash(slot, () => keyHash(serviceKeyOf(set, t.path(slot)) ?? ''));
  }

  /** during a Resume: whether a held entry is in a resent bucket (an entry in no bucket always is) */
  private resumeScope(resume: { readonly buckets: number; readonly resent: readonly number[] }): (slot: number) => boolean {
    const resent = new Set(resume.resent);
    return (slot) => {
      const h = this.hashOf(slot);
      return h === undefined || resent.has(bucketOf(h, resume.buckets));
    };
  }

  async send(op: LocalOp): Promise<void> {
    const f = this.filter;
    switch (op.kind) {
      case 'reset':
        if (f.reset(op.resume && this.resumeScope(op.resume))) await this.next.send(RESET);
        return;
      case 'set': {
        const slot = f.saw(op.set, op.path);
        if (!f.isNews(slot, op.bytes)) return;
        const r = this.forward(op, slot);
        const held = f.hold(slot, op.set, op.path, op.bytes);
        if (slot === undefined) this.added(held);
        await r;
        return;
      }
      case 'delete': {
        const slot = f.table.find(op.set, op.path);
        if (slot === undefined) return;
        this.forget(slot);
        await this.next.send(op);
        return;
      }
      case 'sync': {
        for (const [set, path] of f.stale()) {
          const slot = f.table.find(set, path);
          if (slot === undefined) continue;
          this.forget(slot);
          await this.next.send({ kind: 'delete', set, path });
        }
        await this.next.send(op);
        return;
      }
    }
  }

  /** A Set that is news goes on, before its slot holds the new value (which slot: undefined for a new one). */
  protected forward(op: Extract<LocalOp, { kind: 'set' }>, _slot: number | undefined): void | Promise<void> {
    return this.next.send(op);
  }

  /** a new slot now holds a Set that went on */
  protected added(_slot: number): void {}

  /** a held entry goes (a Delete, or stale after a resend) */
  protected forget(slot: number): void {
    this.filter.release(slot);
  }
}
