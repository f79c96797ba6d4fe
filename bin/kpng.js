#!/usr/bin/env node
// Runs the compiled CLI (dist/), or the TypeScript sources through tsx when
// dist/ is missing or older than src/ (a development checkout).
import { existsSync, statSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));
const dist = join(root, 'dist/cli/index.js');
const src = join(root, 'src');

function newest(dir) {
  let t = 0;
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    t = Math.max(t, e.isDirectory() ? newest(p) : statSync(p).mtimeMs);
  }
  return t;
}

if (existsSync(dist) && (!existsSync(src) || statSync(dist).mtimeMs >= newest(src))) {
  await import(dist);
} else {
  const { register } = await import('tsx/esm/api');
  register();
  await import(join(src, 'cli/index.ts'));
}
