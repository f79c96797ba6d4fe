// The sync runner with an injected clock: minSyncPeriod from the end of one
// sync to the start of the next, coalescing, retries with backoff, the
// periodic reconcile.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SyncRunner, type Clock, type SyncResult } from '../../src/backends/shared/runner.js';
import { ManualClock } from '../helpers/clock.js';

function result(clock: Clock, ok: boolean, reason: SyncResult['reason'] = 'change'): SyncResult {
  return { ok, full: false, partial: false, reason, durationMs: 0, changes: 1, skipped: [], repaired: false, endedAt: clock.now(), ...(ok ? {} : { error: 'boom' }) };
}

function runner(o: { minIntervalMs?: number; periodMs?: number; fail?: () => boolean; reconcile?: () => SyncResult | undefined; syncMs?: number }) {
  const clock = new ManualClock();
  const starts: { at: number; reason: string }[] = [];
  const results: SyncResult[] = [];
  const r = new SyncRunner({
    minIntervalMs: o.minIntervalMs ?? 0,
    periodMs: o.periodMs ?? 0,
    clock,
    random: () => 0.5, // no jitter: delays are exact
    sync: async (reason) => {
      starts.push({ at: clock.now(), reason });
      if (o.syncMs) await clock.advance(o.syncMs);
      return result(clock, !(o.fail?.() ?? false), reason);
    },
    reconcile: o.reconcile
      ? async () => {
          starts.push({ at: clock.now(), reason: 'reconcile' });
          return o.reconcile!();
        }
      : undefined,
    onResult: (x) => results.push(x),
  });
  return { clock, r, starts, results };
}

test('the first request syncs at once; the next waits minInterval from the end of the last sync', async () => {
  const { clock, r, starts } = runner({ minIntervalMs: 1000, syncMs: 300 });
  const t0 = clock.now();
  const first = r.request();
  await clock.advance(0);
  assert.equal((await first).ok, true);
  assert.deepEqual(starts.map((s) => s.at - t0), [0]);
  // 300 ms of sync, then at least 1000 ms before the next starts
  const second = r.request();
  await clock.advance(999);
  assert.equal(starts.length, 1);
  await clock.advance(1);
  await second;
  assert.deepEqual(starts.map((s) => s.at - t0), [0, 1300]);
  await r.close();
});

test('requests while a sync runs coalesce into one next sync', async () => {
  const { clock, r, starts } = runner({ minIntervalMs: 100, syncMs: 50 });
  const a = r.request();
  await clock.advance(10); // the first sync runs
  const b = r.request();
  const c = r.request();
  const d = r.request();
  await clock.advance(1000);
  await Promise.all([a, b, c, d]);
  assert.equal(starts.length, 2);
  await r.close();
});

test('a failure retries with exponential backoff until it works; a change meanwhile waits for the retry', async () => {
  let failing = 3;
  const { clock, r, starts, results } = runner({ periodMs: 60_000, fail: () => failing-- > 0 });
  const t0 = clock.now();
  const first = r.request();
  await clock.advance(0);
  assert.equal((await first).ok, false);
  // retries at +1 s, then +2 s, then +4 s (no jitter); the last works
  const change = r.request(); // does not jump the backoff
  await clock.advance(10_000);
  assert.deepEqual(
    starts.map((s) => [s.at - t0, s.reason]),
    [
      [0, 'change'],
      [1000, 'retry'],
      [3000, 'retry'],
      [7000, 'retry'],
    ],
  );
  assert.equal((await change).ok, false); // it rode on the retry at +1 s, which failed
  assert.deepEqual(results.map((x) => x.ok), [false, false, false, true]);
  assert.equal(r.failures, 0);
  await r.close();
});

test('the backoff is capped (at the sync period) and jittered', async () => {
  const clock = new ManualClock();
  const starts: number[] = [];
  const r = new SyncRunner({
    minIntervalMs: 0,
    periodMs: 5000,
    clock,
    random: () => 0.99,
    sync: async () => {
      starts.push(clock.now());
      return result(clock, false);
    },
  });
  void r.request().catch(() => {});
  await clock.advance(120_000);
  const gaps = starts.slice(1).map((t, i) => t - starts[i]);
  assert.ok(gaps.length >= 10, gaps.join(' '));
  assert.equal(Math.max(...gaps), Math.round(5000 * 1.49)); // at most the period, times the jitter
  assert.equal(gaps[0], Math.round(1000 * 1.49));
  await r.close();
});

test('every period after the last sync, a reconcile; one that finds nothing reports nothing', async () => {
  let drift = false;
  const { clock, r, starts, results } = runner({
    periodMs: 5000,
    reconcile: () => (drift ? ((drift = false), { ...result(clock, true, 'reconcile'), repaired: true }) : undefined),
  });
  const t0 = clock.now();
  await Promise.all([r.request(), clock.advance(0)]);
  await clock.advance(12_000);
  assert.deepEqual(starts.map((s) => [s.at - t0, s.reason]), [
    [0, 'change'],
    [5000, 'reconcile'],
    [10_000, 'reconcile'],
  ]);
  assert.equal(results.length, 1);
  drift = true;
  await clock.advance(3000);
  assert.equal(results.length, 2);
  assert.equal(results[1].repaired, true);
  // a change does not move the period: it runs from the last check (the repair, a full sync)
  const c = r.request();
  await clock.advance(0);
  await c;
  const changedAt = starts.at(-1)!.at;
  await clock.advance(4999);
  assert.equal(starts.at(-1)!.at, changedAt);
  await clock.advance(1);
  assert.equal(starts.at(-1)!.reason, 'reconcile');
  await r.close();
});

test('under steady churn the check still comes every period, before the waiting change, which then runs at once', async () => {
  const { clock, r, starts } = runner({ periodMs: 5000, minIntervalMs: 100, reconcile: () => undefined });
  const t0 = clock.now();
  const changes: Promise<unknown>[] = [];
  // a change every 200 ms for 12 s: a sync is always waiting
  for (let t = 0; t < 12_000; t += 200) {
    changes.push(r.request());
    await clock.advance(200);
  }
  const checks = starts.filter((s) => s.reason === 'reconcile').map((s) => s.at - t0);
  assert.deepEqual(checks, [5000, 10_000]);
  for (const at of checks) {
    const after = starts.find((s) => s.at - t0 >= at && s.reason === 'change');
    assert.ok(after && after.at - t0 - at < 100, `the change waiting behind the check at ${at} ran at once, not ${after && after.at - t0 - at} ms later`);
  }
  await Promise.all(changes);
  await r.close();
});

test('close stops the timers and refuses new requests', async () => {
  const { clock, r } = runner({ periodMs: 1000, reconcile: () => undefined });
  await Promise.all([r.request(), clock.advance(0)]);
  await r.close();
  await clock.advance(10_000);
  assert.equal(clock.pending, 0);
  await assert.rejects(r.request(), /closed/);
});

test('syncs due back to back (a period below the clock resolution) give the event loop back between them', async () => {
  // the real clock: syncPeriod 1ns, minSyncPeriod 0 make every reconcile due as the last one ends
  const RECONCILES = 200;
  let reconciles = 0;
  let loopTurnedAt = -1;
  let done!: () => void;
  const finished = new Promise<void>((res) => (done = res));
  const r: SyncRunner = new SyncRunner({
    minIntervalMs: 0,
    periodMs: 1e-6,
    sync: async (reason) => ({ ok: true, full: false, partial: false, reason, durationMs: 0, changes: 0, skipped: [], repaired: false, endedAt: Date.now() }),
    reconcile: async () => {
      // bounded: the test ends even where the loop never lets go
      if (++reconciles === RECONCILES) void r.close().then(done);
      return undefined;
    },
  });
  // the runner's timers do not hold a process open; kpng's sockets do
  const keepAlive = setInterval(() => {}, 1000);
  await r.request();
  // a callback of the event loop's next turn (where a signal's handler or a health probe would run)
  setImmediate(() => (loopTurnedAt = reconciles));
  await finished;
  clearInterval(keepAlive);
  assert.ok(loopTurnedAt >= 0 && loopTurnedAt < 5, `the event loop turned only after ${loopTurnedAt < 0 ? 'all' : loopTurnedAt} of ${RECONCILES} reconciles`);
});
