// The reset filter in its plainest form (a Map of what is held), as the
// reference the compact one (src/api/reset-filter.ts, behind FilterResetSink
// and HeldState) is checked against: the same ops out, the same resume
// digests.
import { LocalSet, bytesEqual } from '../../src/api/model.js';
import type { LocalOp, LocalSink } from '../../src/diff/ops.js';
import { BucketDigests, bucketCountFor, bucketOf, entryDigest, keyHash, serviceKeyOf } from '../../src/diff/resume.js';

interface Held {
  readonly set: LocalSet;
  readonly bytes: Uint8Array;
  /** computed when first asked for (heldDigests), kept while the value stays */
  digest?: [number, number];
  /** the key hash of its service; undefined: in no bucket (a node, a ServiceCIDR) */
  hash?: number;
}

export class ReferenceResetFilter implements LocalSink {
  private readonly known = new Map<string, Held>();
  private seen?: Set<string>;
  /** during a Resume: whether a held entry is in a resent bucket */
  private inScope?: (k: string, v: Held) => boolean;
  private started = false;

  constructor(private readonly next: LocalSink) {}

  /**
   * What is held of ServicesSet and EndpointsSet as HeldDigests; empty when
   * nothing was received yet (a first stream asks for the full state).
   */
  heldDigests(): Uint8Array {
    if (!this.started) return new Uint8Array(0);
    let services = 0;
    for (const v of this.known.values()) if (v.set === LocalSet.ServicesSet) services++;
    const d = new BucketDigests(bucketCountFor(services));
    for (const [k, v] of this.known) {
      const h = this.hashOf(k, v);
      if (h === undefined) continue;
      d.add(bucketOf(h, d.buckets), (v.digest ??= entryDigest(v.set, pathOf(k), v.bytes)));
    }
    return d.toBytes();
  }

  private hashOf(k: string, v: Held): number | undefined {
    if (v.hash !== undefined) return v.hash;
    const key = serviceKeyOf(v.set, pathOf(k));
    return key === undefined ? undefined : (v.hash = keyHash(key));
  }

  async send(op: LocalOp): Promise<void> {
    const id = (set: LocalSet, path: string) => `${set}\0${path}`;
    switch (op.kind) {
      case 'reset':
        // the very first Reset goes through: the sink starts from nothing
        if (!this.started) {
          this.started = true;
          await this.next.send({ kind: 'reset' });
        }
        this.seen = new Set();
        this.inScope = undefined;
        if (op.resume) {
          const { buckets } = op.resume;
          const resent = new Set(op.resume.resent);
          this.inScope = (k, v) => {
            const h = this.hashOf(k, v);
            return h === undefined || resent.has(bucketOf(h, buckets));
          };
        }
        return;
      case 'set': {
        const k = id(op.set, op.path);
        this.seen?.add(k);
        const prev = this.known.get(k);
        if (prev && bytesEqual(prev.bytes, op.bytes)) return;
        this.known.set(k, { set: op.set, bytes: op.bytes, hash: prev?.hash });
        await this.next.send(op);
        return;
      }
      case 'delete': {
        const k = id(op.set, op.path);
        if (!this.known.delete(k)) return;
        await this.next.send(op);
        return;
      }
      case 'sync': {
        if (this.seen) {
          // endpoints first, services last: kpng's order for deletes
          const inScope = this.inScope;
          const stale = [...this.known.entries()].filter(([k, v]) => !this.seen!.has(k) && (!inScope || inScope(k, v)));
          stale.sort(([, a], [, b]) => rank(a.set) - rank(b.set));
          for (const [k, v] of stale) {
            this.known.delete(k);
            await this.next.send({ kind: 'delete', set: v.set, path: pathOf(k) });
          }
          this.seen = undefined;
          this.inScope = undefined;
        }
        await this.next.send(op);
        return;
      }
    }
  }
}

const pathOf = (k: string) => k.slice(k.indexOf('\0') + 1);

function rank(set: LocalSet): number {
  return set === LocalSet.EndpointsSet ? 0 : set === LocalSet.ServicesSet ? 1 : 2;
}
