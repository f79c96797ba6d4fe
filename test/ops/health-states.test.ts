// /healthz, /readyz and /livez as states of one node (src/runtime/health.ts,
// src/backends/node-presence.ts), on a scripted clock: a node that never
// applied a complete state is not healthy nor ready, but live; a programmed
// node is; a sync that began before the first state does not count; an
// unknown Node (a mistyped --node-name) is said in the log, in
// kpng_node_known and in /healthz; a Node being deleted fails /healthz only.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ProxyHealth, type HealthPath } from '../../src/runtime/health.js';
import { NodePresence } from '../../src/backends/node-presence.js';
import { LocalSet, type LocalNode } from '../../src/api/model.js';
import { registry } from '../../src/runtime/metrics.js';
import { recordingLogger } from '../helpers/logs.js';

const TIMEOUT = 60_000;

function node(deleting = false, v4 = ['192.0.2.10'], v6: string[] = []): LocalNode {
  return { $typeName: 'localv1.Node', Name: 'node-a', Zone: '', IPs: { $typeName: 'localv1.IPSet', V4: v4, V6: v6 }, PodCIDRs: [], Labels: {}, Deleting: deleting } as LocalNode;
}

function setup(backends = 1) {
  let now = 1_000_000;
  const health = new ProxyHealth(TIMEOUT, backends, () => now);
  const logs = recordingLogger();
  const presence = new NodePresence('node-a', health, logs.log, true);
  const codes = () => Object.fromEntries((['/healthz', '/readyz', '/livez'] as HealthPath[]).map((p) => [p, health.check(p).healthy ? 200 : 503]));
  /** a complete state reaches the backends, with or without the Node */
  const deliver = (n?: LocalNode) => {
    health.queued();
    if (n) presence.op({ kind: 'set', set: LocalSet.NodesSet, path: 'node-a', value: n, bytes: new Uint8Array() });
    presence.synced();
    health.delivered();
  };
  /** backend b's sync ran from start to end (clock ms) and succeeded */
  const synced = (start: number, end: number, backend = 0) => {
    now = end;
    health.observe({ ok: true, endedAt: end, durationMs: end - start }, backend);
  };
  return { health, presence, logs, codes, deliver, synced, at: (t: number) => (now = t), get now() { return now; } };
}

test('a node that never applied a state is live but neither healthy nor ready', () => {
  const s = setup();
  // the source cannot reach the API server: nothing arrives, for as long as that lasts
  s.at(s.now + 10 * TIMEOUT);
  assert.deepEqual(s.codes(), { '/healthz': 503, '/readyz': 503, '/livez': 200 });
  const body = s.health.check('/healthz').body;
  assert.equal(body.lastUpdated, '');
  assert.equal(body.healthy, false);
  assert.equal(body.nodeEligible, false, 'no Node known yet: not eligible, as kube-proxy without its Node');
  s.presence.close();
});

test('programmed once every backend applied the first complete state; a sync begun before it does not count', () => {
  const s = setup(2);
  const t0 = s.now;
  s.deliver(node());
  // backend 0's sync started just before the state was delivered: it did not apply it
  s.synced(t0 - 5, t0 + 20, 0);
  assert.equal(s.health.check('/readyz').healthy, false);
  s.synced(t0 + 1, t0 + 30, 0);
  assert.equal(s.health.check('/readyz').healthy, false, 'backend 1 has not applied it yet');
  s.synced(t0 + 2, t0 + 40, 1);
  assert.deepEqual(s.codes(), { '/healthz': 200, '/readyz': 200, '/livez': 200 });
  assert.equal(s.health.check('/healthz').body.lastUpdated, new Date(t0 + 40).toISOString());
  s.presence.close();
});

test('an update waiting longer than the timeout fails all three; applying it heals them', () => {
  const s = setup();
  s.deliver(node());
  s.synced(s.now, s.now + 10);
  s.deliver(node());
  s.at(s.now + TIMEOUT + 1);
  assert.deepEqual(s.codes(), { '/healthz': 503, '/readyz': 503, '/livez': 503 });
  s.synced(s.now, s.now + 10);
  assert.deepEqual(s.codes(), { '/healthz': 200, '/readyz': 200, '/livez': 200 });
  s.presence.close();
});

test('a Node being deleted fails /healthz only: load balancers drain it, probes leave it', () => {
  const s = setup();
  s.deliver(node(true));
  s.synced(s.now, s.now + 10);
  assert.deepEqual(s.codes(), { '/healthz': 503, '/readyz': 200, '/livez': 200 });
  assert.equal(s.health.check('/healthz').body.nodeEligible, false);
  s.presence.close();
});

test('no Node of this name after the first state: one WARN naming the fix, kpng_node_known 0, /healthz and /readyz 503; fine once it appears', async () => {
  const s = setup();
  s.deliver();
  s.synced(s.now, s.now + 10);
  assert.deepEqual(s.codes(), { '/healthz': 503, '/readyz': 503, '/livez': 200 });
  const warns = () => s.logs.records.filter((r) => r.level === 40);
  assert.equal(warns().length, 1);
  assert.match(warns()[0].msg, /node node-a: the cluster has no Node of this name; check --node-name/);
  assert.match(await registry.getSingleMetricAsString('kpng_node_known'), /^kpng_node_known 0$/m);
  // later complete states do not repeat it (a timer does, every 10 minutes)
  s.deliver();
  s.synced(s.now, s.now + 10);
  assert.equal(warns().length, 1);
  // kubelet registers the Node
  s.deliver(node());
  s.synced(s.now, s.now + 10);
  assert.deepEqual(s.codes(), { '/healthz': 200, '/readyz': 200, '/livez': 200 });
  assert.match(await registry.getSingleMetricAsString('kpng_node_known'), /^kpng_node_known 1$/m);
  assert.ok(s.logs.records.some((r) => r.level === 30 && /node node-a: its Node is here now/.test(r.msg)));
  s.presence.close();
});
