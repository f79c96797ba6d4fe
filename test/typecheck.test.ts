// The whole tree type-checks (TypeScript strict).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { ROOT } from './helpers/cli.js';

test('tsc --noEmit passes', () => {
  const r = spawnSync(process.execPath, [`${ROOT}node_modules/typescript/bin/tsc`, '--noEmit', '-p', `${ROOT}tsconfig.json`], { encoding: 'utf8', timeout: 180_000 });
  assert.equal(r.status, 0, r.stdout + r.stderr);
});
