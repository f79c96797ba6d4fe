// A clock for the sync runner that moves only when a test says so.
import type { Clock } from '../../src/backends/shared/runner.js';

/** a clock that moves only when told */
export class ManualClock implements Clock {
  t = 1_000_000;
  private timers: { at: number; fn: () => void; id: number }[] = [];
  private ids = 0;
  now = () => this.t;
  setTimeout = (fn: () => void, ms: number) => {
    const id = ++this.ids;
    this.timers.push({ at: this.t + ms, fn, id });
    return id;
  };
  clearTimeout = (h: unknown) => {
    this.timers = this.timers.filter((x) => x.id !== h);
  };
  /** moves time forward, running the timers due (and what they start) */
  async advance(ms: number): Promise<void> {
    const end = this.t + ms;
    for (;;) {
      await settle();
      const due = this.timers.filter((x) => x.at <= end).sort((a, b) => a.at - b.at)[0];
      if (!due) break;
      this.timers = this.timers.filter((x) => x !== due);
      this.t = Math.max(this.t, due.at);
      due.fn();
    }
    this.t = Math.max(this.t, end);
    await settle();
  }
  get pending(): number {
    return this.timers.length;
  }
}

export const settle = async () => {
  for (let i = 0; i < 20; i++) await Promise.resolve();
};

