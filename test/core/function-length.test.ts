// No function in src/ is longer than a screen (MAX_LINES), unless it is
// listed below with why: a long function split into named steps reads as
// what it does. Nested functions count within the one that holds them.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import ts from 'typescript';
import { SRC, srcFiles } from '../helpers/src-files.js';

const MAX_LINES = 120;

/** src-relative file:function -> why it may be longer */
const EXCEPTIONS: Record<string, string> = {
  'backends/iptables/rules.ts:renderPort': "upstream's syncProxyRules loop body, kept whole to read beside it",
};

/** a function's name as a reader finds it: Class.method, the variable or property it is, or where it is */
function nameOf(fn: ts.FunctionLikeDeclaration, sf: ts.SourceFile): string {
  const own = fn.name && !ts.isComputedPropertyName(fn.name) ? fn.name.getText(sf) : undefined;
  const parent = fn.parent;
  if (own && ts.isClassLike(parent)) return `${parent.name?.getText(sf) ?? '<class>'}.${own}`;
  if (own) return own;
  if (ts.isVariableDeclaration(parent) || ts.isPropertyAssignment(parent) || ts.isPropertyDeclaration(parent)) return parent.name.getText(sf);
  if (ts.isConstructorDeclaration(fn) && ts.isClassLike(parent)) return `${parent.name?.getText(sf) ?? '<class>'}.constructor`;
  return `<function at line ${sf.getLineAndCharacterOfPosition(fn.getStart(sf)).line + 1}>`;
}

/** every function of src/ (generated code aside) with its length in lines, from its first line to its last */
function functionLengths(): Map<string, number> {
  const out = new Map<string, number>();
  for (const file of srcFiles()) {
    const sf = ts.createSourceFile(file, readFileSync(join(SRC, file), 'utf8'), ts.ScriptTarget.Latest, true);
    const visit = (n: ts.Node) => {
      if (ts.isFunctionLike(n) && 'body' in n && n.body) {
        const fn = n as ts.FunctionLikeDeclaration;
        const line = (pos: number) => sf.getLineAndCharacterOfPosition(pos).line;
        const id = `${file}:${nameOf(fn, sf)}`;
        out.set(id, Math.max(out.get(id) ?? 0, line(fn.getEnd()) - line(fn.getStart(sf)) + 1));
      }
      ts.forEachChild(n, visit);
    };
    visit(sf);
  }
  return out;
}

const lengths = functionLengths();

test(`no function in src/ is longer than ${MAX_LINES} lines, but those listed with why`, () => {
  const long = [...lengths].filter(([id, n]) => n > MAX_LINES && !EXCEPTIONS[id]).map(([id, n]) => `${id} (${n} lines)`);
  assert.deepEqual(long, [], 'split these into named steps, or list them in EXCEPTIONS (test/core/function-length.test.ts) with why');
});

test('every exception is still a long function of src/', () => {
  for (const id of Object.keys(EXCEPTIONS)) assert.ok((lengths.get(id) ?? 0) > MAX_LINES, `${id}: no longer needs its exception`);
});
