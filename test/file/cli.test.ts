// kpng file's own flags.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { kpngSync, ROOT } from '../helpers/cli.js';

test('--debounce and --write-grace take whole milliseconds, naming the flag otherwise', () => {
  const input = join(ROOT, 'examples/cluster.yaml');
  for (const [flag, bad] of [['--debounce', 'x'], ['--write-grace', '-1'], ['--write-grace', '1.5']]) {
    const r = kpngSync(['file', '--input', input, flag, bad, 'to-file', '--output', '-', '--once']);
    assert.equal(r.status, 1, r.stdout);
    assert.match(r.stdout + r.stderr, new RegExp(`${flag}: ${bad.replace('.', '\\.')} is not a whole number of milliseconds`));
  }
  const ok = kpngSync(['file', '--input', input, '--debounce', '20', '--write-grace', '0', 'to-file', '--output', '-', '--once']);
  assert.equal(ok.status, 0, ok.stderr);
  assert.match(ok.stdout, /services:/);
});
