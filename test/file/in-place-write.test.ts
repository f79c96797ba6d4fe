// A file rewritten in place (`kubectl get -o yaml > file`: the shell
// truncates, then the writer writes, maybe slowly) passes through empty and
// half-written states; none of them may reach the store.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Store } from '../../src/store/store.js';
import { followDir, kubectlList, shell } from './util.js';
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
  const old = kubectlList('ns', 300);
  const next = kubectlList('ns', 301); // the same, plus one: tells when the write is through
  const files = (dir: string) => {
    writeFileSync(join(dir, 'watched.yaml'), old.text);
    writeFileSync(join(dir, '.next'), next.text);
  };
  await followDir({ debounceMs: 50, writeGraceMs: 1500 }, files, async ({ dir, store, rec }) => {
    assert.equal([...store.serviceKeys()].length, 300);
    const g = guard(store, old.keys);
    // cut mid-line, mid-object: what a reader sees of a slow writer
    const n1 = Math.floor(next.text.length / 3) + 7;
    const n2 = Math.floor(next.text.length / 3) + 11;
    const sh = shell(`(sleep 0.3; head -c ${n1}; sleep 0.3; head -c ${n2}; sleep 0.3; cat) < .next > watched.yaml`, dir);
    try {
      assert.equal(await sh.exited, 0, sh.stderr);
      const written = Date.now();
      assert.equal(readFileSync(join(dir, 'watched.yaml'), 'utf8'), next.text);
      await until('the completed write', () => store.getService('ns/svc-300') !== undefined, { timeoutMs: 10_000 });
      await pastTheGrace(dir, store, written + 1500);
      g.unsubscribe();
      assert.deepEqual(g.flaps, [], rec.text());
      assert.equal([...store.serviceKeys()].filter((k) => k.startsWith('ns/')).length, 301);
      assert.ok(!rec.records.some((r) => r.level >= 50), 'no error logged for a write in progress');
    } finally {
      await sh.stop();
    }
  });
});

test('a file emptied for good loses its objects after the grace; one that really loses objects loses just those', async () => {
  const all = kubectlList('ns', 40);
  const fewer = kubectlList('ns', 30);
  const files = (dir: string) => {
    writeFileSync(join(dir, 'a.yaml'), all.text);
    writeFileSync(join(dir, 'b.yaml'), kubectlList('other', 5).text);
  };
  await followDir({ debounceMs: 30, writeGraceMs: 500 }, files, async ({ dir, store }) => {
    assert.equal([...store.serviceKeys()].length, 45);
    const g = guard(store, fewer.keys);
    // in place, 10 objects fewer: they go after the grace, the others never flap
    const t0 = Date.now();
    writeFileSync(join(dir, 'a.yaml'), fewer.text);
    await until('the 10 lost objects to go', () => store.getService('ns/svc-39') === undefined, { timeoutMs: 5000 });
    assert.ok(Date.now() - t0 >= 450, `deleted after ${Date.now() - t0} ms, before the grace`);
    assert.equal([...store.serviceKeys()].length, 35);
    g.unsubscribe();
    assert.deepEqual(g.flaps, []);

    // emptied, and it stays so: everything of it goes
    writeFileSync(join(dir, 'b.yaml'), '');
    await until('the emptied file\'s objects to go', () => ![...store.serviceKeys()].some((k) => k.startsWith('other/')), { timeoutMs: 5000 });
    assert.equal([...store.serviceKeys()].length, 30);
  });
});

test('a write cut inside its last object, mid-line, does not change that object meanwhile', async () => {
  const list = kubectlList('ns', 3);
  const files = (dir: string) => {
    writeFileSync(join(dir, 'watched.yaml'), list.text);
    writeFileSync(join(dir, '.same'), list.text);
  };
  // "port: 8080" of the last slice cut to "port: 80": valid YAML, a different slice (and no endpoints)
  const cut = list.text.lastIndexOf('port: 8080') + 'port: 80'.length;
  await followDir({ debounceMs: 30, writeGraceMs: 1500 }, files, async ({ dir, store, src, rec }) => {
    const g = guard(store, list.keys);
    const reloads = src.reloads;
    const sh = shell(`(head -c ${cut}; sleep 0.5; cat) < .same > watched.yaml`, dir);
    try {
      assert.equal(await sh.exited, 0, sh.stderr);
      const written = Date.now();
      assert.ok(src.reloads > reloads, 'the cut file was read');
      await pastTheGrace(dir, store, written + 1500);
      g.unsubscribe();
      assert.deepEqual(g.flaps, [], rec.text());
    } finally {
      await sh.stop();
    }
  });
});

test('a file rewritten in place that stays broken: one error line after the grace, its objects kept, not held again', async () => {
  const list = kubectlList('ns', 3);
  const files = (dir: string) => writeFileSync(join(dir, 'watched.yaml'), list.text);
  await followDir({ debounceMs: 30, writeGraceMs: 300 }, files, async ({ dir, store, src, rec }) => {
    const g = guard(store, list.keys);
    const t0 = Date.now();
    writeFileSync(join(dir, 'watched.yaml'), list.text + 'kind: [unclosed\n');
    const parseErrors = () => rec.records.filter((r) => /cannot parse/.test(r.msg));
    await until('the parse error', () => parseErrors().length > 0, { timeoutMs: 5000 });
    assert.ok(Date.now() - t0 >= 280, 'logged after the grace');
    // later reloads read it again (it changed less than 2 s ago), neither holding nor logging again
    for (let i = 0; i < 3; i++) await src.reload();
    await pastTheGrace(dir, store, Date.now() + 300);
    assert.equal(parseErrors().length, 1, rec.text());
    g.unsubscribe();
    assert.deepEqual(g.flaps, []);
  });
});
