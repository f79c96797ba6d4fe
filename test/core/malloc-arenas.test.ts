// limitMallocArenas: the threads of the process share two malloc arenas. A
// file of its own: it loads the TypeScript compiler, which would change the
// heap the trimMemory tests (memory.test.ts) arrange.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import ts from 'typescript';

// glibc's malloc_stats() writes "Arena N:" per arena to stderr; worker threads
// malloc from threads of their own. The child runs memory.ts transpiled, not
// through tsx: tsx's loader thread would take an arena before the limit.
const arenasChild = (memoryJs: string) => `
import { Worker } from 'node:worker_threads';
import { createRequire } from 'node:module';
import { limitMallocArenas } from ${JSON.stringify(memoryJs)};
if (process.env.KPNG_TEST_ARENAS === 'limit') limitMallocArenas();
const work = 'const a = []; for (let i = 0; i < 2000; i++) a.push(Buffer.alloc(4096 + i)); import("node:worker_threads").then((w) => w.parentPort.postMessage(a.length));';
await Promise.all(Array.from({ length: 6 }, () => new Promise((resolve) => new Worker(work, { eval: true }).once('message', resolve))));
createRequire(${JSON.stringify(new URL('../../package.json', import.meta.url).pathname)})('koffi').load('libc.so.6').func('void malloc_stats()')();
`;

// threads that malloc'd before the limit (V8's, at start-up) keep the arena they took
test('limitMallocArenas keeps six more threads that malloc from taking arenas of their own', { skip: process.platform !== 'linux' }, (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'kpng-arenas-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  // memory.ts and the libc binding it imports, at the same relative places
  const transpile = (from: string, to: string) => {
    const src = readFileSync(new URL(`../../src/${from}`, import.meta.url), 'utf8');
    mkdirSync(dirname(join(dir, to)), { recursive: true });
    writeFileSync(join(dir, to), ts.transpileModule(src, { compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 } }).outputText);
  };
  writeFileSync(join(dir, 'package.json'), '{"type":"module"}');
  transpile('runtime/memory.ts', 'runtime/memory.js');
  transpile('kernel/libc.ts', 'kernel/libc.js');
  const memoryJs = join(dir, 'runtime/memory.js');
  const arenas = (mode: string) => {
    // koffi found from the temporary directory as from src/
    const env: NodeJS.ProcessEnv = { ...process.env, NODE_PATH: new URL('../../node_modules', import.meta.url).pathname, KPNG_TEST_ARENAS: mode };
    delete env.MALLOC_ARENA_MAX;
    const r = spawnSync(process.execPath, ['--input-type=module', '-e', arenasChild(memoryJs)], { encoding: 'utf8', env, timeout: 60_000 });
    assert.equal(r.status, 0, r.stderr);
    return (r.stderr.match(/^Arena \d+:/gm) ?? []).length;
  };
  const limited = arenas('limit');
  const free = arenas('free');
  assert.ok(limited >= 1 && limited <= 4, `${limited} arenas with the limit`);
  assert.ok(free >= limited + 5, `${free} arenas without it, ${limited} with it`);
});
