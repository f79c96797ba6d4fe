// The file source: kubectl output in files and directories, followed on
// change, and bad input that never loses the last good state.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { stringify } from 'yaml';
import { Store } from '../../src/store/store.js';
import { FileSource } from '../../src/sources/file/index.js';
import { flattenObjects, InvalidObject } from '../../src/sources/objects.js';
import { service, slice, node } from '../helpers/k8s.js';
import { recordingLogger } from '../helpers/logs.js';
import { saveByRename, tmp } from '../file/util.js';
import { until, sleep } from '../helpers/until.js';

test('a directory of YAML (multi-document, Lists) and JSON files', async () => {
  const t = tmp();
  try {
    writeFileSync(join(t.dir, 'a.yaml'), [service('ns', 'a', { clusterIP: '10.96.0.1' }), slice('ns', 'a-1', 'a', [{ ip: '10.0.0.1' }])].map((o) => stringify(o)).join('---\n'));
    writeFileSync(join(t.dir, 'b.json'), JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [service('ns', 'b', { clusterIP: '10.96.0.2' }), node('n1')] }));
    writeFileSync(join(t.dir, 'notes.txt'), 'not read');
    const store = new Store();
    const src = new FileSource(store, recordingLogger().log, { input: t.dir, watch: false });
    await src.start();
    assert.deepEqual([...store.serviceKeys()].sort(), ['ns/a', 'ns/b']);
    assert.equal(store.slicesOfService('ns/a').length, 1);
    assert.ok(store.getNode('n1'));
    assert.ok(store.allSynced);
  } finally {
    t.done();
  }
});

test('an invalid object is skipped with one log line naming file, object and field; the rest applies', async () => {
  const t = tmp();
  try {
    const file = join(t.dir, 'c.yaml');
    writeFileSync(file, [service('ns', 'good', { clusterIP: '10.96.0.1' }), service('ns', 'bad', { ports: [{ name: 'x', port: 99999 }] })].map((o) => stringify(o)).join('---\n'));
    const rec = recordingLogger();
    const store = new Store();
    await new FileSource(store, rec.log, { input: file, watch: false }).start();
    assert.deepEqual([...store.serviceKeys()], ['ns/good']);
    const errors = rec.records.filter((r) => r.level >= 50);
    assert.equal(errors.length, 1);
    assert.equal(errors[0].file, file);
    assert.equal(errors[0].object, 'Service ns/bad');
    assert.equal(errors[0].field, 'spec.ports[0].port');
    assert.match(errors[0].msg, /Service ns\/bad.*spec\.ports\[0\]\.port.*99999/);
  } finally {
    t.done();
  }
});

test('changes are followed through file events; a broken file keeps its last good objects', async () => {
  const t = tmp();
  const rec = recordingLogger();
  const store = new Store();
  const file = join(t.dir, 'cluster.yaml');
  writeFileSync(file, stringify(service('ns', 'a', { clusterIP: '10.96.0.1' })));
  const src = new FileSource(store, rec.log, { input: t.dir, debounceMs: 30, writeGraceMs: 300 });
  try {
    await src.start();
    assert.deepEqual([...store.serviceKeys()], ['ns/a']);

    // an editor's atomic save: write elsewhere, rename over
    saveByRename(file, [service('ns', 'a', { clusterIP: '10.96.0.1' }), service('ns', 'b', { clusterIP: '10.96.0.2' })].map((o) => stringify(o)).join('---\n'));
    await until('ns/b to appear', () => store.getService('ns/b') !== undefined);

    const rev = store.rev;
    writeFileSync(file, 'kind: Service\nmetadata: {name: [unclosed\n');
    await until('the parse error', () => rec.records.some((r) => /cannot parse/.test(r.msg)));
    assert.equal(store.rev, rev, 'nothing changed');
    assert.deepEqual([...store.serviceKeys()].sort(), ['ns/a', 'ns/b']);

    // an object turning invalid keeps its last good version
    writeFileSync(file, [service('ns', 'a', { clusterIP: 'bogus' }), service('ns', 'b', { clusterIP: '10.96.0.2' })].map((o) => stringify(o)).join('---\n'));
    await until('the invalid object', () => rec.records.some((r) => r.object === 'Service ns/a' && /last good/.test(r.msg)));
    assert.deepEqual(store.getService('ns/a')!.service.IPs!.ClusterIPs!.V4, ['10.96.0.1']);

    // deleting an object from the file deletes it
    writeFileSync(file, stringify(service('ns', 'a', { clusterIP: '10.96.0.1' })));
    await until('ns/b to go away', () => store.getService('ns/b') === undefined);
  } finally {
    await src.stop();
    t.done();
  }
});

test('re-writing a file with the same objects changes nothing; a Service changed in one field is written', async () => {
  const t = tmp();
  const store = new Store();
  const file = join(t.dir, 'x.yaml');
  const text = stringify(service('ns', 'a', { clusterIP: '10.96.0.1' }));
  writeFileSync(file, text);
  const src = new FileSource(store, recordingLogger().log, { input: file, debounceMs: 20 });
  try {
    await src.start();
    const rev = store.rev;
    let reloads = src.reloads;
    writeFileSync(file, text);
    await until('a reload', () => src.reloads > reloads);
    assert.equal(store.rev, rev);
    // (a Service's hash is of its encoding: every field counts)
    reloads = src.reloads;
    writeFileSync(file, stringify(service('ns', 'a', { clusterIP: '10.96.0.1', sessionAffinity: 'ClientIP' })));
    await until('a reload', () => src.reloads > reloads);
    assert.ok(store.rev > rev);
    assert.equal(store.getService('ns/a')!.service.SessionAffinity.case, 'ClientIP', 'the new version is in the store');
  } finally {
    await src.stop();
    t.done();
  }
});

test('a List nested 5,000 deep is refused with one log line naming the file; the other files load', async () => {
  const t = tmp();
  try {
    // built as text: JSON.stringify itself recurses
    const deep = '{"kind":"List","items":['.repeat(5000) + JSON.stringify(service('ns', 'deep', { clusterIP: '10.96.0.9' })) + ']}'.repeat(5000);
    const bad = join(t.dir, 'deep.json');
    writeFileSync(bad, deep);
    writeFileSync(join(t.dir, 'ok.yaml'), stringify(service('ns', 'a', { clusterIP: '10.96.0.1' })));
    const rec = recordingLogger();
    const store = new Store();
    const src = new FileSource(store, rec.log, { input: t.dir, watch: false });
    await src.start();
    assert.deepEqual([...store.serviceKeys()], ['ns/a']);
    const lines = rec.records.filter((r) => r.file === bad);
    assert.equal(lines.length, 1, rec.text());
    assert.match(JSON.stringify(lines[0]), /nested more than 16 deep/);
  } finally {
    t.done();
  }
});

test('Lists inside Lists flatten (no recursion), deeper than 16 is refused', () => {
  let l: unknown = { kind: 'Node', metadata: { name: 'n' } };
  for (let i = 0; i < 16; i++) l = { kind: 'List', items: [l, { kind: 'Node', metadata: { name: `n${i}` } }] };
  assert.equal(flattenObjects(l).length, 17);
  assert.throws(() => flattenObjects({ kind: 'List', items: [l] }), (e: unknown) => e instanceof InvalidObject && /nested/.test(e.message));
  assert.deepEqual(flattenObjects({ kind: 'ServiceList', items: [{ metadata: { name: 'a' } }, 7] }), [{ kind: 'Service', metadata: { name: 'a' } }, 7]);
});

test('an object defined twice in one file warns naming the file and the object (as across files)', async () => {
  const t = tmp();
  try {
    const file = join(t.dir, 'dup.yaml');
    writeFileSync(file, [service('ns', 'a', { clusterIP: '10.96.0.1' }), service('ns', 'a', { clusterIP: '10.96.0.2' })].map((o) => stringify(o)).join('---\n'));
    writeFileSync(join(t.dir, 'z.yaml'), stringify(service('ns', 'b', { clusterIP: '10.96.0.3' })));
    writeFileSync(join(t.dir, 'zz.yaml'), stringify(service('ns', 'b', { clusterIP: '10.96.0.4' })));
    const rec = recordingLogger();
    const store = new Store();
    await new FileSource(store, rec.log, { input: t.dir, watch: false }).start();
    const warns = rec.records.filter((r) => r.level === 40);
    assert.deepEqual(warns.map((w) => [w.file, w.object]), [[file, 'Service/ns/a'], [join(t.dir, 'zz.yaml'), 'Service/ns/b']], rec.text());
    assert.deepEqual(store.getService('ns/a')!.service.IPs!.ClusterIPs!.V4, ['10.96.0.2'], 'the later one wins');
    assert.deepEqual(store.getService('ns/b')!.service.IPs!.ClusterIPs!.V4, ['10.96.0.4']);
  } finally {
    t.done();
  }
});

test('reloads run one at a time; asked for while one runs, one more runs after it', async () => {
  const t = tmp();
  try {
    writeFileSync(join(t.dir, 'a.yaml'), stringify(service('ns', 'a', { clusterIP: '10.96.0.1' })));
    const store = new Store();
    const src = new FileSource(store, recordingLogger().log, { input: t.dir, watch: false });
    await src.start();
    assert.equal(src.reloads, 1);
    const first = src.reload();
    const asked = [src.reload(), src.reload(), src.reload()];
    await first;
    assert.equal(src.reloads, 2, 'the others wait');
    await Promise.all(asked);
    assert.equal(src.reloads, 3, 'one more for all three');
    assert.deepEqual([...store.serviceKeys()], ['ns/a']);
  } finally {
    t.done();
  }
});

test('an object two files define: when the later file lets it go, the earlier version comes back (the source keeps no copy of applied objects)', async () => {
  const t = tmp();
  const store = new Store();
  const src = new FileSource(store, recordingLogger().log, { input: t.dir, debounceMs: 20 });
  try {
    writeFileSync(join(t.dir, 'a.yaml'), stringify(service('ns', 'web', { clusterIP: '10.96.0.1' })));
    // a.yaml settled: the source trusts its stat and does not read it again by itself
    await sleep(2200);
    await src.start();
    const ip = () => store.getService('ns/web')?.service.IPs?.ClusterIPs?.V4[0];
    assert.equal(ip(), '10.96.0.1');
    writeFileSync(join(t.dir, 'b.yaml'), stringify(service('ns', 'web', { clusterIP: '10.96.0.2' })));
    await until('the later file wins', () => ip() === '10.96.0.2');
    rmSync(join(t.dir, 'b.yaml'));
    await until('the earlier file version back in the store', () => ip() === '10.96.0.1');
    // and it stays (no reload loop rewrites it)
    const rev = store.rev;
    await sleep(300);
    assert.equal(store.rev, rev);
  } finally {
    await src.stop();
    t.done();
  }
});

test('a reload writes what the changed files changed: one file among many, a file removed, an object moved between files, a later file taking a key over and giving it back', async () => {
  const t = tmp();
  const store = new Store();
  const src = new FileSource(store, recordingLogger().log, { input: t.dir, debounceMs: 20 });
  const changed: string[] = [];
  const unsubscribe = store.subscribe((c) => changed.push(...c.services));
  const file = (i: number) => join(t.dir, `f${String(i).padStart(2, '0')}.yaml`);
  const svcs = (i: number, ip = 1) => Array.from({ length: 10 }, (_, k) => stringify(service('ns', `s${i}-${k}`, { clusterIP: `10.96.${i}.${k + ip}` }))).join('---\n');
  const ip = (key: string) => store.getService(key)?.service.IPs?.ClusterIPs?.V4[0];
  const settle = async (what: string, cond: () => boolean) => {
    await until(what, cond);
    // nothing more comes after it
    await sleep(150);
  };
  try {
    for (let i = 0; i < 20; i++) writeFileSync(file(i), svcs(i));
    await src.start();
    assert.equal(store.getService('ns/s19-9')?.service.Name, 's19-9');

    // one file of twenty rewritten, one of its objects different: that one object is written
    changed.length = 0;
    saveByRename(file(7), svcs(7).replaceAll('10.96.7.4', '10.96.7.200'));
    await settle('the changed object', () => ip('ns/s7-3') === '10.96.7.200');
    assert.deepEqual(changed, ['ns/s7-3']);

    // a file removed: its ten objects go, nothing else
    changed.length = 0;
    rmSync(file(3));
    await settle('file 3 gone', () => !store.getService('ns/s3-0') && !store.getService('ns/s3-9'));
    assert.deepEqual([...new Set(changed)].sort(), Array.from({ length: 10 }, (_, k) => `ns/s3-${k}`).sort());
    assert.ok(store.getService('ns/s4-0'));

    // an object moved from one file to another, unchanged, in one rename: no write
    changed.length = 0;
    const moved = stringify(service('ns', 's5-0', { clusterIP: '10.96.5.1' }));
    saveByRename(file(8), `${svcs(8)}---\n${moved}`);
    saveByRename(file(5), svcs(5).split('---\n').slice(1).join('---\n'));
    await sleep(500);
    assert.equal(ip('ns/s5-0'), '10.96.5.1');
    assert.deepEqual(changed, []);

    // a later file takes a key over, then lets it go: the earlier version comes back
    changed.length = 0;
    saveByRename(file(30), stringify(service('ns', 's1-1', { clusterIP: '10.96.99.1' })));
    await settle('the later file wins', () => ip('ns/s1-1') === '10.96.99.1');
    rmSync(file(30));
    await settle('the earlier version back', () => ip('ns/s1-1') === '10.96.1.2');
    assert.deepEqual([...new Set(changed)], ['ns/s1-1']);
  } finally {
    unsubscribe();
    await src.stop();
    t.done();
  }
});

test('read once (watch: false), files go to the store as they are read, in order: the same store as a watching source; a later reload still sees a change', async () => {
  const t = tmp();
  try {
    // small files parsed inline and large ones (over 1 MB) in the parser threads, a key two files define
    const big = (from: number) => ({ apiVersion: 'v1', kind: 'List', items: Array.from({ length: 1500 }, (_, i) => slice('ns', `s-${from + i}-1`, `s-${from + i}`, Array.from({ length: 5 }, (_, e) => ({ ip: `10.${from >> 8}.${i >> 4}.${(i & 15) * 5 + e + 1}`, node: `n${e}` })))) });
    writeFileSync(join(t.dir, 'a-slices.json'), JSON.stringify(big(0)));
    writeFileSync(join(t.dir, 'b-services.json'), JSON.stringify({ apiVersion: 'v1', kind: 'List', items: Array.from({ length: 3000 }, (_, i) => service('ns', `s-${i}`, { clusterIP: `10.96.${i >> 8}.${i & 255}` })) }));
    writeFileSync(join(t.dir, 'c-slices.json'), JSON.stringify(big(1500)));
    writeFileSync(join(t.dir, 'd.yaml'), stringify(service('ns', 's-7', { clusterIP: '10.97.0.7' })));
    const dump = (s: Store) => ({
      services: [...s.allServices()].map((x) => [x.key, Buffer.from(x.bytes).toString('base64')]).sort(),
      slices: [...s.allSlices()].map((x) => [x.key, Buffer.from(x.bytes).toString('base64')]).sort(),
    });
    const once = new Store();
    const rec = recordingLogger();
    const src = new FileSource(once, rec.log, { input: t.dir, watch: false });
    await src.start();
    const watched = new Store();
    const w = new FileSource(watched, recordingLogger().log, { input: t.dir });
    try {
      await w.start();
    } finally {
      await w.stop();
    }
    assert.deepEqual(dump(once), dump(watched));
    assert.equal(dump(once).slices.length, 3000);
    assert.deepEqual(once.getService('ns/s-7')!.service.IPs!.ClusterIPs!.V4, ['10.97.0.7'], 'the later file wins');
    assert.deepEqual(rec.records.filter((r) => r.level === 40).map((r) => r.object), ['Service/ns/s-7']);
    // a reload: what did not change stays as it is, a change is seen
    const rev = once.rev;
    await src.reload();
    assert.equal(once.rev, rev, 'nothing changed');
    writeFileSync(join(t.dir, 'd.yaml'), stringify(service('ns', 's-7', { clusterIP: '10.97.0.8' })));
    await src.reload();
    assert.deepEqual(once.getService('ns/s-7')!.service.IPs!.ClusterIPs!.V4, ['10.97.0.8']);
    await src.stop();
  } finally {
    t.done();
  }
});

test('Services of a large file (parsed in a parser thread, handed over encoded) are stored as those of small files parsed here, and keep their hashes when a file crosses over', async () => {
  /** Service i, with a different shape every few (ports, types, policies, affinity, labels kpng keeps) */
  const svc = (i: number) => {
    const spec: Record<string, unknown> = { clusterIP: `10.96.${i >> 8}.${i & 255}`, ports: [{ name: 'http', port: 80, targetPort: 8080 }] };
    if (i % 3 === 1) Object.assign(spec, { type: 'NodePort', ports: [{ name: 'http', port: 80, targetPort: 'web', nodePort: 30000 + i }, { name: 'dns', port: 53, protocol: 'UDP', targetPort: 53, nodePort: 31000 + i }], externalTrafficPolicy: 'Local' });
    if (i % 5 === 2) Object.assign(spec, { externalIPs: [`192.0.2.${i & 255}`], sessionAffinity: 'ClientIP', sessionAffinityConfig: { clientIP: { timeoutSeconds: 60 + i } } });
    if (i % 7 === 3) Object.assign(spec, { ipFamilies: ['IPv4', 'IPv6'], clusterIPs: [`10.96.${i >> 8}.${i & 255}`, `fd00::${i.toString(16)}`], internalTrafficPolicy: 'Local' });
    const o = service('ns', `s-${i}`, spec);
    if (i % 4 === 0) (o.metadata as Record<string, unknown>).labels = { 'service.kubernetes.io/topology-mode': 'Auto', app: `a${i}` };
    return o;
  };
  const list = (from: number, n: number) => JSON.stringify({ apiVersion: 'v1', kind: 'List', items: Array.from({ length: n }, (_, i) => svc(from + i)) });
  const load = async (dir: string) => {
    const store = new Store();
    const src = new FileSource(store, recordingLogger().log, { input: dir, watch: false });
    await src.start();
    await src.stop();
    return new Map([...store.allServices()].map((s) => [s.key, { service: s.service, bytes: Buffer.from(s.bytes).toString('base64') }]));
  };
  const big = tmp();
  const small = tmp();
  const crossing = tmp();
  try {
    // one file of 6000 Services (over 1 MB: the thread) against files of 300 (here)
    writeFileSync(join(big.dir, 'all.json'), list(0, 6000));
    assert.ok(statSync(join(big.dir, 'all.json')).size > 2 ** 20);
    for (let f = 0; f < 20; f++) writeFileSync(join(small.dir, `part-${String(f).padStart(2, '0')}.json`), list(f * 300, 300));
    const fromThread = await load(big.dir);
    assert.equal(fromThread.size, 6000);
    assert.deepEqual(fromThread, await load(small.dir));

    // a file that grows past the limit: its unchanged Services are not written again
    const file = join(crossing.dir, 'grows.json');
    writeFileSync(file, list(0, 30));
    const store = new Store();
    // (watching: only a watching source hashes what it read)
    const src = new FileSource(store, recordingLogger().log, { input: file, debounceMs: 60_000 });
    try {
      await src.start();
      const events = store.events;
      writeFileSync(file, list(0, 6000));
      await src.reload();
      assert.equal(store.events - events, 5970, 'only the new Services are written');
      assert.equal([...store.allServices()].length, 6000);
    } finally {
      await src.stop();
    }
  } finally {
    big.done();
    small.done();
    crossing.done();
  }
});
