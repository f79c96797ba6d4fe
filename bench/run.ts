// npm run bench -- <name> [args...]: runs bench/<name>.ts (its default export).
// Benchmarks print ratios measured side by side in one run; they are not tests.
import { readdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const dir = fileURLToPath(new URL('.', import.meta.url));
const names = readdirSync(dir).filter((f) => f.endsWith('.ts') && f !== 'run.ts' && !f.startsWith('_')).map((f) => f.slice(0, -3)).sort();
const [name, ...args] = process.argv.slice(2);
if (!name || !names.includes(name)) {
  console.error(`usage: npm run bench -- <name> [args]\nbenchmarks: ${names.join(', ')}`);
  process.exit(name ? 1 : 0);
}
const mod = await import(`./${name}.ts`);
await mod.default(args);
