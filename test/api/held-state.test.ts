// kpng local's held state (src/sinks/local/held-state.ts): the reset filter
// (src/api/reset-filter.ts) and the state socket's answer from one compact
// copy of the node's state.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fromBinary } from '@bufbuild/protobuf';
import { syncedStore, service, slice, node, load, watch, opText } from '../helpers/k8s.js';
import { LocalSet } from '../../src/api/model.js';
import { OpItemSchema } from '../../src/api/gen/api/localv1/api_pb.js';
import { LocalDiff } from '../../src/diff/local-diff.js';
import { ServiceViews } from '../../src/localstate/views.js';
import type { LocalOp, LocalSink } from '../../src/diff/ops.js';
import { EntryTable } from '../../src/api/reset-filter.js';
import { HeldState } from '../../src/sinks/local/held-state.js';
import { ReferenceResetFilter } from '../helpers/reference-reset-filter.js';
import { NodeStateMirror } from '../../src/sinks/local/state-mirror.js';

const cluster = (n: number, gen = 0) => {
  const objs: object[] = [node('a', 'z1')];
  for (let i = 0; i < n; i++) {
    objs.push(service('ns', `s${i}`, { clusterIP: `10.96.1.${i}` }));
    objs.push(slice('ns', `s${i}-1`, `s${i}`, [{ ip: `10.1.${gen}.${i}`, node: 'a', pod: `p${i}-${gen}` }, { ip: `10.2.0.${i}`, node: 'b', pod: `q${i}` }]));
  }
  return objs;
};

/** the ops with bytes of their own, which the test then overwrites: a held view would show it */
const scribbled = (ops: readonly LocalOp[]) => {
  const copies: Uint8Array[] = [];
  const out = ops.map((op) => {
    if (op.kind !== 'set') return op;
    const bytes = Uint8Array.from(op.bytes);
    copies.push(bytes);
    return { ...op, bytes };
  });
  return { ops: out, scribble: () => copies.forEach((b) => b.fill(0xff)) };
};

test('a resend after a reconnect passes only what changed, as the plain reference filter does, with the same resume digests', async () => {
  const store = syncedStore(cluster(40));
  const got: string[] = [];
  const want: string[] = [];
  const held = new HeldState({ send: (op) => void got.push(opText(op)) });
  const filter = new ReferenceResetFilter({ send: (op) => void want.push(opText(op)) });
  const both = async (ops: readonly LocalOp[]) => {
    const { ops: mine, scribble } = scribbled(ops);
    for (const op of mine) await held.send(op);
    scribble();
    for (const op of ops) await filter.send(op);
  };
  await both(watch(store, 'a').next());
  assert.deepEqual(held.heldDigests(), filter.heldDigests());
  // the connection drops; meanwhile some endpoints change and a service goes
  load(store, cluster(40, 1).slice(1, 21));
  store.update((tx) => tx.deleteService('ns', 's39'));
  got.length = want.length = 0;
  await both(watch(store, 'a').next());
  assert.deepEqual(got, want);
  assert.ok(got.includes('delete ServicesSet ns/s39') && got.some((o) => o.startsWith('set EndpointsSet ns/s3/')), got.join('\n'));
  assert.equal(got.filter((o) => o === 'reset').length, 0);
  assert.deepEqual(held.heldDigests(), filter.heldDigests());
  // unchanged: nothing but the Sync
  got.length = 0;
  await both(watch(store, 'a').next());
  assert.deepEqual(got, ['sync']);
});

test('a Resume resends some buckets: only what was held there and not resent is deleted', async () => {
  const store = syncedStore(cluster(60));
  const views = new ServiceViews(store, '', { keepDecoded: false });
  const got: string[] = [];
  const held = new HeldState({ send: (op) => void got.push(opText(op)) });
  const first = new LocalDiff(store, views, 'a');
  for (const op of first.next()) await held.send(op);
  first.close();
  const digests = held.heldDigests();
  store.update((tx) => tx.deleteService('ns', 's7'));
  const r = new LocalDiff(store, views, 'a', { held: digests });
  const ops = r.next();
  r.close();
  assert.ok(ops[0].kind === 'reset' && ops[0].resume, 'a resume');
  got.length = 0;
  for (const op of ops) await held.send(op);
  assert.deepEqual(got.filter((o) => o.startsWith('delete')).sort(), ['delete EndpointsSet ns/s7/p7-0', 'delete EndpointsSet ns/s7/q7', 'delete ServicesSet ns/s7'].sort());
  assert.equal(got.at(-1), 'sync');
});

test('the state socket shows what the backend holds: a refused value keeps its last good copy', async () => {
  const store = syncedStore(cluster(5));
  const backend: string[] = [];
  let refuse = '';
  let mirror!: NodeStateMirror;
  const quietless = new HeldState({ send: (op) => chain.send(op) });
  const refusing = (inner: LocalSink): LocalSink => ({ send: (op) => (op.kind === 'set' && op.path === refuse ? undefined : inner.send(op)) });
  const chain = refusing(quietless.backend((mirror = new NodeStateMirror(quietless)).wrap({ send: (op) => void backend.push(opText(op)) })));
  const ops = watch(store, 'a').next();
  for (const op of ops) await quietless.send(op);
  const shown = () =>
    mirror
      .frames([LocalSet.NodesSet], 'a')
      .map((f) => fromBinary(OpItemSchema, f).Op)
      .map((o): string => (o.case === 'Set' ? `${o.value.Ref!.Path}=${Buffer.from(o.value.Bytes).toString('hex')}` : String(o.case)));
  const before = shown();
  const sent = ops.filter((o) => o.kind === 'set').map((o) => (o.kind === 'set' ? `${o.path}=${Buffer.from(o.bytes).toString('hex')}` : ''));
  assert.deepEqual(before.filter((s) => s.includes('=') && !s.startsWith('a=')).sort(), sent.sort());
  assert.ok(before.some((s) => s.startsWith('a=')), 'the node, by name');
  // s1's service changes to a value the backend refuses: the socket still shows the old one
  refuse = 'ns/s1';
  load(store, [service('ns', 's1', { clusterIP: '10.96.9.9' })]);
  const w = watch(store, 'a');
  for (const op of w.next()) await quietless.send(op); // a resend: only s1 differs
  assert.deepEqual(shown(), before);
  // the same refused value again is no news
  backend.length = 0;
  for (const op of watch(store, 'a').next()) await quietless.send(op);
  assert.deepEqual(backend, ['sync']);
  // taken at last: the socket shows it
  refuse = '';
  load(store, [service('ns', 's1', { clusterIP: '10.96.9.10' })]);
  for (const op of watch(store, 'a').next()) await quietless.send(op);
  assert.notDeepEqual(shown(), before);
  assert.equal(shown().length, before.length);
});

test('the entry table: finds, replaces and deletes like a Map through growth and compaction', () => {
  const t = new EntryTable();
  const ref = new Map<string, { slot: number; value: Buffer }>();
  const val = (i: number, gen: number) => Buffer.from(`value ${i} generation ${gen} `.repeat(1 + (i % 7)));
  let seed = 7;
  const rnd = (n: number) => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) >>> 8) % n;
  for (let step = 0; step < 60_000; step++) {
    const i = rnd(5000);
    const set = i % 3 ? LocalSet.EndpointsSet : LocalSet.ServicesSet;
    const path = `ns/s${i % 1000}/ép${i}`; // not ASCII: paths are UTF-8 in the table
    const k = `${set} ${path}`;
    const had = ref.get(k);
    assert.equal(t.find(set, path), had?.slot, `step ${step}`);
    const what = rnd(3);
    if (what === 0 && had) {
      t.release(had.slot);
      ref.delete(k);
    } else if (had) {
      had.value = val(i, step);
      t.replace(had.slot, had.value);
    } else ref.set(k, { slot: t.add(set, path, val(i, step)), value: val(i, step) });
  }
  assert.equal(t.size, ref.size);
  for (const [k, { slot, value }] of ref) {
    const [set, path] = [Number(k.slice(0, k.indexOf(' '))), k.slice(k.indexOf(' ') + 1)];
    assert.equal(t.find(set, path), slot);
    assert.equal(t.path(slot), path);
    assert.equal(t.setOf(slot), set);
    assert.ok(t.equals(slot, value), k);
  }
  const { live, dead } = t.bytes;
  assert.ok(dead <= Math.max(live, 1 << 20) + (256 << 10), `dead ${dead} live ${live}`);
  // a big value gets a chunk of its own
  const big = Buffer.alloc(200 << 10, 7);
  assert.ok(t.equals(t.add(LocalSet.ServicesSet, 'ns/big', big), big));
});
