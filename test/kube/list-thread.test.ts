// The kube source's large list pages of EndpointSlices and Services, parsed
// and converted in the parser thread (src/sources/parse-worker.ts): against
// the test API server, every page through the thread (pageInThreadBytes 0)
// gives the same store and the same log lines as every page parsed on the
// main thread, across pages, relists, invalid and ignored objects.
import { describe, it, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { TestApiServer, certKubeconfig } from '../helpers/apiserver.js';
import { nodeObject, serviceObject, sliceObject, storeFromServer, nodeState } from '../helpers/kube-cluster.js';
import { startSource, ERROR, type Running } from '../helpers/kube-test.js';
import { until } from '../helpers/until.js';

const cleanup: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const f of cleanup.splice(0).reverse()) await f();
});

const pod = (name: string, node: string, ip: string) => ({ name, node, ip, ready: true });

async function cluster(): Promise<TestApiServer> {
  const server = await new TestApiServer().start();
  cleanup.push(() => server.close());
  server.put(nodeObject('node-0', 0));
  server.put(nodeObject('node-1', 1));
  for (let i = 0; i < 12; i++) {
    server.put(serviceObject('default', `svc-${i}`, `10.96.0.${10 + i}`));
    server.put(sliceObject('default', `svc-${i}-x`, `svc-${i}`, [pod(`p-${i}`, `node-${i % 2}`, `10.244.0.${10 + i}`), pod(`q-${i}`, 'node-0', `10.244.1.${10 + i}`)]));
  }
  // invalid (a port out of range) and ignored (no service-name label)
  const bad = sliceObject('default', 'svc-0-bad', 'svc-0', [pod('b-0', 'node-0', '10.244.2.1')]);
  bad.ports[0].port = 70000;
  server.put(bad);
  const unowned = sliceObject('default', 'stray', 'svc-1', [pod('s-0', 'node-0', '10.244.3.1')]);
  delete unowned.metadata.labels['kubernetes.io/service-name'];
  server.put(unowned);
  // Services: one with every kind of field a Service carries over, one invalid
  const rich = serviceObject('default', 'rich', '10.96.1.1');
  rich.metadata.labels = { app: 'rich', 'service.kubernetes.io/topology-mode': 'Auto' };
  rich.metadata.annotations = { note: 'kept' };
  Object.assign(rich.spec, {
    type: 'LoadBalancer',
    ports: [
      { name: 'http', port: 80, targetPort: 8080, protocol: 'TCP', nodePort: 30080 },
      { name: 'dns', port: 53, targetPort: 'dns', protocol: 'UDP', nodePort: 30053 },
    ],
    externalIPs: ['192.0.2.7'],
    sessionAffinity: 'ClientIP',
    sessionAffinityConfig: { clientIP: { timeoutSeconds: 600 } },
    externalTrafficPolicy: 'Local',
    healthCheckNodePort: 31000,
    loadBalancerSourceRanges: ['198.51.100.0/24'],
  });
  rich.status = { loadBalancer: { ingress: [{ ip: '203.0.113.9' }] } };
  server.put(rich);
  const badSvc = serviceObject('default', 'svc-bad', '10.96.1.2');
  badSvc.spec.ports[0].port = 70000;
  server.put(badSvc);
  return server;
}

/** a source whose slice pages all go through the thread (or none), its pages of 3 objects */
function start(server: TestApiServer, inThread: boolean): Running {
  const dir = mkdtempSync(join(tmpdir(), 'kpng-kube-thread-'));
  cleanup.push(() => rmSync(dir, { recursive: true, force: true }));
  const run = startSource(server, certKubeconfig(join(dir, 'kubeconfig'), server.url), {}, { pageSize: 3, pageInThreadBytes: inThread ? 0 : Number.MAX_SAFE_INTEGER });
  cleanup.push(() => run.stop());
  return run;
}

const slices = (r: Running) => r.source.reflectors.find((x) => x.resource.kind === 'EndpointSlice')!;
const services = (r: Running) => r.source.reflectors.find((x) => x.resource.kind === 'Service')!;
/** every Service the store holds, as it holds it */
const storedServices = (r: Running) => new Map([...r.store.serviceKeys()].sort().map((k) => [k, r.store.getService(k)!.service]));
const errors = (r: Running) => r.records.filter((x) => x.level === ERROR).map((x) => ({ object: x.object, field: x.field, msg: x.msg }));

describe('kube source: list pages of slices and Services in the parser thread', () => {
  it('give the store and the log lines that parsing them here gives, across pages and a relist', async () => {
    const runs: Record<string, { r: Running; server: TestApiServer }> = {};
    for (const mode of ['here', 'thread']) {
      const server = await cluster();
      const r = start(server, mode === 'thread');
      await until(`${mode}: synced`, () => r.store.allSynced);
      await r.caughtUp();
      runs[mode] = { r, server };
    }
    const { here, thread } = runs;
    assert.equal(slices(here.r).stats.pagesInThread, 0);
    assert.ok(slices(thread.r).stats.pagesInThread >= 5, `pages parsed in the thread: ${slices(thread.r).stats.pagesInThread}`);
    for (const node of ['node-0', 'node-1']) {
      assert.deepEqual(nodeState(thread.r.store, node), nodeState(storeFromServer(thread.server), node), node);
      assert.deepEqual(nodeState(thread.r.store, node), nodeState(here.r.store, node), node);
    }
    assert.equal(services(here.r).stats.pagesInThread, 0);
    assert.ok(services(thread.r).stats.pagesInThread >= 4, `Service pages parsed in the thread: ${services(thread.r).stats.pagesInThread}`);
    // the Services as the store keeps them, whichever thread converted them
    assert.equal(storedServices(thread.r).size, 13);
    assert.deepEqual(storedServices(thread.r), storedServices(here.r));
    assert.equal(storedServices(thread.r).get('default/rich')!.Labels['service.kubernetes.io/topology-mode'], 'Auto');
    assert.deepEqual(errors(thread.r), errors(here.r));
    assert.deepEqual(errors(thread.r).map((e) => e.object).sort(), ['EndpointSlice default/svc-0-bad', 'Service default/svc-bad']);
    assert.equal(thread.r.store.getSlice('default/stray'), undefined);
    assert.ok(thread.r.store.getSlice('default/svc-1-x'));

    // a slice turning invalid, a Service changed (its watch event is taken
    // here, and compared with what the thread converted), then a relist
    // (the watch expired): the slice's last good version stays, reported once
    for (const { r, server } of [here, thread]) {
      server.modify('EndpointSlice', 'default/svc-2-x', (o) => (o.ports[0].port = 70001));
      server.modify('Service', 'default/rich', (o) => (o.spec.externalIPs = ['192.0.2.8']));
      await until('the invalid change reported', () => errors(r).length === 3);
      await until('the Service change taken', () => r.store.getService('default/rich')?.service.IPs?.ExternalIPs?.V4[0] === '192.0.2.8');
      const lists = slices(r).stats.lists;
      server.expireWatches();
      await until('relisted', () => slices(r).stats.lists > lists);
      await r.caughtUp();
    }
    assert.deepEqual(errors(thread.r), errors(here.r));
    assert.ok(errors(thread.r).some((e) => /svc-2-x.*keeping its last good version/.test(e.msg)));
    assert.ok(slices(thread.r).stats.pagesInThread >= 10);
    assert.deepEqual(storedServices(thread.r), storedServices(here.r));
    for (const node of ['node-0', 'node-1']) assert.deepEqual(nodeState(thread.r.store, node), nodeState(here.r.store, node), node);
  });

  it('a page the thread cannot take fails the list as one parsed here would (retried), naming the path; the thread stays in use', async () => {
    const server = await cluster();
    // the slices' first answer is not JSON, the second has no items; the third is right
    server.failNext({ resource: 'endpointslices', watch: false }, { body: '{"items": [' });
    server.failNext({ resource: 'endpointslices', watch: false }, { body: '{"kind": "EndpointSliceList", "metadata": {"resourceVersion": "1"}}' });
    const r = start(server, true);
    await until('synced after the retry', () => r.store.allSynced);
    await r.caughtUp();
    assert.ok(r.records.some((x) => /endpointslices list failed: .*\/endpointslices: the answer is not JSON/.test(x.msg)), 'the failure is logged with the path');
    assert.ok(r.records.some((x) => /endpointslices list failed: .*\/endpointslices: the list has no items/.test(x.msg)));
    assert.ok(slices(r).stats.pagesInThread >= 5);
    assert.deepEqual(nodeState(r.store, 'node-0'), nodeState(storeFromServer(server), 'node-0'));
  });

  it('a parser thread that fails fails that list (retried); the reflector parses here from then on', async () => {
    const server = await cluster();
    const r = start(server, true);
    // a thread that cannot parse (it could not start, it ran out of memory)
    for (const x of r.source.reflectors) (x as unknown as { parser: unknown }).parser = { parsePage: () => Promise.reject(new Error('worker out of memory')) };
    await until('synced after the retry', () => r.store.allSynced);
    await r.caughtUp();
    assert.ok(r.records.some((x) => /endpointslices: the parser thread failed \(worker out of memory\); parsing here from now on/.test(x.msg)));
    assert.ok(r.records.some((x) => /endpointslices list failed: worker out of memory/.test(x.msg)), 'the list failed and was retried');
    assert.equal(slices(r).stats.pagesInThread, 0);
    assert.deepEqual(nodeState(r.store, 'node-0'), nodeState(storeFromServer(server), 'node-0'));
  });
});
