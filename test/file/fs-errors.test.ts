// Errors from the file system while listing and reading the input: a
// directory removed while it is listed, a process out of file descriptors.
// None may end the process or lose the last good state.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { stringify } from 'yaml';
import { Store } from '../../src/store/store.js';
import { FileSource } from '../../src/sources/file/index.js';
import { service } from '../helpers/k8s.js';
import { recordingLogger } from '../helpers/logs.js';
import { KPNG, ROOT } from '../helpers/cli.js';
import { tmp, shell } from './util.js';
import { until } from '../helpers/until.js';

test('directories removed while they are listed (ENOENT from scandir) are just gone', async () => {
  const t = tmp();
  const store = new Store();
  const rec = recordingLogger();
  writeFileSync(join(t.dir, 'a.yaml'), stringify(service('ns', 'a', { clusterIP: '10.96.0.1' })));
  const source = new FileSource(store, rec.log, { input: t.dir, watch: false });
  // a tight loop making and removing a small tree next to a.yaml
  const churn = shell('i=0; while [ $i -lt 100000 ]; do mkdir -p x/y/z && : > x/y/z/b.yaml && rm -rf x; i=$((i+1)); done', t.dir);
  try {
    await source.start();
    for (let i = 0; i < 400 && churn.running; i++) await source.reload();
    assert.ok(churn.running, 'the churn ran during every reload');
    assert.deepEqual([...store.serviceKeys()], ['ns/a']);
    assert.ok(!rec.records.some((r) => r.level >= 50), rec.text());
  } finally {
    await churn.stop();
    await source.stop();
    t.done();
  }
});

test('out of file descriptors (EMFILE): the process lives, keeps its state, and catches up once descriptors are back', async () => {
  const t = tmp();
  writeFileSync(join(t.dir, 'a.yaml'), stringify(service('ns', 'a', { clusterIP: '10.96.0.1' })));
  // a process running a file source that can be told to use up its descriptors
  const child = spawn(KPNG[0], [KPNG[1], KPNG[2], join(ROOT, 'test/file/source-child.ts'), t.dir], { cwd: ROOT, stdio: ['pipe', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  child.stdout.on('data', (d) => (out += d));
  child.stderr.on('data', (d) => (err += d));
  const exited = new Promise<number | null>((r) => child.on('exit', (c) => r(c)));
  const say = (line: string) => child.stdin.write(line + '\n');
  const alive = () => child.exitCode === null && child.signalCode === null;
  const wait = (what: string, cond: () => boolean) =>
    until(what, cond, {
      timeoutMs: 20_000,
      failIf: () => (alive() ? undefined : `the process ended (${child.exitCode})`),
      detail: () => `\nstdout:\n${out}\nstderr:\n${err}`,
    });
  try {
    await wait('the initial load', () => out.includes('keys ns/a\n'));
    say('exhaust');
    await wait('the descriptors to run out', () => /exhausted \d+/.test(out));
    // a new directory and file while the process has no descriptor left
    mkdirSync(join(t.dir, 'sub'));
    writeFileSync(join(t.dir, 'sub', 'b.yaml'), stringify(service('ns', 'b', { clusterIP: '10.96.0.2' })));
    await wait('the EMFILE log line', () => /EMFILE/.test(out));
    await new Promise((r) => setTimeout(r, 500));
    say('keys');
    await wait('the keys', () => out.split('keys ns/a\n').length === 3);
    say('release');
    say('keys-when ns/b');
    await wait('the retry to load sub/b.yaml', () => out.includes('keys ns/a,ns/b\n'));
  } finally {
    if (alive()) child.kill('SIGKILL');
    await exited;
    t.done();
  }
});
