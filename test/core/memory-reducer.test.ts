// trimMemory and V8's memory reducer. A file of its own: the other
// trimMemory tests' trims end with the reducer's collection, and V8 wakes the
// reducer again only once the heap has grown by a tenth since (2 of 8 runs
// failed in memory.test.ts, after them).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { PerformanceObserver, constants, type PerformanceEntry } from 'node:perf_hooks';
import { trimMemory } from '../../src/runtime/memory.js';

test("trimMemory lets V8's memory reducer do its one collection while the process is quiet, not at the next burst", async () => {
  // V8 measures the allocation rate only at collections: after a trim its
  // reducer still sees the burst and waits, unless told to favour memory
  const majors: { at: number; flags: number }[] = [];
  const obs = new PerformanceObserver((list) => {
    for (const e of list.getEntries()) {
      const { kind, flags } = (e as PerformanceEntry & { detail: { kind: number; flags: number } }).detail;
      if (kind === constants.NODE_PERFORMANCE_GC_MAJOR) majors.push({ at: e.startTime, flags });
    }
  });
  obs.observe({ entryTypes: ['gc'] });
  try {
    const keep: object[] = [];
    for (let i = 0; i < 3_000_000; i++) keep.push({ i, s: `x${i}` });
    trimMemory(0, 200);
    await sleep(3000);
    const trimmed = performance.now();
    // the reducer's collection is the one nobody forced (the trim's are forced, or come from the low-memory notification before this)
    const reducer = () => majors.find((m) => m.at > trimmed && !(m.flags & constants.NODE_PERFORMANCE_GC_FLAGS_FORCED));
    for (let i = 0; i < 120 && !reducer(); i++) await sleep(100);
    assert.ok(reducer(), `no collection of V8's own within 15 s of the trim: ${majors.length} full collections, all before`);
    assert.equal(keep.length, 3_000_000);
  } finally {
    obs.disconnect();
  }
});
