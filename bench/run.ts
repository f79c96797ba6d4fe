// npm run bench -- <name> [args...]: runs bench/<name>.ts (its default export).
// Benchmarks print ratios measured side by side in one run; they are not tests.
// The first line is the machine's yardstick (bench/_harness.ts), measured in
// a process of its own so that its 256 MiB do not count in the benchmark's.
import { readdirSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { machineYardstick } from './_harness.js';

const dir = fileURLToPath(new URL('.', import.meta.url));
const names = readdirSync(dir).filter((f) => f.endsWith('.ts') && f !== 'run.ts' && !f.startsWith('_')).map((f) => f.slice(0, -3)).sort();
const [name, ...args] = process.argv.slice(2);
if (name === '--yardstick') {
  console.log(machineYardstick());
  process.exit(0);
}
if (!name || !names.includes(name)) {
  console.error(`usage: npm run bench -- <name> [args] [--plot DIR]\nbenchmarks: ${names.join(', ')}`);
  process.exit(name ? 1 : 0);
}
// not in a benchmark's own children (run again through this file)
if (!process.env.KPNG_BENCH_CHILD) {
  const y = spawnSync(process.execPath, ['--import', 'tsx', fileURLToPath(import.meta.url), '--yardstick'], { encoding: 'utf8' });
  process.stdout.write(y.stdout || `machine: yardstick failed: ${y.stderr}\n`);
}
const mod = await import(`./${name}.ts`);
await mod.default(args);
