// The import graph of src/ runs one way along the pipeline and has no circle:
// each layer imports only the layers below it (and itself), no backend
// imports another, and no chain of imports comes back to where it started.
// Static and dynamic imports count alike: a lazy import is still a dependency.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { dirname, join, normalize } from 'node:path';
import { SRC, srcFiles } from '../helpers/src-files.js';

/** From the ground up: a layer may import those at a lower rank. */
const RANKS: Record<string, number> = {
  kernel: 0,
  runtime: 1,
  api: 2,
  store: 3,
  lab: 3,
  sources: 4,
  localstate: 4,
  diff: 5,
  aggregator: 5,
  backends: 6,
  sinks: 7,
  get: 7,
  trace: 7,
  cli: 8,
  'index.ts': 9,
};

const IMPORT = /(?:\bfrom\s*|\bimport\s*\(\s*|^\s*import\s+)['"](\.{1,2}\/[^'"]+)['"]/gm;

/** src-relative .ts files each file imports */
function importsOf(file: string): string[] {
  const text = readFileSync(join(SRC, file), 'utf8');
  const out: string[] = [];
  for (const m of text.matchAll(IMPORT)) {
    const target = normalize(join(dirname(file), m[1]!)).replace(/\.js$/, '.ts');
    if (target.endsWith('.ts')) out.push(target);
  }
  return out;
}

const layerOf = (file: string) => (file.includes('/') ? file.slice(0, file.indexOf('/')) : file);
const backendOf = (file: string) => /^backends\/([^/]+)\//.exec(file)?.[1];

const files = srcFiles();
const graph = new Map(files.map((f) => [f, importsOf(f)]));

test('every file of src/ belongs to a known layer', () => {
  const unknown = files.filter((f) => RANKS[layerOf(f)] === undefined);
  assert.deepEqual(unknown, [], 'give these a rank in RANKS (test/core/layers.test.ts)');
});

test('no layer imports a layer above it', () => {
  const upward: string[] = [];
  for (const [file, imports] of graph) {
    const rank = RANKS[layerOf(file)]!;
    for (const t of imports) {
      const layer = layerOf(t);
      if (layer !== layerOf(file) && RANKS[layer]! >= rank) upward.push(`${file} -> ${t}`);
    }
  }
  assert.deepEqual(upward, []);
});

test('no backend imports another backend (shared/ is for all of them)', () => {
  const across: string[] = [];
  for (const [file, imports] of graph) {
    const b = backendOf(file);
    if (!b || b === 'shared') continue;
    for (const t of imports) {
      const tb = backendOf(t);
      if (tb && tb !== b && tb !== 'shared') across.push(`${file} -> ${t}`);
    }
  }
  assert.deepEqual(across, []);
});

test('no circle of imports', () => {
  // Tarjan's strongly connected components: any of more than one file is a circle
  let index = 0;
  const idx = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const circles: string[][] = [];
  const visit = (v: string): void => {
    idx.set(v, index);
    low.set(v, index++);
    stack.push(v);
    onStack.add(v);
    for (const w of graph.get(v) ?? []) {
      if (!graph.has(w)) continue;
      if (!idx.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v)!, idx.get(w)!));
    }
    if (low.get(v) === idx.get(v)) {
      const scc: string[] = [];
      let w: string;
      do {
        w = stack.pop()!;
        onStack.delete(w);
        scc.push(w);
      } while (w !== v);
      if (scc.length > 1 || (graph.get(v) ?? []).includes(v)) circles.push(scc.sort());
    }
  };
  for (const f of graph.keys()) if (!idx.has(f)) visit(f);
  assert.deepEqual(circles, []);
});
