// Every change under the input directory is picked up, also in a directory
// that appeared during a reload: its watcher is in place before it is
// listed, and a reload asked for during another runs after it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { stringify } from 'yaml';
import { Store } from '../../src/store/store.js';
import { FileSource } from '../../src/sources/file/index.js';
import { service } from '../helpers/k8s.js';
import { recordingLogger } from '../helpers/logs.js';
import { tmp, shell } from './util.js';
import { until } from '../helpers/until.js';

const svc = (i: number) => stringify(service('ns', `s${i}`, { clusterIP: `10.96.${i >> 8}.${i & 255}` }));

test('3,000 files moved in as a new directory, 5 more written into it 0.4 s later: all are loaded', async () => {
  const t = tmp();
  const input = join(t.dir, 'input');
  const staging = join(t.dir, 'staging');
  const later = join(t.dir, 'later');
  mkdirSync(input);
  mkdirSync(staging);
  mkdirSync(later);
  for (let i = 0; i < 3000; i++) writeFileSync(join(staging, `s${i}.yaml`), svc(i));
  for (let i = 3000; i < 3005; i++) writeFileSync(join(later, `s${i}.yaml`), svc(i));
  writeFileSync(join(input, 'first.yaml'), svc(9999));
  const store = new Store();
  const source = new FileSource(store, recordingLogger().log, { input, debounceMs: 100 });
  // another process: this one's event loop may be busy reloading
  let sh: ReturnType<typeof shell> | undefined;
  try {
    await source.start();
    sh = shell(`mv staging input/new && sleep 0.4 && cp later/*.yaml input/new/`, t.dir);
    assert.equal(await sh.exited, 0, sh.stderr);
    const count = () => [...store.serviceKeys()].length;
    await until('all 3,006 Services', () => count() === 3006, { timeoutMs: 12_000, detail: () => `(have ${count()})` });
    for (let i = 3000; i < 3005; i++) assert.ok(store.getService(`ns/s${i}`), `ns/s${i}`);
  } finally {
    await sh?.stop();
    await source.stop();
    t.done();
  }
});
