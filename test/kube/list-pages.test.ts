// A list page's metadata read from its first bytes (pageHead): the next
// page is asked for before this one is parsed; a page whose leading
// metadata is not its own (a key twice) is listed by what its whole parse
// says.
import { describe, it, test, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pageHead } from '../../src/sources/kube/list-item.js';
import { TestApiServer, certKubeconfig } from '../helpers/apiserver.js';
import { nodeObject, serviceObject } from '../helpers/kube-cluster.js';
import { startSource, ERROR, type Running } from '../helpers/kube-test.js';
import { until } from '../helpers/until.js';

const head = (s: string) => pageHead(Buffer.from(s));

test('pageHead: the resourceVersion and continue token of a page that starts with them; nothing otherwise', () => {
  assert.deepEqual(head('{"kind":"ServiceList","apiVersion":"v1","metadata":{"resourceVersion":"42","continue":"abc"},"items":[{"metadata":{"name":"a"}}'), { rv: '42', cont: 'abc' });
  // the last page, spaces and newlines as a pretty printer writes them
  assert.deepEqual(head('{\n  "kind": "ServiceList",\n  "metadata": {\n    "resourceVersion": "7"\n  },\n  "items" : [\n'), { rv: '7', cont: undefined });
  assert.deepEqual(head('{"metadata":{"resourceVersion":"7","continue":""},"items":[]}'), { rv: '7', cont: undefined });
  // items first, no metadata, "items" as a value, not JSON, cut short before the items
  assert.equal(head('{"items":[],"metadata":{"resourceVersion":"7","continue":"abc"}}'), undefined);
  assert.equal(head('{"kind":"ServiceList","items":[]}'), undefined);
  assert.equal(head('{"kind":"items","metadata":{"resourceVersion":"7"},"items":[]}'), undefined);
  assert.equal(head('<html>"items"'), undefined);
  assert.equal(head('{"metadata":{"resourceVersion":"7","continue":"abc"}'), undefined);
  // not looked for past the first 16 KiB
  assert.equal(head(`{"metadata":{"resourceVersion":"7","selfLink":"${'x'.repeat(20_000)}"},"items":[]}`), undefined);
  // a view of a larger buffer: only its own bytes
  const big = Buffer.from('xxxx{"metadata":{"resourceVersion":"9","continue":"t"},"items":[]}');
  assert.deepEqual(pageHead(big.subarray(4)), { rv: '9', cont: 't' });
});

describe('kube source: list pages asked for early', () => {
  const cleanup: (() => Promise<void> | void)[] = [];
  afterEach(async () => {
    for (const f of cleanup.splice(0).reverse()) await f();
  });

  async function cluster(services: number): Promise<TestApiServer> {
    const server = await new TestApiServer().start();
    cleanup.push(() => server.close());
    server.put(nodeObject('node-0', 0));
    for (let i = 0; i < services; i++) server.put(serviceObject('default', `svc-${i}`, `10.96.0.${10 + i}`));
    return server;
  }

  function start(server: TestApiServer): Running {
    const dir = mkdtempSync(join(tmpdir(), 'kpng-kube-pages-'));
    cleanup.push(() => rmSync(dir, { recursive: true, force: true }));
    const run = startSource(server, certKubeconfig(join(dir, 'kubeconfig'), server.url), {}, { pageSize: 2 });
    cleanup.push(() => run.stop());
    return run;
  }

  const serviceLists = (server: TestApiServer) => server.requests.filter((r) => r.path.endsWith('/services') && r.query.watch !== 'true');

  it('every page is listed once, in order, whatever the thread takes', async () => {
    const server = await cluster(7);
    const r = start(server);
    await until('synced', () => r.store.allSynced);
    const lists = serviceLists(server);
    assert.equal(lists.length, 4, 'four pages of two');
    assert.equal(lists[0].query.continue, undefined);
    assert.equal(new Set(lists.map((x) => x.query.continue)).size, 4, 'each page asked for once');
    for (let i = 0; i < 7; i++) assert.ok(r.store.getService(`default/svc-${i}`), `svc-${i}`);
  });

  it("a page whose first bytes' continue token is not its own: the early ask is dropped, the page's own metadata is followed", async () => {
    const server = await cluster(1);
    const rv = String(server.rv);
    const item = JSON.stringify({ ...serviceObject('default', 'only', '10.96.1.1'), kind: undefined, apiVersion: undefined, metadata: { name: 'only', namespace: 'default', resourceVersion: rv, uid: 'u-only' } });
    // "metadata" twice: JSON's last one wins, and it says this is the last page
    server.failNext({ resource: 'services', watch: false }, { body: `{"kind":"ServiceList","apiVersion":"v1","metadata":{"resourceVersion":"${rv}","continue":"bogus"},"items":[${item}],"metadata":{"resourceVersion":"${rv}"}}` });
    const r = start(server);
    await until('synced', () => r.store.allSynced);
    await r.caughtUp();
    const lists = serviceLists(server);
    assert.equal(lists[0].query.continue, undefined);
    assert.ok(lists.some((x) => x.query.continue === 'bogus'), 'the next page was asked for from the first bytes');
    assert.ok(r.store.getService('default/only'));
    assert.equal(r.store.getService('default/svc-0'), undefined, 'the list ended with the page its own metadata said was the last');
    assert.deepEqual(r.records.filter((x) => x.level === ERROR).map((x) => x.msg), []);
  });
});
