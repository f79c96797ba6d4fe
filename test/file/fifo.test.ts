// Only regular files are read: a FIFO (or socket, device) named *.yaml in the
// input directory must neither block kpng nor keep it from stopping.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { stringify } from 'yaml';
import { service } from '../helpers/k8s.js';
import { kpngSpawn } from '../helpers/cli.js';
import { tmp } from './util.js';

test('a FIFO named *.yaml is skipped: kpng loads the other files and exits promptly on SIGTERM', async () => {
  const t = tmp();
  writeFileSync(join(t.dir, 'a.yaml'), stringify(service('ns', 'web', { clusterIP: '10.96.0.1' })));
  execFileSync('mkfifo', [join(t.dir, 'b.yaml')]);
  writeFileSync(join(t.dir, 'c.yaml'), stringify(service('ns', 'db', { clusterIP: '10.96.0.2' })));
  const k = kpngSpawn(['file', '--input', t.dir, 'to-file', '--output', '-']);
  try {
    await k.until('both Services', () => k.stdout.includes('Name: web') && k.stdout.includes('Name: db'));
    assert.match(k.stderr + k.stdout, /b\.yaml.*not a regular file|not a regular file.*b\.yaml/);
    // a new FIFO while running changes nothing either
    execFileSync('mkfifo', [join(t.dir, 'd.json')]);
    await new Promise((r) => setTimeout(r, 500));
    const t0 = Date.now();
    k.process.kill('SIGTERM');
    const code = await Promise.race([k.exited, new Promise((r) => setTimeout(() => r('timeout'), 3000))]);
    assert.notEqual(code, 'timeout', `kpng did not exit within 3 s of SIGTERM\nstderr:\n${k.stderr}`);
    assert.ok(Date.now() - t0 < 3000);
  } finally {
    await k.stop('SIGKILL');
    t.done();
  }
});
