// Makes a Reset invisible to the sink behind it, as kpng's filterreset does:
// after a reconnect the server resends everything, and this turns the resend
// into the minimal set of changes (unchanged Sets dropped, vanished paths
// deleted at the next Sync), so a backend never sees a flush and refill.
import { LocalSet, bytesEqual } from '../api/model.js';
import type { LocalOp, LocalSink } from './ops.js';

export class FilterResetSink implements LocalSink {
  private readonly known = new Map<string, { set: LocalSet; bytes: Uint8Array }>();
  private seen?: Set<string>;
  private started = false;

  constructor(private readonly next: LocalSink) {}

  async send(op: LocalOp): Promise<void> {
    const id = (set: LocalSet, path: string) => `${set}\0${path}`;
    switch (op.kind) {
      case 'reset':
        // the very first Reset goes through: the sink starts from nothing
        if (!this.started) {
          this.started = true;
          await this.next.send(op);
        }
        this.seen = new Set();
        return;
      case 'set': {
        const k = id(op.set, op.path);
        this.seen?.add(k);
        const prev = this.known.get(k);
        if (prev && bytesEqual(prev.bytes, op.bytes)) return;
        this.known.set(k, { set: op.set, bytes: op.bytes });
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
          const stale = [...this.known.entries()].filter(([k]) => !this.seen!.has(k));
          stale.sort(([, a], [, b]) => rank(a.set) - rank(b.set));
          for (const [k, v] of stale) {
            this.known.delete(k);
            await this.next.send({ kind: 'delete', set: v.set, path: k.slice(k.indexOf('\0') + 1) });
          }
          this.seen = undefined;
        }
        await this.next.send(op);
        return;
      }
    }
  }
}

function rank(set: LocalSet): number {
  return set === LocalSet.EndpointsSet ? 0 : set === LocalSet.ServicesSet ? 1 : 2;
}
