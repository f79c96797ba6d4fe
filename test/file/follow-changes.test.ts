// Following changes: a reload reads the files that events named, not the
// directory; a JSON file is taken at its first event when it parses whole
// (JSON cut short never does), YAML once the writer has been quiet.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import type { Store } from '../../src/store/store.js';
import { service } from '../helpers/k8s.js';
import { shell, kubectlList, saveByRename, followDir } from './util.js';
import { until, sleep } from '../helpers/until.js';

const svc = (name: string, ip: string) => JSON.stringify(service('ns', name, { clusterIP: ip }));
const clusterIP = (store: Store, key: string) => store.getService(key)?.service.IPs?.ClusterIPs?.V4?.[0];

test('one file changed in a directory of 50: that file is read again, not the other 49; one removed: its objects go', async () => {
  const files = (dir: string) => {
    for (let i = 0; i < 50; i++) writeFileSync(join(dir, `s${i}.${i % 2 ? 'json' : 'yaml'}`), svc(`s${i}`, `10.96.0.${i + 1}`));
  };
  await followDir({ debounceMs: 30 }, files, async ({ dir, store, src }) => {
    assert.equal([...store.serviceKeys()].length, 50);
    for (const [name, file, ip, markerIP] of [['s7', 's7.json', '10.96.1.7', '10.96.3.7'], ['s8', 's8.yaml', '10.96.1.8', '10.96.3.8']]) {
      const reads = src.reads;
      saveByRename(join(dir, file), svc(name, ip));
      await until(`${file} to be taken`, () => clusterIP(store, `ns/${name}`) === ip);
      // s0.yaml changed after it is read by the next debounced reload: once it
      // is taken, any reload the first change led to is done too
      saveByRename(join(dir, 's0.yaml'), svc('s0', markerIP));
      await until('s0.yaml to be taken', () => clusterIP(store, 'ns/s0') === markerIP);
      assert.equal(src.reads - reads, 2, `${file}: files read (it and s0.yaml)`);
    }
    rmSync(join(dir, 's9.json'));
    await until('the removed file\'s Service to go', () => store.getService('ns/s9') === undefined);
    assert.equal([...store.serviceKeys()].length, 49);
    // a new file is found (an event for an unknown name lists the directory)
    saveByRename(join(dir, 'new.json'), svc('new', '10.96.2.1'));
    await until('the new file', () => store.getService('ns/new') !== undefined);
  });
});

test('a JSON file saved by rename is taken at once; a YAML one once the debounce is over', async () => {
  const debounceMs = 1500;
  const files = (dir: string) => {
    writeFileSync(join(dir, 'a.json'), svc('a', '10.96.0.1'));
    writeFileSync(join(dir, 'b.yaml'), svc('b', '10.96.0.2'));
  };
  await followDir({ debounceMs }, files, async ({ dir, store }) => {
    let t0 = Date.now();
    saveByRename(join(dir, 'a.json'), svc('a', '10.96.1.1'));
    await until('the JSON file', () => clusterIP(store, 'ns/a') === '10.96.1.1', { timeoutMs: debounceMs - 200 });
    assert.ok(Date.now() - t0 < debounceMs, `taken after ${Date.now() - t0} ms`);

    t0 = Date.now();
    saveByRename(join(dir, 'b.yaml'), svc('b', '10.96.1.2'));
    await sleep(debounceMs / 2);
    assert.equal(clusterIP(store, 'ns/b'), '10.96.0.2', 'YAML waits for the writer to be quiet');
    await until('the YAML file', () => clusterIP(store, 'ns/b') === '10.96.1.2', { timeoutMs: 5000 });
    assert.ok(Date.now() - t0 >= debounceMs - 20, `taken after ${Date.now() - t0} ms`);
  });
});

test('a JSON file rewritten in place in slow parts: nothing of it changes meanwhile, no error logged, then the whole is taken', async () => {
  const list = (n: number) => JSON.stringify({ apiVersion: 'v1', kind: 'List', items: Array.from({ length: n }, (_, i) => service('ns', `svc-${i}`, { clusterIP: `10.96.0.${i + 1}` })) }, null, 1) + '\n';
  const next = list(31); // the same, plus one: tells when the write is through
  const files = (dir: string) => {
    writeFileSync(join(dir, 'watched.json'), list(30));
    writeFileSync(join(dir, '.next'), next);
  };
  await followDir({ debounceMs: 100, writeGraceMs: 3000 }, files, async ({ dir, store, rec }) => {
    const revs: number[] = [];
    const unsubscribe = store.subscribe((c) => void revs.push(c.rev));
    // truncated, cut mid-object, then the rest
    const cut = Math.floor(next.length / 2) + 3;
    const sh = shell(`(sleep 0.3; head -c ${cut}; sleep 0.6; cat) < .next > watched.json`, dir);
    try {
      await sleep(800);
      assert.deepEqual(revs, [], 'nothing taken from the half-written file');
      assert.equal(await sh.exited, 0, sh.stderr);
    } finally {
      await sh.stop();
    }
    await until('the completed write', () => store.getService('ns/svc-30') !== undefined);
    unsubscribe();
    assert.equal(revs.length, 1, 'one store update: the finished file');
    assert.equal([...store.serviceKeys()].length, 31);
    assert.ok(!rec.records.some((r) => r.level >= 40), rec.text());
  });
});

test('kubectl YAML of 300 Services changed in one Service: one file read, one Service written', async () => {
  const { text } = kubectlList('ns', 300);
  const files = (dir: string) => {
    writeFileSync(join(dir, 'big.yaml'), text);
    writeFileSync(join(dir, 'other.yaml'), kubectlList('other', 10).text);
  };
  await followDir({ debounceMs: 30 }, files, async ({ dir, store, src }) => {
    const reads = src.reads;
    const changes: string[][] = [];
    const unsubscribe = store.subscribe((c) => void changes.push([...c.services.keys()]));
    saveByRename(join(dir, 'big.yaml'), text.replaceAll('10.96.0.5\n', '10.96.9.5\n'));
    await until('the changed Service', () => clusterIP(store, 'ns/svc-5') === '10.96.9.5');
    // other.yaml changed after it: once taken, any reload the first change led to is done too
    saveByRename(join(dir, 'other.yaml'), kubectlList('other', 10).text.replaceAll('10.96.0.5\n', '10.96.8.5\n'));
    await until('other.yaml to be taken', () => clusterIP(store, 'other/svc-5') === '10.96.8.5');
    unsubscribe();
    assert.equal(src.reads - reads, 2);
    assert.deepEqual(changes, [['ns/svc-5'], ['other/svc-5']]);
  });
});
