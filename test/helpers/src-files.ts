// The TypeScript files of src/, for the tests that check the tree as a whole
// (its layers, its functions' length).
import { readdirSync } from 'node:fs';
import { join, relative } from 'node:path';
import { ROOT } from './cli.js';

export const SRC = join(ROOT, 'src');

/** every .ts file below src/, src-relative, generated code aside */
export function srcFiles(): string[] {
  const walk = (dir: string): string[] =>
    readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
      const p = join(dir, e.name);
      if (e.isDirectory()) return walk(p);
      return e.name.endsWith('.ts') ? [relative(SRC, p)] : [];
    });
  return walk(SRC).filter((f) => !f.startsWith('api/gen/'));
}
