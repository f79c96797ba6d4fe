// The node agent's network-programming latency (src/sinks/local/agent.ts):
// each diff's change to a Service is observed once, when a sync of every
// dataplane backend that started after the diff was complete succeeded and
// did not leave that Service out. The clock and the results are scripted.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { LocalSet } from '../../src/api/model.js';
import type { LocalOp } from '../../src/diff/ops.js';
import type { SyncResult } from '../../src/backends/shared/runner.js';
import { ProgrammingLatency, serviceOfOp } from '../../src/sinks/local/agent.js';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import '../../src/sinks/index.js';
import { registeredSinks } from '../../src/sinks/registry.js';
import { registerBackend } from '../../src/backends/registry.js';
import { runLocal } from '../../src/sinks/local/remote.js';
import { ServiceViews } from '../../src/localstate/views.js';
import { freePort } from '../helpers/port.js';
import { until } from '../helpers/until.js';
import { quiet, smallCluster, startServer, syncedStore } from '../api/helpers.js';

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
  // the state at start: not timed
  l.delivering(setService('ns/start'));
  l.delivering(SYNC);
  return { l, seen, at: (t: number) => (now = t) };
}

test('the first diff, the state at start, is not timed; the next one is', () => {
  let now = 0;
  const seen: number[] = [];
  const l = new ProgrammingLatency([0], undefined, (s) => seen.push(s), () => now);
  l.delivering(setService('ns/a'));
  l.delivering(setService('ns/b'));
  l.delivering(SYNC);
  now = 50;
  l.synced(result(10, 50), 0);
  assert.deepEqual(seen, []);
  assert.equal(l.size, 0, 'nothing waits to be timed');
  now = 100;
  l.delivering(setService('ns/a'));
  l.delivering(SYNC);
  l.synced(result(110, 150), 0);
  assert.deepEqual(seen, [0.05]);
});

test('serviceOfOp names the Service of each op, also where one key is the start of another', () => {
  const setEndpoint = (path: string): LocalOp => ({ kind: 'set', set: LocalSet.EndpointsSet, path, value: undefined as never, bytes: new Uint8Array() });
  const ops: [LocalOp, string | undefined][] = [
    [setService('ns/a'), 'ns/a'],
    [setEndpoint('ns/a/ep-1'), 'ns/a'],
    [delEndpoint('ns/a/ep-2'), 'ns/a'],
    // ns/a is where ns/ab's paths start: not its Service
    [setEndpoint('ns/ab/ep-1'), 'ns/ab'],
    [delEndpoint('ns/a/ep-3'), 'ns/a'],
    [delEndpoint('ns2/a/ep-1'), 'ns2/a'],
    [delEndpoint('n/s2/a'), 'n/s2'],
    [setNode, undefined],
    [SYNC, undefined],
    [delEndpoint('ns/a/x/y'), 'ns/a'],
  ];
  for (const [op, want] of ops) assert.equal(serviceOfOp(op), want, 'path' in op ? op.path : op.kind);
});

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

// --- the agent's lifetime: its health and metrics servers go with it

async function answers(url: string): Promise<boolean> {
  return fetch(url).then(
    (r) => r.ok || r.status === 503,
    () => false,
  );
}

// a dataplane backend (it has a proxy mode: health and metrics servers) whose syncs always succeed
registerBackend({
  name: 'agent-test',
  description: 'a dataplane that takes everything',
  proxyMode: 'test',
  create: (_opts, ctx) => ({
    sink: {
      send(op) {
        const t = Date.now();
        if (op.kind === 'sync') ctx.report(result(t, t));
      },
    },
  }),
});

for (const mode of ['to-local', 'kpng local'] as const) {
  test(`${mode}: the health and metrics servers are closed when the agent stops`, { timeout: 30_000 }, async (t) => {
    const store = syncedStore(smallCluster());
    const views = new ServiceViews(store);
    const [metricsPort, healthzPort] = [await freePort(), await freePort()];
    const backends = [{ name: 'agent-test', opts: { nodeName: 'node-a', metricsBindAddress: `127.0.0.1:${metricsPort}`, healthzBindAddress: `127.0.0.1:${healthzPort}`, minSyncPeriod: '0s' } }];
    const ac = new AbortController();
    t.after(() => ac.abort());
    let running: Promise<void>;
    if (mode === 'to-local') {
      running = registeredSinks().find((s) => s.name === 'to-local')!.run({}, { store, views, log: quiet, signal: ac.signal }, backends);
    } else {
      const dir = mkdtempSync(join(tmpdir(), 'kpng-agent-'));
      t.after(() => rmSync(dir, { recursive: true, force: true }));
      const server = await startServer(store, `unix://${join(dir, 'kpng.sock')}`, {}, views);
      t.after(() => server.stop());
      running = runLocal({ api: server.address, errorDelay: 50, maxErrorDelay: 200 }, backends, quiet, ac.signal);
    }
    running.catch(() => {});
    const metrics = `http://127.0.0.1:${metricsPort}/metrics`;
    const healthz = `http://127.0.0.1:${healthzPort}/healthz`;
    await until('the servers to answer', async () => (await answers(metrics)) && (await answers(healthz)), { timeoutMs: 10_000, everyMs: 50 });
    ac.abort();
    await running;
    assert.equal(await answers(metrics), false, '/metrics still answers');
    assert.equal(await answers(healthz), false, '/healthz still answers');
  });
}
