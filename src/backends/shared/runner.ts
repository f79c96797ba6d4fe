// One sync loop for every backend, after upstream's BoundedFrequencyRunner:
// one sync at a time; at least minInterval from the end of one sync to the
// start of the next (changes meanwhile coalesce into it); after a failure, a
// retry with jittered exponential backoff (a change arriving meanwhile waits
// for it); and every period, a reconcile that asks the backend whether its
// dataplane drifted and repairs it. The clock is injected, for tests.
//
// The period runs from the last check (a reconcile, or a sync that read the
// dataplane back whole), not from the last sync: under steady churn a change
// is always waiting, and a check that waited for a quiet moment would never
// come. An overdue check goes before a waiting change; one that finds nothing
// costs the change no minInterval.
//
// A sync due as soon as the last one ends starts from a timer, never from the
// last one's continuation: with periods shorter than the clock's resolution
// (syncPeriod 1ns) every next run is due at once, and starting it in the same
// chain of promises would never give the event loop back (no signal, no log
// line, no health probe would get through).
import { backoffDelay } from '../../runtime/backoff.js';

export interface Clock {
  now(): number;
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

export const systemClock: Clock = {
  now: () => Date.now(),
  setTimeout: (fn, ms) => {
    const t = setTimeout(fn, ms);
    t.unref?.();
    return t;
  },
  clearTimeout: (h) => clearTimeout(h as NodeJS.Timeout),
};

/** why a sync ran */
export type SyncReason = 'change' | 'retry' | 'reconcile';

/** What one sync did, for its caller, health and metrics. */
export interface SyncResult {
  readonly ok: boolean;
  /** the dataplane was read back and compared whole (start-up, after a failure, a drift repair) */
  readonly full: boolean;
  /** some Services were left out (the dataplane refused them); the rest is applied */
  readonly partial: boolean;
  readonly reason: SyncReason;
  readonly durationMs: number;
  /** dataplane objects added, changed or removed (elements, rules, chains) */
  readonly changes: number;
  /** the Services left out ("ns/name"), each logged once with why */
  readonly skipped: readonly string[];
  /** a reconcile found the dataplane changed by someone else, and repaired it */
  readonly repaired: boolean;
  /** why it failed */
  readonly error?: string;
  /** when it ended (clock ms) */
  readonly endedAt: number;
}

export interface SyncRunnerOptions {
  /** at least this long from the end of one sync to the start of the next */
  readonly minIntervalMs: number;
  /** a reconcile this long after the last check (a reconcile, or a full sync) ended; 0: none */
  readonly periodMs: number;
  /** retry after a failure (default true; false: a failed sync waits for the next request) */
  readonly retries?: boolean;
  /** the first retry after a failure (default 1 s); doubling up to retryMaxMs */
  readonly retryMinMs?: number;
  /** the longest retry delay (default: periodMs, or 30 s) */
  readonly retryMaxMs?: number;
  readonly clock?: Clock;
  /** [0, 1) for the jitter */
  readonly random?: () => number;
  /** applies what changed */
  sync(reason: 'change' | 'retry'): Promise<SyncResult>;
  /** the periodic check: undefined when nothing drifted (nothing was done), or the repair's result */
  reconcile?(): Promise<SyncResult | undefined>;
  /** every result, whoever asked for the sync */
  onResult?(r: SyncResult): void;
}

export class SyncRunner {
  private readonly clock: Clock;
  private running?: Promise<unknown>;
  /** callers waiting for the next sync */
  private waiters: { resolve: (r: SyncResult) => void; reject: (e: unknown) => void }[] = [];
  private timer?: unknown;
  private timerAt = 0;
  private lastEnd = -Infinity;
  /** when the dataplane was last checked: a reconcile, a full sync, or the first sync */
  private lastCheck = -Infinity;
  private failuresInRow = 0;
  /** no sync before this (a failure's backoff) */
  private retryAt = 0;
  private closed = false;

  constructor(private readonly o: SyncRunnerOptions) {
    this.clock = o.clock ?? systemClock;
  }

  /** failed syncs since the last good one */
  get failures(): number {
    return this.failuresInRow;
  }

  /** a sync (or the periodic check) is running */
  get busy(): boolean {
    return this.running !== undefined;
  }

  /**
   * Something changed: resolves with the result of the sync that applied it,
   * which starts as soon as minInterval (and a failure's backoff) allow.
   */
  request(): Promise<SyncResult> {
    return new Promise((resolve, reject) => {
      if (this.closed) return reject(new Error('sync runner closed'));
      this.waiters.push({ resolve, reject });
      this.schedule();
    });
  }

  /** No more syncs; waits for the one running. */
  async close(): Promise<void> {
    this.closed = true;
    this.clearTimer();
    for (const w of this.waiters.splice(0)) w.reject(new Error('sync runner closed'));
    await this.running?.catch(() => {});
  }

  /** when the next sync or reconcile is due, and which */
  private next(): { at: number; what: 'sync' | 'retry' | 'reconcile' } | undefined {
    const earliest = Math.max(this.lastEnd + this.o.minIntervalMs, this.retryAt);
    const checkAt = this.o.periodMs > 0 && this.o.reconcile && Number.isFinite(this.lastCheck) && !this.failuresInRow ? this.lastCheck + this.o.periodMs : Infinity;
    if (this.waiters.length) {
      if (checkAt <= this.clock.now()) return { at: checkAt, what: 'reconcile' };
      return { at: earliest, what: this.failuresInRow ? 'retry' : 'sync' };
    }
    if (this.failuresInRow && this.o.retries !== false) return { at: earliest, what: 'retry' };
    if (Number.isFinite(checkAt)) return { at: checkAt, what: 'reconcile' };
    return undefined;
  }

  /** afterRun: called as a run ends (a run due now waits for a timer, so the event loop turns) */
  private schedule(afterRun = false): void {
    if (this.closed || this.running) return;
    const n = this.next();
    if (!n) return this.clearTimer();
    const delay = Math.max(0, n.at - this.clock.now());
    if (delay === 0 && !afterRun) {
      this.clearTimer();
      this.run(n.what);
      return;
    }
    if (this.timer !== undefined && this.timerAt === n.at) return;
    this.clearTimer();
    this.timerAt = n.at;
    this.timer = this.clock.setTimeout(() => {
      this.timer = undefined;
      this.schedule();
    }, delay);
  }

  private clearTimer(): void {
    if (this.timer !== undefined) this.clock.clearTimeout(this.timer);
    this.timer = undefined;
  }

  private run(what: 'sync' | 'retry' | 'reconcile'): void {
    // a check that goes before a waiting change leaves it waiting
    const waiters = what === 'reconcile' ? [] : this.waiters.splice(0);
    const work = async (): Promise<SyncResult | undefined> => (what === 'reconcile' ? this.o.reconcile!() : this.o.sync(what === 'retry' ? 'retry' : 'change'));
    const p = work().then(
      (r) => {
        if (what === 'reconcile') this.lastCheck = this.clock.now(); // the next check in a period
        if (r) this.done(r); // (a reconcile that found nothing wrote nothing: no minInterval for the next sync)
        for (const w of waiters) w.resolve(r!); // a reconcile (no result when it did nothing) has no waiters
      },
      (e) => {
        this.done(undefined);
        for (const w of waiters) w.reject(e);
      },
    );
    this.running = p.finally(() => {
      this.running = undefined;
      this.schedule(true);
    });
  }

  private done(r: SyncResult | undefined): void {
    this.lastEnd = this.clock.now();
    // a full sync read the dataplane back: as good as a check; the first sync starts the period
    if (r?.ok && (r.full || !Number.isFinite(this.lastCheck))) this.lastCheck = this.lastEnd;
    if (r?.ok) {
      this.failuresInRow = 0;
      this.retryAt = 0;
    } else {
      this.failuresInRow++;
      const max = this.o.retryMaxMs ?? (this.o.periodMs || 30_000);
      this.retryAt = this.lastEnd + backoffDelay(this.failuresInRow - 1, this.o.retryMinMs ?? 1000, max, this.o.random);
    }
    if (r) this.o.onResult?.(r);
  }
}
