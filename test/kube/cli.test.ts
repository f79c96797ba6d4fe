// `kpng kube ...` as a real process (node bin/kpng.js) against the test API
// server: to-file prints the expected state; to-local to-log shows each
// change once (no-op updates and relists show nothing).
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseAllDocuments } from 'yaml';
import { TestApiServer, certKubeconfig } from '../helpers/apiserver.js';
import { SyntheticCluster, prng, storeFromServer, globalStateDocument, serviceObject, sliceObject, NOOP_OPS } from '../helpers/kube-cluster.js';
import { kpngSpawn } from '../helpers/cli.js';

/** A running `node bin/kpng.js ...`; stop() it in a finally. */
const kpng = (args: string[]) => kpngSpawn(args, { bin: true, env: { KPNG_LOG_LEVEL: 'info' } });
/** the process starts from bin/, as built: slower than the sources' */
const WAIT = { timeoutMs: 30_000 };

const SELECTORS = {
  services: '!service.kubernetes.io/service-proxy-name',
  endpointslices: 'kubernetes.io/service-name,!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name',
};

describe('kpng kube (process)', () => {
  let dir: string;
  let server: TestApiServer;
  let cluster: SyntheticCluster;
  let kubeconfig: string;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'kpng-kube-cli-'));
    server = await new TestApiServer().start();
    cluster = new SyntheticCluster(server, prng(7));
    cluster.populate({ services: 20, pods: 30, nodes: 3 });
    // things the source must leave out
    server.put(serviceObject('other', 'theirs', '10.96.99.1', { labels: { 'service.kubernetes.io/service-proxy-name': 'someone-else' } }));
    server.put(sliceObject('other', 'headless-x', 'headless', [{ name: 'h-1', ip: '10.1.1.1', node: 'node-1', ready: true }], { 'service.kubernetes.io/headless': '' }));
    kubeconfig = certKubeconfig(join(dir, 'kubeconfig'), server.url);
  });

  after(async () => {
    await server?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('kube --kubeconfig K to-file --output - prints the server\'s state, and again after a change', async () => {
    const p = kpng(['kube', '--kubeconfig', kubeconfig, 'to-file', '--output', '-']);
    try {
      const docs = () => parseAllDocuments(p.stdout).map((d) => d.toJS());
      const expected = () => JSON.parse(JSON.stringify(globalStateDocument(storeFromServer(server, SELECTORS))));
      await p.until('the first state', () => docs().length >= 1 && p.stdout.endsWith('\n'), WAIT);
      assert.deepEqual(docs()[0], expected());
      assert.equal(docs()[0].services.length, 20);

      server.put(serviceObject('ns-0', 'late', '10.96.50.1'));
      await p.until('a state with the new service', () => docs().some((d) => d.services.some((s: any) => s.service.Name === 'late')), WAIT);
      assert.deepEqual(docs().at(-1), expected());
    } finally {
      await p.stop();
    }
  });

  it('kube --stats ... to-local to-log --node-name N shows each change once; no-op updates and relists show nothing', async () => {
    const nodeName = 'node-1';
    const p = kpng(['kube', '--stats', '--kubeconfig', kubeconfig, 'to-local', 'to-log', '--node-name', nodeName]);
    const lines = () => p.stdout.split('\n').filter(Boolean);
    const syncs = () => lines().filter((l) => l === '> sync').length;
    const events = () => {
      const stats = p.stderr.split('\n').filter((l) => /^stats:\t\d/.test(l));
      return stats.length ? Number(stats.at(-1)!.split('\t')[2]) : 0;
    };
    try {
      await p.until('the initial state', () => syncs() === 1, WAIT);
      assert.equal(lines()[0], '~ reset');
      let seen = lines().length;
      const next = async (what: string) => {
        await p.until(what, () => syncs() > 1 && lines().at(-1) === '> sync' && lines().length > seen, WAIT);
        const chunk = lines().slice(seen);
        seen = lines().length;
        return chunk;
      };

      // a real change: a new ready pod on this node for a service that already has endpoints
      const svc = server.list('endpointslices').find((s) => s.endpoints.length > 0 && s.endpoints.every((e: any) => e.conditions.ready))!;
      const ns = svc.metadata.namespace;
      const service = svc.metadata.labels['kubernetes.io/service-name'];
      server.modify('EndpointSlice', `${ns}/${svc.metadata.name}`, (o) =>
        o.endpoints.push({ addresses: ['10.200.0.1'], conditions: { ready: true, serving: true, terminating: false }, nodeName, targetRef: { kind: 'Pod', namespace: ns, name: 'new-pod' } }),
      );
      const added = await next('the new endpoint');
      assert.equal(added.length, 2, added.join('\n'));
      assert.match(added[0], new RegExp(`^\\+ EndpointsSet ${ns}/${service}/new-pod \\{.*"10\\.200\\.0\\.1".*"Local":true`));
      assert.equal(added[1], '> sync');

      // no-op updates: the source sees them (events move), the node sees nothing
      const before = events();
      for (let i = 0; i < 60; i++) cluster.apply(NOOP_OPS[i % NOOP_OPS.length]);
      await p.until('the no-op updates counted in --stats', () => events() >= before + 60, WAIT);
      // a forced relist (watches cut, history compacted): nothing changed, nothing shown
      server.dropWatches();
      server.compact();
      await p.until('the relists', () => (p.stderr.match(/relisted endpointslices/g) ?? []).length >= 1 && (p.stderr.match(/relisted services/g) ?? []).length >= 1, WAIT);
      await new Promise((r) => setTimeout(r, 1200)); // a stats period: anything pending would show
      assert.deepEqual(lines().slice(seen), []);

      // the pod goes away: shown once
      server.modify('EndpointSlice', `${ns}/${svc.metadata.name}`, (o) => (o.endpoints = o.endpoints.filter((e: any) => e.targetRef?.name !== 'new-pod')));
      assert.deepEqual(await next('the deleted endpoint'), [`- EndpointsSet ${ns}/${service}/new-pod`, '> sync']);
    } finally {
      await p.stop();
    }
  });

  it('a missing kubeconfig is a clear error (exit 1)', async () => {
    const p = kpng(['kube', '--kubeconfig', join(dir, 'nope'), 'to-file', '--output', '-']);
    try {
      let timer: NodeJS.Timeout | undefined;
      const code = await Promise.race([p.exited, new Promise((r) => (timer = setTimeout(() => r('timeout'), 30_000)))]);
      clearTimeout(timer);
      assert.equal(code, 1);
      assert.match(p.stderr, /--kubeconfig: .*nope does not exist/);
    } finally {
      await p.stop();
    }
  });
});
