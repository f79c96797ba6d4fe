// trimMemory: a full collection (and malloc_trim) after a burst of work, without exposing gc() to the process.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { readFileSync } from 'node:fs';
import { getHeapSpaceStatistics } from 'node:v8';
import { trimMemory } from '../../src/runtime/memory.js';

const peakRss = () => Number(/^VmHWM:\s+(\d+) kB/m.exec(readFileSync('/proc/self/status', 'utf8'))![1]) * 1024;
const oldSpace = () => getHeapSpaceStatistics().find((s) => s.space_name === 'old_space')!;

// first: the tests after it raise the process's peak (a 256 MiB buffer)
test('trimMemory compacts in steps when copying the heap in use at once would pass the peak', async () => {
  // 3M objects that outlive young collections (old space), then two in three dropped: every page keeps a third
  const all: ({ i: number; s: string } | undefined)[] = [];
  for (let i = 0; i < 3_000_000; i++) all.push({ i, s: `x${i}` });
  // the peak: 32 MiB above this, room for a step's copy (at most 6 MB) but not for the 60+ MB in use
  let room: Buffer | undefined = Buffer.alloc(32 << 20, 1);
  assert.equal(room[room.length - 1], 1);
  room = undefined;
  for (let i = 0; i < all.length; i++) if (i % 3) all[i] = undefined;
  const peak = peakRss();
  const used = oldSpace().space_used_size;
  trimMemory(0, 60_000);
  // collected (two in three gone), and the pages they were spread over given back
  const compacted = () => oldSpace().space_used_size < used / 2 && oldSpace().space_size < 1.3 * oldSpace().space_used_size;
  for (let t = 0; t < 100 && !compacted(); t++) await sleep(100);
  const old = oldSpace();
  assert.ok(compacted(), `V8's old space ${Math.round(old.space_size / 2 ** 20)} MiB committed for ${Math.round(old.space_used_size / 2 ** 20)} MiB in use`);
  assert.ok(peakRss() - peak < 16 * 2 ** 20, `peak RSS ${Math.round(peak / 2 ** 20)} -> ${Math.round(peakRss() / 2 ** 20)} MiB`);
  assert.equal(all.length, 3_000_000);
});

test('trimMemory collects the garbage a burst left behind, and gc() stays hidden from the process', async () => {
  let junk: unknown[] | undefined = Array.from({ length: 1_000_000 }, (_, i) => ({ i, s: `x${i}` }));
  const before = process.memoryUsage().heapUsed;
  assert.ok(junk.length);
  junk = undefined;
  trimMemory();
  await sleep(100);
  const after = process.memoryUsage().heapUsed;
  assert.ok(after < before / 2, `heap used ${Math.round(before / 2 ** 20)} -> ${Math.round(after / 2 ** 20)} MiB`);
  assert.equal(typeof (globalThis as { gc?: unknown }).gc, 'undefined');
});

test('trimMemory gives back the pages a burst spread its survivors over', async () => {
  // a quarter survives, spread over every page of the burst
  const keep: object[] = [];
  let junk: object[] | undefined = [];
  for (let i = 0; i < 2_000_000; i++) (i % 4 ? junk : keep).push({ i, s: `x${i}` });
  junk = undefined;
  trimMemory();
  // a plain collection keeps ~4x the survivors committed here; collected again and again, or compacted, under 2.5x
  const compacted = () => process.memoryUsage().heapTotal < 2.5 * process.memoryUsage().heapUsed;
  for (let i = 0; i < 50 && !compacted(); i++) await sleep(100);
  const { heapTotal, heapUsed } = process.memoryUsage();
  assert.ok(compacted(), `V8's heap ${Math.round(heapTotal / 2 ** 20)} MiB committed for ${Math.round(heapUsed / 2 ** 20)} MiB in use`);
  assert.equal(keep.length, 500_000);
});

test('trimMemory gives back the young generation a burst grew, without waiting for allocation to be quiet', async () => {
  const newSpace = () => getHeapSpaceStatistics().find((s) => s.space_name === 'new_space')!.space_size;
  // a burst of short-lived objects (some kept, as a cold sync does)
  const keep: object[][] = [];
  const t0 = Date.now();
  for (let n = 0; Date.now() - t0 < 1500; n++) {
    const a: object[] = [];
    for (let i = 0; i < 1000; i++) a.push({ i, s: `x${i}` });
    if (keep.length < 2000 && n % 20 === 0) keep.push(a);
  }
  const grown = newSpace();
  trimMemory(0, 500);
  // after the collections that give pages back (a few, 250 ms apart) and 0.5 s: the low-memory notification (a scavenge would not shrink it before 5 s of quiet)
  for (let i = 0; i < 40 && newSpace() > grown / 4; i++) await sleep(100);
  const after = newSpace();
  assert.ok(after <= grown / 4, `young generation ${Math.round(grown / 2 ** 20)} -> ${Math.round(after / 2 ** 20)} MiB`);
  assert.ok(keep.length > 0);
});
