// trimMemory's steps and the event loop: a trim takes no further collection
// after one that stopped the event loop too long. In a file of its own: the
// other trims' later collections (their low-memory notifications, V8's
// memory reducer) would count here.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { PerformanceObserver, constants } from 'node:perf_hooks';
import { trimMemory } from '../../src/runtime/memory.js';

test('trimMemory takes no further step after a collection that paused the event loop longer than its limit, and gives back the young generation at once', async () => {
  // survivors first, then garbage on pages of its own: the first collection gives back far more than a step's minimum
  const keep = Array.from({ length: 500_000 }, (_, i) => ({ i, s: `k${i}` }));
  const burst = (tag: string) => Array.from({ length: 1_000_000 }, (_, i) => ({ i, s: `${tag}${i}` })).length;
  /** full collections in the trim's first 1.5 s: made by gc() (the trim's own steps), and others (the low-memory notification's) */
  const majors = async (maxStepPauseMs: number) => {
    const n = { steps: 0, other: 0 };
    const seen = new PerformanceObserver((l) => {
      for (const e of l.getEntries()) {
        const { kind, flags } = (e as unknown as { detail: { kind: number; flags: number } }).detail;
        if (kind === constants.NODE_PERFORMANCE_GC_MAJOR) n[flags & constants.NODE_PERFORMANCE_GC_FLAGS_FORCED ? 'steps' : 'other']++;
      }
    });
    seen.observe({ entryTypes: ['gc'] });
    // the young generation a minute after the steps, unless they were long
    const cancel = trimMemory(0, 60_000, maxStepPauseMs);
    await sleep(1500);
    cancel();
    seen.disconnect();
    return n;
  };
  assert.ok(burst('x'));
  // every collection takes longer than 0 ms: the first is the last, and the low-memory notification follows it at once
  const long = await majors(0);
  assert.equal(long.steps, 1);
  assert.ok(long.other >= 1, `${long.other} other full collection(s)`);
  // no limit: the same trim goes on after its first (it gave back more than a step's minimum)
  assert.ok(burst('y'));
  const short = await majors(Infinity);
  assert.ok(short.steps >= 2, `${short.steps} full collection(s) of the trim's`);
  assert.equal(keep.length, 500_000);
});
