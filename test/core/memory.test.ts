// trimMemory: a full collection (and malloc_trim) after a burst of work, without exposing gc() to the process.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { trimMemory } from '../../src/memory.js';

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
