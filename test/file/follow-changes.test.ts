// Following changes: a reload reads the files that events named, not the
// directory; a JSON file is taken at its first event when it parses whole
// (JSON cut short never does), YAML once the writer has been quiet.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync, renameSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { Store } from '../../src/store/store.js';
import { FileSource } from '../../src/sources/file/index.js';
import { service } from '../helpers/k8s.js';
import { recordingLogger } from '../helpers/logs.js';
import { tmp, until, sleep, shell, kubectlList } from './util.js';

const svc = (name: string, ip: string) => JSON.stringify(service('ns', name, { clusterIP: ip }));
const clusterIP = (store: Store, key: string) => store.getService(key)?.service.IPs?.ClusterIPs?.V4?.[0];

/** as editors and config tools save: a temporary dot file, then rename */
function save(dir: string, name: string, text: string) {
  writeFileSync(join(dir, '.tmp'), text);
  renameSync(join(dir, '.tmp'), join(dir, name));
}

test('one file changed in a directory of 50: that file is read again, not the other 49; one removed: its objects go', async () => {
  const t = tmp();
  const store = new Store();
  for (let i = 0; i < 50; i++) writeFileSync(join(t.dir, `s${i}.${i % 2 ? 'json' : 'yaml'}`), svc(`s${i}`, `10.96.0.${i + 1}`));
  const src = new FileSource(store, recordingLogger().log, { input: t.dir, debounceMs: 30 });
  try {
    await src.start();
    assert.equal([...store.serviceKeys()].length, 50);
    for (const [name, file, ip] of [['s7', 's7.json', '10.96.1.7'], ['s8', 's8.yaml', '10.96.1.8']]) {
      const reads = src.reads;
      const key = `ns/${name}`;
      save(t.dir, file, svc(name, ip));
      await until(() => clusterIP(store, key) === ip, `${file} to be taken`);
      await sleep(200); // the debounced reload, if any, is done too
      assert.equal(src.reads - reads, 1, `${file}: files read`);
    }
    rmSync(join(t.dir, 's9.json'));
    await until(() => store.getService('ns/s9') === undefined, 'the removed file\'s Service to go');
    assert.equal([...store.serviceKeys()].length, 49);
    // a new file is found (an event for an unknown name lists the directory)
    save(t.dir, 'new.json', svc('new', '10.96.2.1'));
    await until(() => store.getService('ns/new') !== undefined, 'the new file');
  } finally {
    await src.stop();
    t.done();
  }
});

test('a JSON file saved by rename is taken at once; a YAML one once the debounce is over', async () => {
  const t = tmp();
  const store = new Store();
  writeFileSync(join(t.dir, 'a.json'), svc('a', '10.96.0.1'));
  writeFileSync(join(t.dir, 'b.yaml'), svc('b', '10.96.0.2'));
  const debounceMs = 1500;
  const src = new FileSource(store, recordingLogger().log, { input: t.dir, debounceMs });
  try {
    await src.start();
    let t0 = Date.now();
    save(t.dir, 'a.json', svc('a', '10.96.1.1'));
    await until(() => clusterIP(store, 'ns/a') === '10.96.1.1', 'the JSON file', debounceMs - 200);
    assert.ok(Date.now() - t0 < debounceMs, `taken after ${Date.now() - t0} ms`);

    t0 = Date.now();
    save(t.dir, 'b.yaml', svc('b', '10.96.1.2'));
    await sleep(debounceMs / 2);
    assert.equal(clusterIP(store, 'ns/b'), '10.96.0.2', 'YAML waits for the writer to be quiet');
    await until(() => clusterIP(store, 'ns/b') === '10.96.1.2', 'the YAML file', 5000);
    assert.ok(Date.now() - t0 >= debounceMs - 20, `taken after ${Date.now() - t0} ms`);
  } finally {
    await src.stop();
    t.done();
  }
});

test('a JSON file rewritten in place in slow parts: nothing of it changes meanwhile, no error logged, then the whole is taken', async () => {
  const t = tmp();
  const store = new Store();
  const rec = recordingLogger();
  const list = (n: number) => JSON.stringify({ apiVersion: 'v1', kind: 'List', items: Array.from({ length: n }, (_, i) => service('ns', `svc-${i}`, { clusterIP: `10.96.0.${i + 1}` })) }, null, 1) + '\n';
  const file = join(t.dir, 'watched.json');
  writeFileSync(file, list(30));
  const next = list(31); // the same, plus one: tells when the write is through
  writeFileSync(join(t.dir, '.next'), next);
  const src = new FileSource(store, rec.log, { input: t.dir, debounceMs: 100, writeGraceMs: 3000 });
  let sh: ReturnType<typeof shell> | undefined;
  try {
    await src.start();
    const revs: number[] = [];
    const unsubscribe = store.subscribe((c) => void revs.push(c.rev));
    // truncated, cut mid-object, then the rest
    const cut = Math.floor(next.length / 2) + 3;
    sh = shell(`(sleep 0.3; head -c ${cut}; sleep 0.6; cat) < .next > watched.json`, t.dir);
    await sleep(800);
    assert.deepEqual(revs, [], 'nothing taken from the half-written file');
    assert.equal(await sh.exited, 0, sh.stderr);
    await until(() => store.getService('ns/svc-30') !== undefined, 'the completed write');
    unsubscribe();
    assert.equal(revs.length, 1, 'one store update: the finished file');
    assert.equal([...store.serviceKeys()].length, 31);
    assert.ok(!rec.records.some((r) => r.level >= 40), rec.text());
  } finally {
    await sh?.stop();
    await src.stop();
    t.done();
  }
});

test('kubectl YAML of 300 Services changed in one Service: one file read, one Service written', async () => {
  const t = tmp();
  const store = new Store();
  const { text } = kubectlList('ns', 300);
  writeFileSync(join(t.dir, 'big.yaml'), text);
  writeFileSync(join(t.dir, 'other.yaml'), kubectlList('other', 10).text);
  const src = new FileSource(store, recordingLogger().log, { input: t.dir, debounceMs: 30 });
  try {
    await src.start();
    const reads = src.reads;
    const changes: string[][] = [];
    const unsubscribe = store.subscribe((c) => void changes.push([...c.services.keys()]));
    save(t.dir, 'big.yaml', text.replaceAll('10.96.0.5\n', '10.96.9.5\n'));
    await until(() => clusterIP(store, 'ns/svc-5') === '10.96.9.5', 'the changed Service');
    await sleep(200);
    unsubscribe();
    assert.equal(src.reads - reads, 1);
    assert.deepEqual(changes, [['ns/svc-5']]);
  } finally {
    await src.stop();
    t.done();
  }
});
