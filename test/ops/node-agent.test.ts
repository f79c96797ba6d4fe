// The node agent's network-programming latency (src/sinks/local/agent.ts):
// each diff's change to a Service is observed once, when a sync of every
// dataplane backend that started after the diff was complete succeeded and
// did not leave that Service out. The clock and the results are scripted.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { LocalSet } from '../../src/api/model.js';
import type { LocalOp } from '../../src/diff/ops.js';
import type { SyncResult } from '../../src/backends/shared/runner.js';
import { ProgrammingLatency } from '../../src/sinks/local/agent.js';

const setService = (path: string): LocalOp => ({ kind: 'set', set: LocalSet.ServicesSet, path, value: undefined as never, bytes: new Uint8Array() });
const delEndpoint = (path: string): LocalOp => ({ kind: 'delete', set: LocalSet.EndpointsSet, path });
const setNode: LocalOp = { kind: 'set', set: LocalSet.NodesSet, path: 'node-a', value: undefined as never, bytes: new Uint8Array() };
const SYNC: LocalOp = { kind: 'sync' };

function result(startedAt: number, endedAt: number, more: Partial<SyncResult> = {}): SyncResult {
  return { ok: true, full: false, partial: false, reason: 'change', durationMs: endedAt - startedAt, changes: 1, skipped: [], repaired: false, endedAt, ...more };
}

function setup(reporting = [0], changedAt?: (k: string) => number | undefined) {
  let now = 0;
  const seen: number[] = [];
  const l = new ProgrammingLatency(reporting, changedAt, (s) => seen.push(s), () => now);
  return { l, seen, at: (t: number) => (now = t) };
}

test('a diff is observed once, by the first good sync that started after its Sync', () => {
  const { l, seen, at } = setup();
  at(100);
  l.delivering(setService('ns/a'));
  at(150);
  // a sync that started in the middle of the diff did not apply all of it
  l.synced(result(120, 160), 0);
  l.delivering(delEndpoint('ns/a/p1'));
  l.delivering(setNode);
  at(200);
  l.delivering(SYNC);
  l.synced(result(200, 250, { ok: false, error: 'refused' }), 0);
  assert.deepEqual(seen, []);
  l.synced(result(300, 400), 0);
  assert.deepEqual(seen, [0.3], 'from the first op of the change');
  l.synced(result(500, 600), 0);
  assert.deepEqual(seen, [0.3], 'once');
  assert.equal(l.size, 0);
});

test('each diff that carried a Service is one observation, from its own start', () => {
  const { l, seen, at } = setup();
  at(100);
  l.delivering(setService('ns/a'));
  l.delivering(SYNC);
  l.synced(result(110, 120, { ok: false }), 0);
  at(300);
  l.delivering(delEndpoint('ns/a/p1'));
  l.delivering(SYNC);
  l.synced(result(400, 500), 0);
  assert.deepEqual(seen, [0.4, 0.2]);
});

test('a Service the sync left out (the dataplane refused it) is observed when a later sync programs it', () => {
  const { l, seen, at } = setup();
  at(100);
  l.delivering(setService('ns/a'));
  l.delivering(setService('ns/b'));
  l.delivering(SYNC);
  l.synced(result(100, 200, { partial: true, skipped: ['ns/b'] }), 0);
  assert.deepEqual(seen, [0.1]);
  at(1000);
  l.delivering(setService('ns/b'));
  l.delivering(SYNC);
  l.synced(result(1000, 1100), 0);
  assert.deepEqual(seen, [0.1, 1.0, 0.1]);
});

test('with several dataplane backends, a change is observed when the last one applied it', () => {
  const { l, seen, at } = setup([0, 2]);
  at(100);
  l.delivering(setService('ns/a'));
  l.delivering(SYNC);
  l.synced(result(100, 200), 2);
  l.synced(result(100, 200), 2);
  assert.deepEqual(seen, []);
  l.synced(result(100, 300), 0);
  assert.deepEqual(seen, [0.2]);
});

test('the start comes from upstream when it knows it; no dataplane backend, nothing is timed', () => {
  const { l, seen, at } = setup([0], (k) => (k === 'ns/a' ? 40 : undefined));
  at(100);
  l.delivering(setService('ns/a'));
  l.delivering(setService('ns/b'));
  l.delivering(SYNC);
  l.synced(result(100, 200), 0);
  assert.deepEqual(seen, [0.16, 0.1]);

  const none = setup([]);
  none.l.delivering(setService('ns/a'));
  none.l.delivering(SYNC);
  assert.equal(none.l.size, 0);
});

test('while syncs fail, the changes kept per Service are bounded', () => {
  const { l, seen, at } = setup();
  for (let i = 0; i < 1000; i++) {
    at(i);
    l.delivering(setService('ns/a'));
    l.delivering(SYNC);
    l.synced(result(i, i, { ok: false }), 0);
  }
  l.synced(result(2000, 3000), 0);
  assert.ok(seen.length <= 8, `${seen.length} observations`);
  assert.equal(seen[0], 3, 'the oldest change is timed from its start');
});
