// The kube source's reflector against the test API server: what it asks,
// readiness, pagination, resuming, 410 relists, backoff, the idle watchdog,
// resources that are not served, invalid objects, batching.
import { describe, it, beforeEach, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { TestApiServer, certKubeconfig, type RequestRecord, type ApiServerOptions } from '../helpers/apiserver.js';
import { nodeObject, serviceObject, sliceObject, storeFromServer, nodeState, globalStateDocument } from '../helpers/kube-cluster.js';
import { startSource, WARN, ERROR, type Running } from '../helpers/kube-test.js';
import { Backoff, type ReflectorOptions } from '../../src/sources/kube/reflector.js';
import type { KubeSourceOptions } from '../../src/sources/kube/index.js';
import { until } from '../helpers/until.js';

let dir: string;
let server: TestApiServer;
let run: Running | undefined;

async function setup(opts: ApiServerOptions = {}) {
  server = await new TestApiServer(opts).start();
  return server;
}

function start(opts: Partial<KubeSourceOptions> = {}, reflector: Partial<ReflectorOptions> = {}): Running {
  run = startSource(server, certKubeconfig(join(dir, 'kubeconfig'), server.url), opts, reflector);
  return run;
}

const pod = (name: string, node: string, ip: string, ready = true) => ({ name, node, ip, ready });
const watchesOf = (resource: string): RequestRecord[] => server.requests.filter((r) => r.path.endsWith(`/${resource}`) && r.query.watch === 'true');
const listsOf = (resource: string): RequestRecord[] => server.requests.filter((r) => r.path.endsWith(`/${resource}`) && r.query.watch === undefined);
const warnings = (r: Running, re: RegExp) => r.records.filter((x) => x.level === WARN && re.test(x.msg));

function seed(services = 3) {
  server.put(nodeObject('node-0', 0));
  server.put(nodeObject('node-1', 1));
  for (let i = 0; i < services; i++) {
    server.put(serviceObject('default', `svc-${i}`, `10.96.0.${10 + i}`));
    server.put(sliceObject('default', `svc-${i}-x`, `svc-${i}`, [pod(`p-${i}`, `node-${i % 2}`, `10.244.0.${10 + i}`)]));
  }
}

/** the source's node-local state equals the one computed from the server's objects */
async function assertMatchesServer(r: Running, node = 'node-0') {
  await r.caughtUp();
  assert.deepEqual(nodeState(r.store, node), nodeState(storeFromServer(server), node));
}

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'kpng-kube-'));
  run = undefined;
});

afterEach(async () => {
  await run?.stop();
  await server?.close();
  rmSync(dir, { recursive: true, force: true });
});

describe('kube source: requests', () => {
  it('lists with limit=500 and selectors, then watches from the list resourceVersion with bookmarks and a random timeout', async () => {
    await setup();
    seed();
    const r = start({}, { pageSize: 500, watchTimeoutSeconds: [300, 600] });
    await until('synced and watching', () => r.store.allSynced && server.watchCount === 4);
    const [svcList] = listsOf('services');
    assert.equal(svcList.query.limit, '500');
    assert.equal(svcList.query.labelSelector, '!service.kubernetes.io/service-proxy-name');
    assert.equal(
      listsOf('endpointslices')[0].query.labelSelector,
      'kubernetes.io/service-name,!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name',
    );
    assert.equal(listsOf('nodes')[0].query.fieldSelector, undefined);
    for (const res of ['services', 'endpointslices', 'nodes', 'servicecidrs']) {
      const [w] = watchesOf(res);
      assert.ok(w, `a ${res} watch`);
      assert.equal(w.query.allowWatchBookmarks, 'true');
      const t = Number(w.query.timeoutSeconds);
      assert.ok(t >= 300 && t <= 600, `timeoutSeconds ${t}`);
    }
    // the watch starts where the list was
    assert.equal(watchesOf('services')[0].query.resourceVersion, String(server.rv));
  });

  it('with --service-proxy-name and --watch-node: only that proxy name, only that node', async () => {
    await setup();
    seed();
    server.put(serviceObject('default', 'mine', '10.96.1.1', { labels: { 'service.kubernetes.io/service-proxy-name': 'kpng' } }));
    const r = start({ serviceProxyName: 'kpng', watchNode: 'node-1' });
    await until('synced', () => r.store.allSynced);
    await r.caughtUp();
    assert.equal(listsOf('services')[0].query.labelSelector, 'service.kubernetes.io/service-proxy-name=kpng');
    assert.match(listsOf('endpointslices')[0].query.labelSelector, /,service\.kubernetes\.io\/service-proxy-name=kpng$/);
    assert.equal(listsOf('nodes')[0].query.fieldSelector, 'metadata.name=node-1');
    assert.deepEqual([...r.store.serviceKeys()], ['default/mine']);
    assert.deepEqual([...r.store.allNodes()].map((n) => n.node.Name), ['node-1']);
  });
});

describe('kube source: readiness', () => {
  it('marks nothing synced until every kind has listed once, also when a kind is empty', async () => {
    await setup();
    server.put(nodeObject('node-0', 0)); // services, slices and ServiceCIDRs are empty
    server.failNext({ resource: 'endpointslices', watch: false }, { delayMs: 300 });
    const r = start();
    await until('the other kinds', () => r.store.isSynced('services') && r.store.isSynced('nodes') && r.store.isSynced('serviceCIDRs'));
    assert.equal(r.store.allSynced, false, 'slices have not listed yet');
    assert.equal(r.store.isSynced('endpointSlices'), false);
    await until('all kinds synced', () => r.store.allSynced);
    assert.deepEqual([...r.store.allNodes()].map((n) => n.node.Name), ['node-0']);
  });

  it('keeps retrying a failing first list (with backoff) and becomes ready when it succeeds', async () => {
    await setup();
    seed();
    server.failNext({ resource: 'services', watch: false }, { status: 500 }, 3);
    const r = start();
    await until('synced', () => r.store.allSynced);
    assert.equal(warnings(r, /services list failed: HTTP 500/).length, 3);
    assert.equal(r.store.getService('default/svc-0')?.service.Name, 'svc-0');
  });

  it('one list is one store revision', async () => {
    await setup();
    seed(50);
    const r = start();
    await until('synced', () => r.store.allSynced);
    // four kinds listed: at most one revision each
    assert.ok(r.store.rev <= 4, `rev ${r.store.rev}`);
    assert.equal([...r.store.serviceKeys()].length, 50);
  });
});

describe('kube source: pagination', () => {
  it('follows continue tokens and gets a consistent snapshot even if objects change between pages', async () => {
    await setup();
    seed(50);
    // hold the second page while the cluster changes
    server.failNext({ resource: 'services', watch: false, when: (q) => q.query.continue !== undefined }, { delayMs: 200 });
    const r = start({}, { pageSize: 7 });
    await until('the second page', () => listsOf('services').length >= 2);
    server.delete('Service', 'default/svc-0');
    server.put(serviceObject('default', 'svc-late', '10.96.2.2'));
    await until('synced', () => r.store.allSynced);
    assert.equal(listsOf('services').length, 8, '50 services in pages of 7');
    await assertMatchesServer(r);
    assert.equal(r.store.getService('default/svc-0'), undefined);
    assert.ok(r.store.getService('default/svc-late'));
  });

  it('starts the list over when the continue token expired (410)', async () => {
    await setup();
    seed(20);
    server.failNext({ resource: 'services', watch: false, when: (q) => q.query.continue !== undefined }, { status: 410, reason: 'Expired' });
    const r = start({}, { pageSize: 5 });
    await until('synced', () => r.store.allSynced);
    assert.equal(warnings(r, /continue token expired/).length, 1);
    assert.equal([...r.store.serviceKeys()].length, 20);
    assert.equal(listsOf('services').filter((q) => !q.query.continue).length, 2, 'listed from the start twice');
  });

  for (const fault of [{ status: 410, reason: 'Expired' }, { status: 500 }]) {
    it(`a first list writes each page as it comes; listed again (${fault.status === 410 ? 'its continue token expired' : 'it failed'}), it deletes what the pages written had and the server no longer has`, async () => {
      await setup();
      seed(20);
      const continued = { resource: 'services', watch: false, when: (q: RequestRecord) => q.query.continue !== undefined } as const;
      server.failNext(continued, { delayMs: 300 });
      server.failNext(continued, fault);
      const r = start({}, { pageSize: 5, backoffMinMs: 10 });
      // the first page is in the store while the second is held
      await until('the first page written', () => !!r.store.getService('default/svc-0'));
      assert.equal(r.store.isSynced('services'), false);
      server.delete('Service', 'default/svc-0');
      await until('synced', () => r.store.allSynced);
      assert.equal(listsOf('services').filter((q) => !q.query.continue).length, 2, 'listed from the start twice');
      assert.equal(r.store.getService('default/svc-0'), undefined);
      assert.equal([...r.store.serviceKeys()].length, 19);
      await assertMatchesServer(r);
    });
  }
});

describe('kube source: faults', () => {
  it('resumes a dropped watch from the last resourceVersion seen, without relisting', async () => {
    await setup();
    seed();
    const r = start();
    await until('watching', () => server.watchCount === 4);
    server.put(serviceObject('default', 'svc-a', '10.96.3.1'));
    await r.caughtUp();
    const rvSeen = r.source.reflectors[0].resourceVersion;
    assert.equal(server.dropWatches(), 4);
    server.put(serviceObject('default', 'svc-b', '10.96.3.2')); // while disconnected
    await until('the change made while disconnected', () => !!r.store.getService('default/svc-b'));
    const resumed = watchesOf('services').at(-1)!;
    assert.equal(resumed.query.resourceVersion, rvSeen);
    assert.equal(listsOf('services').length, 1, 'no relist');
    assert.ok(warnings(r, /services watch failed: connection dropped/).length >= 1);
    await assertMatchesServer(r);
  });

  it('a watch that delivered events before it dropped retries at the minimum delay again', async () => {
    await setup({ dropWatchEvery: 20 });
    seed();
    const r = start({}, { backoffMinMs: 10, backoffMaxMs: 5000 });
    await until('watching', () => server.watchCount === 4);
    for (let i = 0; i < 200; i++) server.put(serviceObject('drops', `s-${i}`, `10.96.20.${i}`));
    await r.caughtUp();
    const w = warnings(r, /services watch failed: connection dropped mid-stream/);
    assert.ok(w.length >= 9, `${w.length} drops`);
    for (const x of w) assert.ok(Number(x.retryInMs) <= 10, `each drop after progress retries in [5, 10] ms: ${w.map((x) => x.retryInMs)}`);
  });

  it('bookmarks move the resourceVersion it resumes from', async () => {
    await setup();
    seed();
    const r = start();
    await until('watching', () => server.watchCount === 4);
    for (let i = 0; i < 5; i++) server.modify('Node', 'node-1'); // other resources move the resourceVersion
    server.bookmark();
    const want = String(server.rv);
    await until('the bookmark', () => r.source.reflectors[0].resourceVersion === want);
    server.dropWatches();
    await until('a new watch', () => watchesOf('services').length === 2);
    assert.equal(watchesOf('services')[1].query.resourceVersion, want);
  });

  for (const mode of ['http', 'event'] as const) {
    it(`relists on 410 Gone (${mode === 'http' ? 'HTTP status' : 'in-stream ERROR event'}) and deletes what vanished, in one revision`, async () => {
      await setup({ expiredWatch: mode });
      seed(5);
      const r = start();
      await until('watching', () => server.watchCount === 4);
      await r.caughtUp();
      const rev = r.store.rev;
      // while disconnected: one deleted, one changed, one added, then the history is compacted
      server.dropWatches();
      server.delete('Service', 'default/svc-1');
      server.delete('EndpointSlice', 'default/svc-1-x');
      server.modify('EndpointSlice', 'default/svc-2-x', (o) => (o.endpoints[0].conditions.ready = false));
      server.put(serviceObject('default', 'svc-new', '10.96.4.1'));
      server.compact();
      await until('every kind relisted', () => r.source.reflectors.every((x) => x.stats.lists === 2));
      await assertMatchesServer(r);
      assert.equal(r.store.getService('default/svc-1'), undefined);
      assert.equal(r.store.getSlice('default/svc-1-x'), undefined);
      assert.ok(r.store.getService('default/svc-new'));
      assert.ok(r.store.rev - rev <= 2, `services and slices relisted: at most one revision each (moved ${r.store.rev - rev})`);
      assert.ok(warnings(r, /expired \(410 Gone\); relisting/).length >= 4);
    });
  }

  it('a relist that finds nothing new changes nothing (no revision)', async () => {
    await setup();
    seed(5);
    const r = start();
    await until('watching', () => server.watchCount === 4);
    await r.caughtUp();
    const rev = r.store.rev;
    const events = r.store.events;
    assert.equal(server.expireWatches(), 4); // ERROR 410 to live watches
    await until('relisted', () => r.source.reflectors.every((x) => x.stats.lists === 2));
    r.source.flush();
    assert.equal(r.store.rev, rev);
    assert.equal(r.store.events, events, 'unchanged objects (same resourceVersion) are not even rewritten');
  });

  it('backs off exponentially with jitter on 500s, logs each retry with its cause, and recovers', async () => {
    await setup();
    seed();
    const r = start({}, { backoffMinMs: 20, backoffMaxMs: 1000 });
    await until('watching', () => server.watchCount === 4);
    server.failNext({ resource: 'services', watch: true }, { status: 500, message: 'etcd is sad' }, 5);
    server.dropWatches();
    server.put(serviceObject('default', 'after', '10.96.5.1'));
    await until('recovery', () => !!r.store.getService('default/after'));
    const w = warnings(r, /services watch failed: HTTP 500 InternalError: etcd is sad; retrying in \d+ ms/);
    assert.equal(w.length, 5);
    const delays = w.map((x) => Number(x.retryInMs));
    // the drop took the first step (d = 20 ms); each next retry is at least as long
    for (let i = 1; i < delays.length; i++) assert.ok(delays[i] >= delays[i - 1], `delays ${delays}`);
    assert.ok(delays[0] >= 20 && delays[0] <= 40, `1st 500: d = 40 ms: ${delays}`);
    assert.ok(delays[4] >= 320 && delays[4] <= 640, `5th 500: d = 640 ms: ${delays}`);
  });

  it('waits at least Retry-After on 429 (API priority and fairness)', async () => {
    await setup();
    seed();
    const r = start({}, { backoffMinMs: 10, backoffMaxMs: 5000 });
    await until('watching', () => server.watchCount === 4);
    server.failNext({ resource: 'services', watch: true }, { status: 429, reason: 'TooManyRequests', retryAfterSeconds: 1 });
    server.dropWatches();
    const t0 = Date.now();
    server.put(serviceObject('default', 'after', '10.96.5.2'));
    await until('recovery', () => !!r.store.getService('default/after'));
    assert.ok(Date.now() - t0 >= 1000, `waited ${Date.now() - t0} ms`);
    assert.equal(warnings(r, /services watch failed: HTTP 429 TooManyRequests.*retrying in 1000 ms/).length, 1);
  });

  it('does not loop tightly when watches close at once without an event', async () => {
    await setup();
    seed();
    const r = start({}, { backoffMinMs: 10, backoffMaxMs: 80 });
    await until('watching', () => server.watchCount === 4);
    await r.caughtUp(); // the watch has had an event (a bookmark): its clean end is normal
    server.failNext({ resource: 'services', watch: true }, { close: true }, 8);
    const t0 = Date.now();
    server.closeWatches();
    server.put(serviceObject('default', 'after', '10.96.5.1'));
    await until('recovery', () => !!r.store.getService('default/after'));
    assert.equal(warnings(r, /services watch failed: the watch closed at once without an event/).length, 8);
    // 10 + 20 + 40 + 80*5 = 470 ms of nominal delay, at least half of it with jitter
    assert.ok(Date.now() - t0 >= 235, `took ${Date.now() - t0} ms`);
    assert.equal(listsOf('services').length, 1);
  });

  it('a watch closed cleanly by the server is resumed at once (no warning)', async () => {
    await setup({ maxWatchSeconds: 1 });
    seed();
    const r = start();
    await until('watches ended by timeoutSeconds and resumed', () => watchesOf('services').length >= 3, { timeoutMs: 5000 });
    assert.equal(warnings(r, /services/).length, 0);
    server.put(serviceObject('default', 'later', '10.96.5.9'));
    await until('events still flow', () => !!r.store.getService('default/later'));
  });

  it('the idle watchdog drops a silent watch and resumes (nothing is lost)', async () => {
    await setup();
    seed();
    server.failNext({ resource: 'services', watch: true }, { hang: 'body' });
    const r = start({}, { idleTimeoutMs: 300 });
    await until('synced', () => r.store.allSynced);
    server.put(serviceObject('default', 'during-hang', '10.96.6.1'));
    await until('the change, after the watchdog fired', () => !!r.store.getService('default/during-hang'), { timeoutMs: 5000 });
    assert.equal(warnings(r, /services watch failed: no event or bookmark for 300 ms/).length, 1);
  });

  it('a request whose answer never starts times out and is retried', async () => {
    await setup();
    seed();
    server.failNext({ resource: 'services', watch: false }, { hang: 'headers' });
    const r = start({}, { requestTimeoutMs: 300 });
    await until('synced', () => r.store.allSynced, { timeoutMs: 5000 });
    assert.equal(warnings(r, /services list failed: no answer in 300 ms/).length, 1);
  });

  it('slow answers are waited for', async () => {
    await setup();
    seed();
    server.failNext({ resource: 'services', watch: false }, { delayMs: 400 });
    server.failNext({ resource: 'services', watch: true }, { delayMs: 400 });
    const r = start();
    await until('synced', () => r.store.allSynced);
    server.put(serviceObject('default', 'slow', '10.96.7.1'));
    await until('the event', () => !!r.store.getService('default/slow'));
    assert.equal(warnings(r, /services/).length, 0);
  });

  it('a dropped connection without an answer is retried', async () => {
    await setup();
    seed();
    server.failNext({ resource: 'endpointslices', watch: false }, { drop: true });
    const r = start();
    await until('synced', () => r.store.allSynced);
    assert.equal(warnings(r, /endpointslices list failed/).length, 1);
  });
});

describe('kube source: answers without bounds', () => {
  const MiB = 2 ** 20;

  it('drops a watch whose event line never ends at 16 MiB and relists; the other kinds keep working', async () => {
    await setup();
    seed();
    // an endless line (the safety valve stops the server at 64 MiB, so that the test process survives the old code)
    server.failNext({ resource: 'services', watch: true }, { endless: true, maxBytes: 64 * MiB });
    const r = start();
    await until('synced, services watched', () => r.store.allSynced && watchesOf('services').length >= 1);
    server.put(nodeObject('node-2', 2));
    await until('a Node event while the services watch streams its endless line', () => r.store.getNode('node-2') !== undefined);
    await until('services relisted after the endless line', () => listsOf('services').length === 2, { timeoutMs: 20_000 });
    // what the server could send before the client dropped it: the limit plus what socket buffers hold
    const sent = watchesOf('services')[0].bytes!;
    assert.ok(sent > 16 * MiB && sent < 24 * MiB, `sent ${(sent / MiB).toFixed(1)} MiB`);
    const w = warnings(r, /services: a watch event is larger than 16 MiB/);
    assert.equal(w.length, 1, 'one line naming the resource');
    assert.match(w[0].msg, /dropping the connection and relisting/);
    server.put(serviceObject('default', 'after', '10.96.9.1'));
    await until('services events again', () => !!r.store.getService('default/after'));
    await assertMatchesServer(r);
  });

  it('a list page larger than the list bound is a failure (retried), not a memory hog', async () => {
    await setup();
    seed();
    server.failNext({ resource: 'endpointslices', watch: false }, { endless: true, maxBytes: 64 * MiB });
    const r = start({}, { maxListBytes: 2 * MiB });
    await until('synced', () => r.store.allSynced);
    assert.equal(warnings(r, /endpointslices list failed: the answer is larger than 2 MiB/).length, 1);
    const sent = listsOf('endpointslices')[0].bytes!;
    assert.ok(sent < 10 * MiB, `sent ${(sent / MiB).toFixed(1)} MiB`);
    await assertMatchesServer(r);
  });

  it('a legal event of several MiB, split over many chunks and with multi-byte characters, arrives whole', async () => {
    await setup();
    seed();
    const r = start();
    await until('watching', () => server.watchCount === 4);
    const big = serviceObject('default', 'big', '10.96.9.2');
    big.metadata.annotations = { note: 'é€'.repeat(600_000) }; // 3 MiB of UTF-8
    server.put(big);
    await until('the big event', () => !!r.store.getService('default/big'));
    assert.equal(warnings(r, /services/).length, 0);
    assert.equal(listsOf('services').length, 1);
  });
});

describe('kube source: 410 Gone in a loop', () => {
  it('backs off (growing delays, jitter, capped) and logs few lines while every watch gets 410; an event ends the series', async () => {
    await setup();
    seed();
    const r = start({}, { backoffMinMs: 10, backoffMaxMs: 200 });
    await until('watching', () => server.watchCount === 4);
    await r.caughtUp();
    const watches0 = watchesOf('services').length;
    const lines0 = r.records.length;
    server.failNext({ resource: 'services', watch: true }, { status: 410, reason: 'Expired' }, 100_000);
    server.expireWatches(); // the first 410 of the series, in-stream, for every kind
    await new Promise((res) => setTimeout(res, 2000));
    const watches = watchesOf('services').length - watches0;
    // delays 0, then d doubling from 10 ms to 200 ms, each in [d/2, d]: at most 24 watches in 2 s (the old code: hundreds)
    assert.ok(watches >= 5 && watches <= 26, `${watches} services watches in 2 s`);
    const lines = r.records.slice(lines0).filter((x) => x.level >= WARN && /\bservices\b/.test(x.msg));
    assert.ok(lines.length >= 2 && lines.length <= 12, `${lines.length} log lines:\n${lines.map((x) => x.msg).join('\n')}`);
    const delays = lines.filter((x) => /410 Gone/.test(x.msg)).map((x) => Number(x.retryInMs));
    assert.equal(delays[0], 0, 'the first 410 relists at once');
    for (let i = 1; i < delays.length; i++) assert.ok(delays[i] >= delays[i - 1] / 2 && delays[i] <= 200, `delays ${delays}`);
    assert.ok(delays.at(-1)! >= 100, `capped at 200 ms, at least half of it: ${delays}`);
    assert.match(lines.at(-1)!.msg + lines.at(-2)!.msg, /\d+ times in a row/);

    // the server heals: the next watch delivers events, and the series is over
    server.clearFaults();
    server.put(serviceObject('default', 'after', '10.96.5.3'));
    await until('recovery', () => !!r.store.getService('default/after'), { timeoutMs: 2000 });
    await r.caughtUp();
    // (that one may have come with a relist, still in the series: one more, on the live watch)
    server.put(serviceObject('default', 'after2', '10.96.5.4'));
    await until('an event on the watch', () => !!r.store.getService('default/after2'), { timeoutMs: 2000 });
    await r.caughtUp();
    const lines1 = r.records.length;
    server.expireWatches();
    await until('the next 410', () => r.records.slice(lines1).some((x) => /services: resourceVersion \d+ expired \(410 Gone\)/.test(x.msg)));
    const again = r.records.slice(lines1).find((x) => /services: resourceVersion \d+ expired/.test(x.msg))!;
    assert.equal(Number(again.retryInMs), 0, 'a 410 after an event relists at once');
  });
});

describe('kube source: resources not served', () => {
  it('skips ServiceCIDRs when discovery does not list them: synced, logged once, never asked again', async () => {
    await setup({ serveServiceCIDRs: false });
    seed();
    const r = start();
    await until('synced', () => r.store.allSynced);
    await new Promise((res) => setTimeout(res, 100));
    const logs = r.records.filter((x) => /servicecidrs are not served/.test(x.msg));
    assert.equal(logs.length, 1);
    assert.equal(server.requests.filter((q) => q.path.includes('servicecidrs')).length, 0);
    assert.equal(server.requests.filter((q) => q.path === '/apis/networking.k8s.io/v1').length, 1);
  });

  it('skips a kind whose list answers 404, and ServiceCIDRs on 403 (RBAC)', async () => {
    await setup();
    seed();
    server.failNext({ resource: 'servicecidrs', watch: false }, { status: 403, reason: 'Forbidden' });
    const r = start();
    await until('synced', () => r.store.allSynced);
    assert.equal(warnings(r, /servicecidrs: forbidden/).length, 1);
    assert.equal(r.source.reflectors[3].served, false);
  });
});

describe('kube source: objects', () => {
  it('skips an invalid object with one log line naming it and the field, applies the rest, keeps the last good version', async () => {
    await setup();
    seed();
    const bad = serviceObject('default', 'bad', '10.96.8.1');
    bad.spec.ports[0].port = 70000;
    server.put(bad);
    const r = start();
    await until('synced', () => r.store.allSynced);
    await r.caughtUp();
    const errs = () => r.records.filter((x) => x.level === ERROR);
    assert.equal(errs().length, 1);
    assert.equal(errs()[0].object, 'Service default/bad');
    assert.equal(errs()[0].field, 'spec.ports[0].port');
    assert.match(errs()[0].msg, /skipping invalid Service default\/bad: spec\.ports\[0\]\.port: 70000 is out of range/);
    assert.ok(r.store.getService('default/svc-0'));
    assert.equal(r.store.getService('default/bad'), undefined);

    // a relist of the same version does not report it again
    server.expireWatches();
    await until('relisted', () => r.source.reflectors[0].stats.lists === 2);
    assert.equal(errs().length, 1);

    // a valid service that turns invalid keeps its last good version
    server.modify('Service', 'default/svc-0', (o) => (o.spec.clusterIP = o.spec.clusterIPs[0] = 'not-an-ip'));
    await r.caughtUp();
    assert.equal(errs().length, 2);
    assert.match(errs()[1].msg, /keeping its last good version/);
    assert.deepEqual(r.store.getService('default/svc-0')?.service.IPs?.ClusterIPs?.V4, ['10.96.0.10']);
  });

  it('an object that leaves the selector (headless, other proxy) is deleted from the store', async () => {
    await setup();
    seed();
    const r = start();
    await until('synced', () => r.store.allSynced);
    server.modify('EndpointSlice', 'default/svc-0-x', (o) => (o.metadata.labels['service.kubernetes.io/headless'] = ''));
    server.modify('Service', 'default/svc-1', (o) => (o.metadata.labels['service.kubernetes.io/service-proxy-name'] = 'other'));
    await r.caughtUp();
    assert.equal(r.store.getSlice('default/svc-0-x'), undefined);
    assert.equal(r.store.getService('default/svc-1'), undefined);
    assert.ok(r.store.getService('default/svc-2'));
  });

  it('applies a burst of watch events in few store updates', async () => {
    await setup();
    seed();
    const r = start();
    await until('watching', () => server.watchCount === 4);
    await r.caughtUp();
    const rev = r.store.rev;
    const events = r.store.events;
    for (let i = 0; i < 300; i++) server.put(serviceObject('burst', `s-${i}`, `10.96.${10 + (i >> 8)}.${i & 255}`));
    await r.caughtUp();
    assert.equal(r.store.events - events, 300);
    assert.ok(r.store.rev - rev < 30, `300 events in ${r.store.rev - rev} revisions`);
  });
});

describe('kube source: stop', () => {
  it('stop() closes every watch and pending retry', async () => {
    await setup();
    seed();
    const r = start();
    await until('watching', () => server.watchCount === 4);
    await r.stop();
    run = undefined;
    await until('watches closed on the server side', () => server.watchCount === 0, { timeoutMs: 2000 });
    assert.equal(r.store.allSynced, true);
  });
});

describe('Backoff', () => {
  it('doubles from min to max with jitter in [d/2, d] and resets', () => {
    let x = 0;
    const b = new Backoff(100, 30_000, () => x);
    const lows = Array.from({ length: 12 }, () => b.next());
    assert.deepEqual(lows, [50, 100, 200, 400, 800, 1600, 3200, 6400, 12800, 15000, 15000, 15000]);
    b.reset();
    x = 0.999999;
    assert.equal(b.next(), 100);
  });
});

// keep the helper import used when a test is skipped
void globalStateDocument;
