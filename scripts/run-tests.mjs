#!/usr/bin/env node
// The test command: node's runner over an explicit list of test files
// (Node 20 neither expands globs nor finds .ts files by itself), TAP output.
// Fails when no test file is found. `npm test -- test/x.test.ts` runs some.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));
const args = process.argv.slice(2);
let files = args.filter((a) => a.endsWith('.ts'));
const extra = args.filter((a) => !a.endsWith('.ts'));

function find(dir) {
  const out = [];
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) out.push(...find(p));
    else if (e.name.endsWith('.test.ts')) out.push(relative(root, p));
  }
  return out;
}

if (files.length === 0) files = find(join(root, 'test')).sort();
if (files.length === 0 || files.some((f) => !statSync(join(root, f), { throwIfNoEntry: false }))) {
  console.error(files.length ? `test file not found: ${files.join(' ')}` : 'no test files found under test/');
  process.exit(1);
}
// kpng's sockets and node lock in a directory of this run's own, not the host's /run/kpng
const runDir = mkdtempSync(join(tmpdir(), 'kpng-run-'));
const r = spawnSync(process.execPath, ['--import', 'tsx', '--test', '--test-reporter=tap', ...extra, ...files], {
  cwd: root,
  stdio: 'inherit',
  env: { ...process.env, KPNG_TEST: '1', KPNG_RUN_DIR: process.env.KPNG_RUN_DIR ?? runDir },
});
rmSync(runDir, { recursive: true, force: true });
process.exit(r.status ?? 1);
