// What every diff stream shares: it follows the store, notes what each
// change touched, and wakes the one waiting for its next diff.
import type { Store, StoreChange } from '../store/store.js';

export abstract class StoreFollower {
  private readonly unsubscribe: () => void;
  private wake?: () => void;
  private closed = false;

  constructor(protected readonly store: Store) {
    this.unsubscribe = store.subscribe((c) => {
      this.note(c);
      this.wake?.();
    });
  }

  /** Records what a store change touched (runs inside the store's update: keep it cheap). */
  protected abstract note(c: StoreChange): void;

  /** Something may have changed since the last diff. */
  abstract get pending(): boolean;

  /** Resolves when a diff may be non-empty (or the stream is closed). */
  async changed(): Promise<void> {
    while (!this.closed && !(this.pending && this.store.allSynced)) {
      await new Promise<void>((r) => (this.wake = r));
      this.wake = undefined;
    }
  }

  /** Stops following the store; a waiting changed() resolves. */
  close(): void {
    this.closed = true;
    this.unsubscribe();
    this.wake?.();
  }
}
