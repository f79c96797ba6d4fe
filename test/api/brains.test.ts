// Several brains and resume. A node given several brains follows its own
// (rendezvous order of its name), fails over when that one dies or goes
// silent (the watchdog), and goes back once it answers again; every switch
// resumes (HeldDigests), so the backend sees exactly what changed and the
// brain sends only the buckets that differ. Each brain has its own store, as
// real brains each have their own source; the tests feed them the same
// changes.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { renameSync, writeFileSync } from 'node:fs';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { watchLocalApi, QuietResyncSink } from '../../src/sinks/local/remote.js';
import { brainOrder, parseBrains } from '../../src/api/grpc/client.js';
import { KINDS, Store, type StoreChange } from '../../src/store/store.js';
import { ApiSource } from '../../src/sources/api/index.js';
import { LocalSet } from '../../src/api/model.js';
import type { LocalOp } from '../../src/diff/ops.js';
import { serviceCIDR } from '../helpers/k8s.js';
import { ServiceViews } from '../../src/localstate/views.js';
import { LocalDiff } from '../../src/diff/local-diff.js';
import { FilterResetSink } from '../../src/diff/filter-reset.js';
import { create } from '@bufbuild/protobuf';
import { WatchReqSchema } from '../../src/api/gen/api/localv1/api_pb.js';
import { localWatchMethod } from '../../src/api/grpc/wire.js';
import { RawWatch, RecordingBackend, exampleClusterYaml, apply, node, quiet, slice, smallCluster, startServer, svc, syncedStore, testResources, type TestServer } from './helpers.js';
import { until, sleep } from '../helpers/until.js';

const { dirs, cleanups } = testResources();


const socket = () => `unix://${join(dirs.make(), 'kpng.sock')}`;

interface Brain {
  store: Store;
  address: string;
  s?: TestServer;
}

/** a brain on its own store; start() again after stop() is a restart (new views: nothing remembered) */
function brain(store: Store, address = socket()) {
  const b: Brain & { start(): Promise<TestServer>; stop(): Promise<void> } = {
    store,
    address,
    async start() {
      b.s = await startServer(store, address);
      return b.s;
    },
    async stop() {
      await b.s?.stop();
      b.s = undefined;
    },
  };
  cleanups.push(() => b.stop());
  return b;
}

/**
 * The node's agent on these brains, into backend. streamsThrough(n): more
 * than n streams began (each starts with a Reset or a Resume) and the last
 * one's first diff is through the reset filter: what it was to bring the
 * backend has reached it.
 */
function follow(addresses: string[], backend: RecordingBackend, extra: { watchdogMs?: number; resume?: boolean; sets?: LocalSet[] } = {}) {
  const ac = new AbortController();
  const wire = { streams: 0, through: false };
  const filter = new QuietResyncSink(backend);
  const sink = {
    heldDigests: () => filter.heldDigests(),
    async send(op: LocalOp) {
      if (op.kind === 'reset') (wire.streams++, (wire.through = false));
      await filter.send(op);
      if (op.kind === 'sync') wire.through = true;
    },
  };
  const done = watchLocalApi(
    { address: addresses.join(','), log: quiet, signal: ac.signal, minBackoffMs: 20, maxBackoffMs: 200, failbackMs: 200, watchdogMs: extra.watchdogMs ?? 5000 },
    'node-a',
    extra.sets ?? [],
    sink,
    { resume: extra.resume },
  );
  const stop = async () => (ac.abort(), await done);
  cleanups.push(stop);
  return {
    stop,
    get streams() {
      return wire.streams;
    },
    streamsThrough: (n: number) => until(`stream ${n + 1}'s first diff`, () => wire.streams > n && wire.through),
  };
}

const streams = (b: Brain) => b.s?.server.stats.streams ?? 0;

test('brain order: rendezvous of the node name, even spread, a dead brain\'s nodes spread over the others', () => {
  const brains = parseBrains('tcp://10.0.0.1:12090, tcp://10.0.0.2:12090,tcp://10.0.0.3:12090,tcp://10.0.0.1:12090');
  assert.equal(brains.length, 3);
  assert.throws(() => parseBrains(' , '), /no API address/);
  assert.throws(() => parseBrains('tcp://x'), /not an API address/);
  const own = new Map<string, number>();
  const next = new Map<string, number>();
  for (let i = 0; i < 3000; i++) {
    const order = brainOrder(brains, `node-${i}`);
    assert.deepEqual(brainOrder([...brains].reverse(), `node-${i}`), order, 'the order of the list does not matter');
    own.set(order[0], (own.get(order[0]) ?? 0) + 1);
    if (order[0] === brains[0]) next.set(order[1], (next.get(order[1]) ?? 0) + 1);
    // removing a brain moves only its nodes
    const without = brainOrder(brains.slice(1), `node-${i}`);
    if (order[0] !== brains[0]) assert.equal(without[0], order[0]);
  }
  for (const b of brains) assert.ok(own.get(b)! > 850 && own.get(b)! < 1150, `${b}: ${own.get(b)} of 3000 nodes`);
  const a = next.get(brains[1]) ?? 0;
  const c = next.get(brains[2]) ?? 0;
  assert.ok(Math.abs(a - c) < 0.2 * (a + c), `the first brain's nodes fail over to both others: ${a}, ${c}`);
});

test('its brain killed mid-stream: the node follows the other brain with no backend churn, and goes back after recovery', async () => {
  const [p1, p2] = [socket(), socket()];
  const [ownAddress, otherAddress] = brainOrder([p1, p2], 'node-a');
  const own = brain(syncedStore(smallCluster()), ownAddress);
  const other = brain(syncedStore(smallCluster()), otherAddress);
  const both = (...o: object[]) => [own, other].forEach((b) => apply(b.store, ...o));
  await own.start();
  await other.start();
  const backend = new RecordingBackend();
  const node = follow([p1, p2], backend);
  await until('the first sync', () => backend.syncs === 1);
  assert.equal(backend.take().length, 7);
  assert.equal(streams(own), 1);
  assert.equal(streams(other), 0);

  // a change, and its brain dies while sending it (or right after)
  both(slice('ns', 'web-1', 'web', [{ ip: '10.1.0.1', node: 'node-a', pod: 'web-a' }, { ip: '10.1.0.22', node: 'node-b', pod: 'web-b' }]));
  own.s!.server.dropStreams();
  await own.stop();
  await until('the change', () => backend.syncs === 2, { timeoutMs: 5000 });
  await until('the other brain', () => streams(other) === 1);
  await node.streamsThrough(1);
  // exactly that change, once: no reset, no resent value, no delete-and-add
  assert.deepEqual(backend.take(), ['set EndpointsSet ns/web/web-b', 'sync']);
  // the other brain resumed the node: Resume, the bucket of that service (it and its two endpoints), Sync
  assert.ok(other.s!.server.stats.messages <= 5, `the other brain sent ${other.s!.server.stats.messages} messages`);

  // the node follows the cluster on the other brain
  both(svc('ns', 'api', '10.96.0.30'));
  await until('a change through the other brain', () => backend.syncs === 3);
  assert.deepEqual(backend.take(), ['set ServicesSet ns/api', 'sync']);

  // its brain comes back (a restart: remembers nothing): the node goes back, and the backend hears nothing
  await own.start();
  await until('the node back on its own brain', () => streams(own) === 1 && streams(other) === 0, { timeoutMs: 5000 });
  await node.streamsThrough(2);
  assert.deepEqual(backend.take(), []);
  // a probe and the stream itself, each a Resume of nothing and a Sync
  assert.ok(own.s!.server.stats.messages <= 4, `its brain sent ${own.s!.server.stats.messages} messages`);
  both(svc('ns', 'api', '10.96.0.31'));
  await until('a change through its own brain', () => backend.syncs === 4);
  assert.deepEqual(backend.take(), ['set ServicesSet ns/api', 'sync']);
  assert.equal(own.s!.server.stats.diffs, 3);
});

test('a silent brain (connected, never answering) is given up by the watchdog; the node goes back once it answers', async () => {
  const [p1, p2] = [socket(), socket()];
  const [ownAddress, otherAddress] = brainOrder([p1, p2], 'node-a');
  // its own brain's source never synced: it accepts the watch and says nothing
  const unsynced = new Store();
  apply(unsynced, ...smallCluster());
  const own = brain(unsynced, ownAddress);
  const other = brain(syncedStore(smallCluster()), otherAddress);
  await own.start();
  await other.start();
  const backend = new RecordingBackend();
  const t0 = Date.now();
  const node = follow([p1, p2], backend, { watchdogMs: 300 });
  await until('the first sync, from the other brain', () => backend.syncs === 1, { timeoutMs: 5000 });
  assert.ok(Date.now() - t0 >= 250, 'not before the watchdog');
  assert.equal(backend.take()[0], 'reset');
  assert.equal(streams(other), 1);

  // its own brain syncs: the node goes back, the backend hears nothing (the same state)
  unsynced.update((tx) => KINDS.forEach((k) => tx.setSynced(k)));
  await until('the node back on its own brain', () => streams(own) === 1 && streams(other) === 0, { timeoutMs: 5000 });
  await node.streamsThrough(1);
  assert.deepEqual(backend.take(), []);
});

test('a busy brain (synced, its first state queued behind another node) is not given up by the watchdog: its headers say it will answer', async () => {
  const [p1, p2] = [socket(), socket()];
  const [ownAddress, otherAddress] = brainOrder([p1, p2], 'node-a');
  const own = brain(syncedStore(manyServices(3000)), ownAddress);
  const other = brain(syncedStore(manyServices(3000)), otherAddress);
  own.s = await startServer(own.store, ownAddress, { bigDiffs: 1 });
  await other.start();
  // another node takes the only big-diff slot and stops reading its first state: HTTP/2 flow control holds it
  const hog = new RawWatch(ownAddress, localWatchMethod, create(WatchReqSchema, { NodeName: 'node-b' }));
  cleanups.push(() => hog.close());
  hog.pause();
  await until('the other node to hold the slot', () => own.s!.server.stats.messages > 0);
  const backend = new RecordingBackend();
  follow([p1, p2], backend, { watchdogMs: 300 });
  await sleep(1000);
  assert.equal(backend.syncs, 0, 'still queued');
  assert.equal(streams(other), 0, 'never went to the other brain');
  hog.resume();
  await until('its first state, from its own brain', () => backend.syncs === 1, { timeoutMs: 10_000 });
  assert.equal(streams(other), 0);
  assert.equal(backend.take()[0], 'reset');
});

test('kpng api with several brains: a chained store follows one, and the other when that one dies, writing only what changed', async () => {
  const a = brain(syncedStore(smallCluster()));
  const b = brain(syncedStore(smallCluster()));
  await a.start();
  await b.start();
  const chained = new Store();
  const changes: StoreChange[] = [];
  chained.subscribe((c) => changes.push(c));
  const src = new ApiSource(chained, quiet, { address: `${a.address},${b.address}`, minBackoffMs: 20, maxBackoffMs: 100, failbackMs: 200 });
  src.start();
  cleanups.push(() => src.stop());
  await until('the chained store to sync', () => chained.allSynced);
  const [first, second] = streams(a) === 1 ? [a, b] : [b, a];
  assert.equal(streams(first) + streams(second), 1, 'one global watch');
  const before = changes.length;
  await first.stop();
  apply(second.store, svc('ns', 'api', '10.96.0.30'));
  await until('the change through the other brain', () => !!chained.getService('ns/api'), { timeoutMs: 5000 });
  assert.equal(streams(second), 1);
  // the other brain's full state, diffed against what the store had: one update, only the new service
  const after = changes.slice(before);
  assert.equal(after.length, 1);
  assert.deepEqual([...after[0].services], ['ns/api']);
  assert.equal(after[0].slices.size, 0);
});

function manyServices(n: number): object[] {
  const out: object[] = [];
  for (let i = 0; i < n; i++) {
    const ip = `10.96.${i >> 8}.${i & 255}`;
    out.push(svc('ns', `s${i}`, ip), slice('ns', `s${i}-1`, `s${i}`, [{ ip: `10.1.${i >> 8}.${i & 255}`, node: 'node-b', pod: `p${i}` }, { ip: `10.2.${i >> 8}.${i & 255}`, node: 'node-a', pod: `q${i}` }]));
  }
  return out;
}

test('a brain restart with resume sends only the difference (counted); without resume, everything', async () => {
  const N = 400;
  const objects = manyServices(N);
  for (const resume of [true, false]) {
    const b = brain(syncedStore(objects));
    const s = await b.start();
    const backend = new RecordingBackend();
    const node = follow([b.address], backend, { resume });
    await until('the first sync', () => backend.syncs === 1);
    const full = s.server.stats.messages;
    assert.equal(full, 1 + 3 * N + 1);
    backend.take();

    // the brain dies; one endpoint moves, one service goes, one comes; a new brain process starts on the new state
    await b.stop();
    const changed = syncedStore(objects);
    apply(changed, slice('ns', 's7-1', 's7', [{ ip: '10.1.0.7', node: 'node-b', pod: 'p7' }, { ip: '10.3.0.7', node: 'node-a', pod: 'q7' }]), svc('ns', 'new', '10.97.0.1'));
    changed.update((tx) => (tx.deleteService('ns', 's9'), tx.deleteSlice('ns', 's9-1')));
    const restarted = brain(changed, b.address);
    const r = await restarted.start();
    await until('the sync after the restart', () => backend.syncs === 2, { timeoutMs: 5000 });
    await node.streamsThrough(1);
    assert.deepEqual(backend.take().sort(), ['delete EndpointsSet ns/s9/p9', 'delete EndpointsSet ns/s9/q9', 'delete ServicesSet ns/s9', 'set EndpointsSet ns/s7/q7', 'set ServicesSet ns/new', 'sync'].sort());
    const sent = r.server.stats.messages;
    if (resume) {
      // 3 buckets resent (of 64: about 6 services each, 3 messages a service) and the Resume and Sync
      assert.ok(sent < full / 5, `resumed with ${sent} messages (full state: ${full})`);
      assert.ok(sent >= 2 + 3 + 2, `${sent}`);
    } else assert.equal(sent, 1 + 3 * (N - 1) + 1 + 1, "today's behaviour: Reset and the full state");
    await node.stop();
    await restarted.stop();
  }
});

test('resume with the node and ServiceCIDR sets: always resent, so a ServiceCIDR gone while the brain was down is deleted, and nothing else moves', async () => {
  const objects = [...smallCluster(), serviceCIDR('kubernetes', ['10.96.0.0/16']), serviceCIDR('extra', ['10.97.0.0/16'])];
  const b = brain(syncedStore(objects));
  await b.start();
  const backend = new RecordingBackend();
  follow([b.address], backend, { sets: [LocalSet.NodesSet, LocalSet.ServiceCIDRsSet] });
  await until('the first sync', () => backend.syncs === 1);
  assert.ok(backend.take().includes('set ServiceCIDRsSet extra'));
  await b.stop();
  const changed = syncedStore(objects.filter((o: any) => o.metadata.name !== 'extra'));
  const restarted = brain(changed, b.address);
  const r = await restarted.start();
  await until('the sync after the restart', () => backend.syncs === 2, { timeoutMs: 5000 });
  assert.deepEqual(backend.take(), ['delete ServiceCIDRsSet extra', 'sync']);
  // Resume, the node, the remaining ServiceCIDR, Sync: no service, no endpoint
  assert.equal(r.server.stats.messages, 4);
});

test('a resuming first diff agrees with the full one for every node: zones, zone hints, local endpoints, a service not proxied', async () => {
  const objects: object[] = [node('n1', 'z1'), node('n2', 'z1'), node('n3', 'z2'), node('n4', 'z3')];
  for (let i = 0; i < 60; i++) {
    objects.push(svc('ns', `s${i}`, `10.96.1.${i}`, i % 10 === 0 ? { type: 'ExternalName', externalName: 'x.example', clusterIP: undefined, clusterIPs: undefined } : {}));
    const hinted = i % 3 === 0;
    objects.push(
      slice('ns', `s${i}-1`, `s${i}`, [
        { ip: `10.1.1.${i}`, node: `n${1 + (i % 4)}`, pod: `a${i}`, ...(hinted ? { zoneHints: ['z1'] } : {}) },
        { ip: `10.2.1.${i}`, node: `n${1 + ((i + 1) % 4)}`, pod: `b${i}`, ...(hinted ? { zoneHints: ['z2'] } : {}) },
      ]),
    );
  }
  const store = syncedStore(objects);
  const views = new ServiceViews(store, '', { keepDecoded: false });
  const held = new Map<string, Uint8Array>();
  for (const n of ['n1', 'n2', 'n3', 'n4', 'elsewhere']) {
    const d = new LocalDiff(store, views, n);
    const f = new FilterResetSink({ send() {} });
    for (const op of d.next()) await f.send(op);
    d.close();
    held.set(n, f.heldDigests());
    const r = new LocalDiff(store, views, n, { held: held.get(n) });
    const ops = r.next();
    r.close();
    assert.deepEqual(ops.map((o) => o.kind), ['reset', 'sync'], `${n}: nothing differs`);
    assert.deepEqual(ops[0].kind === 'reset' && ops[0].resume?.resent, [], n);
  }
  // one service changes: each node gets that service's bucket back, nothing else
  apply(store, slice('ns', 's7-1', 's7', [{ ip: '10.3.1.7', node: 'n2', pod: 'c7' }]));
  for (const n of ['n1', 'n2', 'n3', 'n4']) {
    const r = new LocalDiff(store, views, n, { held: held.get(n) });
    const ops = r.next();
    r.close();
    const reset = ops[0];
    assert.ok(reset.kind === 'reset' && reset.resume?.resent.length === 1, n);
    const paths = ops.flatMap((o) => (o.kind === 'set' ? [o.path] : []));
    assert.ok(paths.includes('ns/s7') && paths.includes('ns/s7/c7'), `${n}: ${paths.join(' ')}`);
    assert.ok(paths.length < 20, `${n}: one bucket of 64 services, not all: ${paths.length}`);
  }
});

// --- as processes: two `kpng file ... to-api` brains, `kpng local --api A,B ... to-log`

const KPNG = fileURLToPath(new URL('../../bin/kpng.js', import.meta.url));

function kpng(...args: string[]) {
  const proc = spawn(process.execPath, [KPNG, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  proc.stdout!.on('data', (d) => (out += d));
  proc.stderr!.on('data', (d) => (err += d));
  const exit = new Promise<void>((resolve) => proc.on('exit', () => resolve()));
  const kill = async () => {
    if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL');
    await exit;
  };
  cleanups.push(kill);
  return { proc, out: () => out, err: () => err, kill };
}


test('brain processes: its brain SIGKILLed, the node follows the other one, the backend gets only the change; back after a restart', { timeout: 60_000 }, async () => {
  const dir = dirs.make();
  const input = join(dir, 'cluster.yaml');
  const write = (ip: string) => (writeFileSync(`${input}.tmp`, exampleClusterYaml(ip)), renameSync(`${input}.tmp`, input));
  write('10.244.1.10');
  const [p1, p2] = [`unix://${join(dir, 'b1.sock')}`, `unix://${join(dir, 'b2.sock')}`];
  const [ownAddress, otherAddress] = brainOrder([p1, p2], 'node-a');
  const brainProc = (address: string) => kpng('file', '-i', input, '--debounce', '20', 'to-api', '--listen', address, '--metrics-bind-address', '', '--state-socket', 'none');
  let own = brainProc(ownAddress);
  const other = brainProc(otherAddress);
  await until('the brains to serve', () => own.err().includes('to-api: serving') && other.err().includes('to-api: serving'), { timeoutMs: 20_000 });
  const node = kpng('local', '--api', `${p1},${p2}`, '--state-socket', 'none', '--error-delay', '20', '--failback', '300', 'to-log', '--node-name', 'node-a', '--healthz-bind-address', '', '--metrics-bind-address', '');
  const lines = () => node.out().trim().split('\n').filter(Boolean).map((l) => l.split(' {')[0]);
  await until('the first state', () => lines().includes('> sync'), { timeoutMs: 20_000 });
  assert.deepEqual(lines(), ['~ reset', '+ ServicesSet demo/web', '+ EndpointsSet demo/web/web-1', '> sync']);

  await own.kill();
  write('10.244.1.11');
  await until('the change through the other brain', () => lines().length >= 6, { timeoutMs: 20_000 });
  await sleep(300);
  assert.deepEqual(lines().slice(4), ['+ EndpointsSet demo/web/web-1', '> sync']);
  assert.match(node.out(), /10\.244\.1\.11/, 'the new endpoint IP');

  own = brainProc(ownAddress);
  await until('the node back on its own brain', () => node.err().includes('back on its own brain'), { timeoutMs: 20_000 });
  await sleep(300);
  assert.equal(lines().length, 6, `no churn: ${lines().slice(6).join(', ')}`);
  write('10.244.1.12');
  await until('a change through its own brain', () => lines().length >= 8, { timeoutMs: 20_000 });
  assert.deepEqual(lines().slice(6), ['+ EndpointsSet demo/web/web-1', '> sync']);
  await node.kill();
  await own.kill();
  await other.kill();
});
