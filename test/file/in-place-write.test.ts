// A file rewritten in place (`kubectl get -o yaml > file`: the shell
// truncates, then the writer writes, maybe slowly) passes through empty and
// half-written states; none of them may reach the store.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Store } from '../../src/store/store.js';
import { FileSource } from '../../src/sources/file/index.js';
import { recordingLogger } from '../helpers/logs.js';
import { tmp, kubectlList, shell } from './util.js';
import { until, sleep } from '../helpers/until.js';

/** watches the store: every change must still hold these services, and their slices, unchanged */
function guard(store: Store, keys: string[]) {
  const state = (k: string) => {
    const svc = store.getService(k);
    return svc && Buffer.concat([svc.bytes, ...store.slicesOfService(k).map((s) => s.bytes)]).toString('base64');
  };
  const before = new Map(keys.map((k) => [k, state(k)]));
  const flaps: string[] = [];
  const unsubscribe = store.subscribe((change) => {
    for (const k of keys) {
      const now = state(k);
      if (!now) flaps.push(`rev ${change.rev}: ${k} deleted`);
      else if (now !== before.get(k)) flaps.push(`rev ${change.rev}: ${k} or its slices changed`);
    }
  });
  return { flaps, unsubscribe };
}

/**
 * Nothing else comes, not even at the end of the grace of a hold a write
 * began: once graceEnd (a bound: the hold began before the write ended) is
 * past, another file is written; the reload at the grace's end comes before
 * the one that takes that file, which is awaited.
 */
async function pastTheGrace(dir: string, store: Store, graceEnd: number): Promise<void> {
  await sleep(graceEnd + 100 - Date.now());
  writeFileSync(join(dir, 'marker.yaml'), kubectlList('marker', 1).text);
  await until('the marker file to be taken', () => store.getService('marker/svc-0') !== undefined);
}

test('truncate, then write in slow chunks: the Services of the file are never deleted meanwhile', async () => {
  const t = tmp();
  const store = new Store();
  const rec = recordingLogger();
  const old = kubectlList('ns', 300);
  const next = kubectlList('ns', 301); // the same, plus one: tells when the write is through
  const file = join(t.dir, 'watched.yaml');
  const src = join(t.dir, '.next');
  writeFileSync(file, old.text);
  writeFileSync(src, next.text);
  const source = new FileSource(store, rec.log, { input: t.dir, debounceMs: 50, writeGraceMs: 1500 });
  let sh: ReturnType<typeof shell> | undefined;
  try {
    await source.start();
    assert.equal([...store.serviceKeys()].length, 300);
    const g = guard(store, old.keys);
    // cut mid-line, mid-object: what a reader sees of a slow writer
    const n1 = Math.floor(next.text.length / 3) + 7;
    const n2 = Math.floor(next.text.length / 3) + 11;
    sh = shell(`(sleep 0.3; head -c ${n1}; sleep 0.3; head -c ${n2}; sleep 0.3; cat) < .next > watched.yaml`, t.dir);
    assert.equal(await sh.exited, 0, sh.stderr);
    const written = Date.now();
    assert.equal(readFileSync(file, 'utf8'), next.text);
    await until('the completed write', () => store.getService('ns/svc-300') !== undefined, { timeoutMs: 10_000 });
    await pastTheGrace(t.dir, store, written + 1500);
    g.unsubscribe();
    assert.deepEqual(g.flaps, [], rec.text());
    assert.equal([...store.serviceKeys()].filter((k) => k.startsWith('ns/')).length, 301);
    assert.ok(!rec.records.some((r) => r.level >= 50), 'no error logged for a write in progress');
  } finally {
    await sh?.stop();
    await source.stop();
    t.done();
  }
});

test('a file emptied for good loses its objects after the grace; one that really loses objects loses just those', async () => {
  const t = tmp();
  const store = new Store();
  const rec = recordingLogger();
  const all = kubectlList('ns', 40);
  const fewer = kubectlList('ns', 30);
  const a = join(t.dir, 'a.yaml');
  const b = join(t.dir, 'b.yaml');
  writeFileSync(a, all.text);
  writeFileSync(b, kubectlList('other', 5).text);
  const source = new FileSource(store, rec.log, { input: t.dir, debounceMs: 30, writeGraceMs: 500 });
  try {
    await source.start();
    assert.equal([...store.serviceKeys()].length, 45);
    const g = guard(store, fewer.keys);
    // in place, 10 objects fewer: they go after the grace, the others never flap
    const t0 = Date.now();
    writeFileSync(a, fewer.text);
    await until('the 10 lost objects to go', () => store.getService('ns/svc-39') === undefined, { timeoutMs: 5000 });
    assert.ok(Date.now() - t0 >= 450, `deleted after ${Date.now() - t0} ms, before the grace`);
    assert.equal([...store.serviceKeys()].length, 35);
    g.unsubscribe();
    assert.deepEqual(g.flaps, []);

    // emptied, and it stays so: everything of it goes
    writeFileSync(b, '');
    await until('the emptied file\'s objects to go', () => ![...store.serviceKeys()].some((k) => k.startsWith('other/')), { timeoutMs: 5000 });
    assert.equal([...store.serviceKeys()].length, 30);
  } finally {
    await source.stop();
    t.done();
  }
});

test('a write cut inside its last object, mid-line, does not change that object meanwhile', async () => {
  const t = tmp();
  const store = new Store();
  const rec = recordingLogger();
  const list = kubectlList('ns', 3);
  const file = join(t.dir, 'watched.yaml');
  writeFileSync(file, list.text);
  writeFileSync(join(t.dir, '.same'), list.text);
  // "port: 8080" of the last slice cut to "port: 80": valid YAML, a different slice (and no endpoints)
  const cut = list.text.lastIndexOf('port: 8080') + 'port: 80'.length;
  const source = new FileSource(store, rec.log, { input: t.dir, debounceMs: 30, writeGraceMs: 1500 });
  let sh: ReturnType<typeof shell> | undefined;
  try {
    await source.start();
    const g = guard(store, list.keys);
    const reloads = source.reloads;
    sh = shell(`(head -c ${cut}; sleep 0.5; cat) < .same > watched.yaml`, t.dir);
    assert.equal(await sh.exited, 0, sh.stderr);
    const written = Date.now();
    assert.ok(source.reloads > reloads, 'the cut file was read');
    await pastTheGrace(t.dir, store, written + 1500);
    g.unsubscribe();
    assert.deepEqual(g.flaps, [], rec.text());
  } finally {
    await sh?.stop();
    await source.stop();
    t.done();
  }
});

test('a file rewritten in place that stays broken: one error line after the grace, its objects kept, not held again', async () => {
  const t = tmp();
  const store = new Store();
  const rec = recordingLogger();
  const list = kubectlList('ns', 3);
  const file = join(t.dir, 'watched.yaml');
  writeFileSync(file, list.text);
  const source = new FileSource(store, rec.log, { input: t.dir, debounceMs: 30, writeGraceMs: 300 });
  try {
    await source.start();
    const g = guard(store, list.keys);
    const t0 = Date.now();
    writeFileSync(file, list.text + 'kind: [unclosed\n');
    const parseErrors = () => rec.records.filter((r) => /cannot parse/.test(r.msg));
    await until('the parse error', () => parseErrors().length > 0, { timeoutMs: 5000 });
    assert.ok(Date.now() - t0 >= 280, 'logged after the grace');
    // later reloads read it again (it changed less than 2 s ago), neither holding nor logging again
    for (let i = 0; i < 3; i++) await source.reload();
    await pastTheGrace(t.dir, store, Date.now() + 300);
    assert.equal(parseErrors().length, 1, rec.text());
    g.unsubscribe();
    assert.deepEqual(g.flaps, []);
  } finally {
    await source.stop();
    t.done();
  }
});
