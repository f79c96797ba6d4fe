// Done-when: under thousands of creates, updates (real and no-op) and
// deletes, with watch connections cut every few hundred events and forced
// 410s, the source ends with exactly the node-local state computed from the
// server's final objects; no-op updates produce no ops.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setImmediate as tick } from 'node:timers/promises';
import { TestApiServer, certKubeconfig } from '../helpers/apiserver.js';
import { SyntheticCluster, prng, storeFromServer, nodeState, globalStateDocument, NOOP_OPS, type ChurnOp } from '../helpers/kube-cluster.js';
import { startSource, type Running } from '../helpers/kube-test.js';
import { ServiceViews } from '../../src/localstate/views.js';
import { LocalDiff } from '../../src/diff/local-diff.js';
import { LocalSet } from '../../src/api/model.js';
import { until } from '../helpers/until.js';

const SEED = Number(process.env.KPNG_CHURN_SEED ?? 20261121);

const CHURN: Partial<Record<ChurnOp, number>> = {
  createService: 4,
  deleteService: 3,
  addPod: 8,
  removePod: 6,
  replacePod: 5,
  readinessFlap: 6,
  changePort: 2,
  toggleProxyName: 2,
  createInvalid: 1,
  serviceAnnotation: 8,
  serviceStatus: 6,
  serviceBump: 6,
  sliceAnnotation: 8,
  sliceBump: 6,
  nodeHeartbeat: 12,
  otherNodeLabel: 2,
};

describe('kube source under churn', () => {
  let dir: string;
  let server: TestApiServer;
  let cluster: SyntheticCluster;
  let run: Running;
  let local: string;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'kpng-churn-'));
    // every watch connection is cut (half-way through a line) after 250 events
    server = await new TestApiServer({ dropWatchEvery: 250 }).start();
    cluster = new SyntheticCluster(server, prng(SEED));
    cluster.populate({ services: 300, pods: 450, nodes: 10 });
    local = [...cluster.podsByNode()].sort((a, b) => b[1] - a[1])[0][0];
    run = startSource(server, certKubeconfig(join(dir, 'kubeconfig'), server.url));
    await until('initial sync', () => run.store.allSynced);
  });

  after(async () => {
    await run?.stop();
    await server?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it(`ends with exactly the server's state (seed ${SEED})`, async () => {
    const t0 = Date.now();
    let done = 0;
    for (let i = 0; i < 5000; i++) {
      if (cluster.apply(cluster.randomOp(CHURN))) done++;
      if (i % 40 === 39) await tick(); // let the client read while the churn goes on
      if (i === 1500) {
        // a forced 410 over HTTP-less path: disconnected, changed, compacted
        server.dropWatches();
        for (let j = 0; j < 50; j++) cluster.apply(cluster.randomOp(CHURN));
        server.compact();
      }
      if (i === 3500) server.expireWatches(); // in-stream ERROR 410 on live watches
    }
    await run.caughtUp(30_000);

    const expected = storeFromServer(server);
    for (const node of [local, 'node-3', 'node-unknown']) {
      assert.deepEqual(nodeState(run.store, node), nodeState(expected, node), `node-local state of ${node}`);
    }
    // the global store too, with the selectors the source uses
    const selected = storeFromServer(server, {
      services: '!service.kubernetes.io/service-proxy-name',
      endpointslices: 'kubernetes.io/service-name,!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name',
    });
    assert.deepEqual(globalStateDocument(run.store), globalStateDocument(selected));

    const stats = run.source.reflectors.map((r) => ({ resource: r.resource.plural, ...r.stats }));
    const slices = stats.find((s) => s.resource === 'endpointslices')!;
    assert.ok(done >= 4500, `${done} changes made`);
    assert.ok(slices.errors >= 5, `slice watches were cut ${slices.errors} times`);
    assert.ok(stats.every((s) => s.gone >= 1 && s.lists >= 2), 'every kind relisted after a 410');
    console.log(`churn: ${done} changes in ${Date.now() - t0} ms; ${run.store.events} events, ${run.store.rev} revisions; ${JSON.stringify(stats)}`);
  });

  it('no-op updates produce no store revision and no node-local op', async () => {
    const views = new ServiceViews(run.store);
    const diff = new LocalDiff(run.store, views, local, { sets: [LocalSet.NodesSet, LocalSet.ServiceCIDRsSet] });
    try {
      assert.ok(diff.next().length > 0, 'the full state first');
      assert.deepEqual(diff.next(), []);
      const rev = run.store.rev;
      const events = run.store.events;
      for (let i = 0; i < 2000; i++) {
        cluster.apply(NOOP_OPS[i % NOOP_OPS.length]);
        if (i % 40 === 39) await tick();
      }
      await run.caughtUp(30_000);
      assert.ok(run.store.events - events >= 1500, `the source saw the updates (${run.store.events - events} events)`);
      assert.equal(run.store.rev, rev, 'no revision');
      assert.deepEqual(diff.next(), [], 'no op');

      // labels a proxy does not use (here example.com/pool on other nodes)
      // are not even stored: no revision, no op
      const evBefore = run.store.events;
      for (let i = 0; i < 100; i++) cluster.apply('otherNodeLabel');
      await run.caughtUp();
      assert.ok(run.store.events > evBefore, 'the label updates arrived');
      assert.equal(run.store.rev, rev, 'no revision for labels a proxy does not use');
      assert.deepEqual(diff.next(), [], 'no op for this node');
    } finally {
      diff.close();
    }
  });
});
