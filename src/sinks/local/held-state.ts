// What `kpng local` holds of its node, once: the reset filter (a resend after
// a reconnect becomes only what changed, and a resume's HeldDigests:
// FilterResetSink) and the state socket's answer both read it.
//
// A value the backend refused (ValidatingSink) is still what the filter
// knows (its resend is not news), but the state socket shows the last good
// one: those few are kept apart (refused).
//
// Each backend's proxier keeps its own decoded copy of what it programs
// (ProxierBase): its applied version of a Service while it holds a change
// back (isolation), and its own for each of several backends (to-local
// to-ebpf to-nft). That is not the stream's state, so it cannot stand in
// for this one, nor this for it.
import { LocalSet } from '../../api/model.js';
import { FilterResetSink } from '../../diff/filter-reset.js';
import type { LocalOp, LocalSink } from '../../diff/ops.js';

/**
 * The node's state as received, as a sink: turns a Reset (after the first)
 * into only what changed, as kpng's filterreset does. Put `backend()` right
 * in front of the backend, behind ValidatingSink, to learn which Sets the
 * backend took; entries() then gives what it holds.
 */
export class HeldState extends FilterResetSink {
  /** slots whose value the backend refused: the last good one it holds (a copy), or null when none */
  private readonly refused = new Map<number, Uint8Array | null>();
  private tracking = false;
  private took = false;

  /**
   * Wraps the backend's sink; Sets that do not reach it were refused. The
   * sinks in between forward or drop an op before they return (ValidatingSink).
   */
  backend(inner: LocalSink): LocalSink {
    this.tracking = true;
    return { send: (op) => ((this.took = true), inner.send(op)) };
  }

  /** what the backend holds of a set, paths in no order (the bytes are views valid until the next op) */
  *entries(set: LocalSet): Generator<[string, Uint8Array]> {
    const t = this.filter.table;
    for (let s = 0; s < t.slots; s++) {
      if (!t.live(s) || t.setOf(s) !== set) continue;
      const r = this.refused.get(s);
      if (r === null) continue;
      yield [t.path(s), r ?? t.value(s)];
    }
  }

  /** bytes in chunks (for tests) */
  get stored(): { live: number; dead: number; chunks: number } {
    return this.filter.table.bytes;
  }

  /** after the Set of a held slot went down: whether the backend took it, and so what it holds */
  protected override forward(op: Extract<LocalOp, { kind: 'set' }>, slot: number | undefined): void | Promise<void> {
    this.took = false;
    const r = this.next.send(op);
    if (this.tracking && slot !== undefined) {
      if (this.took) this.refused.delete(slot);
      // the slot still holds the last good one
      else if (!this.refused.has(slot)) this.refused.set(slot, Buffer.from(this.filter.table.value(slot)));
    }
    return r;
  }

  protected override added(slot: number): void {
    if (this.tracking && !this.took) this.refused.set(slot, null);
  }

  protected override forget(slot: number): void {
    super.forget(slot);
    this.refused.delete(slot);
  }
}
