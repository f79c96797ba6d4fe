// What every benchmark shares: its command-line options, statistics over
// samples, the clock, waiting for a condition, reading a process's memory and
// CPU from /proc, the machine's yardstick (printed first by run.ts), kpng
// compiled as production runs it, children forked from a benchmark's own
// file, and plots (`--plot DIR`: SVG files drawn with vega-lite).
//
// A new benchmark imports what it needs from here, and from _scale.ts the
// network namespaces, the synthetic cluster and the proxier child the
// dataplane benchmarks share.
import { fork, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

export const ROOT = fileURLToPath(new URL('..', import.meta.url));

// --- options

/** `--name value`, or def */
export function arg(args: readonly string[], name: string, def: string): string {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? args[i + 1] : def;
}

/** `--name N`, or def */
export const num = (args: readonly string[], name: string, def: number): number => Number(arg(args, name, String(def)));

/** `--name 1000,10000`, or def's numbers */
export const nums = (args: readonly string[], name: string, def: string): number[] => arg(args, name, def).split(',').map(Number);

/** `--name` given (a switch without a value) */
export const flag = (args: readonly string[], name: string): boolean => args.includes(`--${name}`);

/**
 * Options given as `--kebab-name value` pairs into a copy of defaults
 * (camelCase keys): a number where the default is a number, text otherwise;
 * choices restricts a text option's values. An option defaults does not name
 * is refused.
 */
export function options<T extends Record<string, number | string>>(args: readonly string[], defaults: T, choices: { readonly [K in keyof T]?: readonly string[] } = {}): T {
  const o: Record<string, number | string> = { ...defaults };
  for (let i = 0; i < args.length; i += 2) {
    const k = args[i].replace(/^--/, '').replace(/-(\w)/g, (_, x: string) => x.toUpperCase());
    if (!(k in o)) throw new Error(`unknown option ${args[i]}`);
    const allowed = choices[k as keyof T];
    if (allowed && !allowed.includes(args[i + 1])) throw new Error(`${args[i]} ${allowed.join('|')}`);
    o[k] = typeof defaults[k] === 'number' ? Number(args[i + 1]) : args[i + 1];
  }
  return o as T;
}

// --- statistics

/** the p-th percentile: the sorted sample at floor(p/100 × n) (with fewer than 100 samples, p99 is the largest); NaN when empty */
export function pct(xs: readonly number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] : NaN;
}

/** the median (the mean of the two middle ones for an even count); NaN when empty */
export function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  if (!s.length) return NaN;
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
}

export const sum = (xs: readonly number[]): number => xs.reduce((a, b) => a + b, 0);
export const mean = (xs: readonly number[]): number => sum(xs) / xs.length;

/** bytes as whole MB (2^20), for the fan-out benchmarks' lines */
export const mb = (b: number): string => (b / 2 ** 20).toFixed(0);

// --- time

/** ms on CLOCK_MONOTONIC: comparable across the processes of one machine */
export const now = (): number => Number(process.hrtime.bigint()) / 1e6;

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/**
 * Polls cond every everyMs (default 5) until it holds; after timeoutMs
 * throws `${what}: not within N s` (what: a text, or a function giving it
 * then, with the state worth reporting).
 */
export async function until(what: string | (() => string), cond: () => boolean | Promise<boolean>, o: { timeoutMs: number; everyMs?: number }): Promise<void> {
  const end = now() + o.timeoutMs;
  while (!(await cond())) {
    if (now() > end) throw new Error(`${typeof what === 'string' ? what : what()}: not within ${(o.timeoutMs / 1000).toFixed(0)} s`);
    await sleep(o.everyMs ?? 5);
  }
}

// --- processes

export interface ProcStat {
  /** VmRSS, MiB */
  rss: number;
  /** VmHWM (peak RSS), MiB */
  hwm: number;
  /** utime + stime, s */
  cpu: number;
  /** minor page faults (a first touch of fresh memory) */
  faults: number;
}

let clockTicks: number | undefined;

/** a process's memory and CPU, from /proc */
export function procStat(pid: number): ProcStat {
  clockTicks ??= Number(spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).stdout.trim()) || 100;
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kib = (k: string) => Number(new RegExp(`^${k}:\\s+(\\d+) kB`, 'm').exec(status)?.[1] ?? NaN);
  // the fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return { rss: kib('VmRSS') / 1024, hwm: kib('VmHWM') / 1024, cpu: (Number(f[11]) + Number(f[12])) / clockTicks, faults: Number(f[7]) };
}

/**
 * Forks this benchmark's file again (under tsx) with job as JSON in the
 * environment variable key, an IPC channel to the child; the child finds its
 * job with forkedJob(key).
 */
export function forkSelf(moduleUrl: string, key: string, job: object, execArgv: string[] = []): ChildProcess {
  return fork(fileURLToPath(moduleUrl), [], {
    execArgv: ['--import', 'tsx', ...execArgv],
    env: { ...process.env, [key]: JSON.stringify(job) },
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
}

/** In a child of forkSelf: its job; undefined in the benchmark itself. */
export function forkedJob<T>(key: string): T | undefined {
  const job = process.env[key];
  return job ? (JSON.parse(job) as T) : undefined;
}

/**
 * kpng compiled by tsc as dist/ is built, into outDir (others may be using
 * dist/; outDir's ../package.json must be kpng's), from the tree at root;
 * the command that runs it. Throws with tsc's output when it fails.
 */
export function compileKpng(outDir: string, root = ROOT): string[] {
  const r = spawnSync(process.execPath, [join(ROOT, 'node_modules/typescript/bin/tsc'), '-p', 'tsconfig.build.json', '--outDir', outDir, '--declaration', 'false', '--sourceMap', 'false'], { cwd: root, encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`tsc failed:\n${(r.stdout + r.stderr).slice(0, 2000)}`);
  return [process.execPath, join(outDir, 'cli/index.js')];
}

// --- the machine

/**
 * The machine's CPU, and how fast it is apart from kpng's code: results of two runs
 * compare only on machines alike, and this kind of machine's speed varies
 * twofold from one day to another. A fixed JS workload (a deterministic
 * sort and a JSON round trip; best of 3); a first fill of 256 MiB of fresh
 * memory against a second one (page faults: what a large heap's growth
 * pays); and the CPU pressure other jobs put on the host
 * (/proc/pressure/cpu, "some" avg10 / avg60).
 */
export function machineYardstick(): string {
  let js = Infinity;
  for (let run = 0; run < 3; run++) {
    const t = now();
    let x = 12345;
    const xs = new Float64Array(1_000_000).map(() => (x = (Math.imul(x, 1103515245) + 12345) >>> 0));
    xs.sort();
    const objects = Array.from({ length: 50_000 }, (_, i) => ({ name: `svc-${i}`, port: i & 65535, ips: [`10.0.${(i >> 8) & 255}.${i & 255}`] }));
    JSON.parse(JSON.stringify(objects));
    js = Math.min(js, now() - t);
  }
  const fresh = Buffer.allocUnsafe(256 * 2 ** 20); // mapped, not yet touched
  let t = now();
  fresh.fill(1);
  const first = now() - t;
  t = now();
  fresh.fill(2);
  const again = now() - t;
  return `machine: ${cpus()[0]?.model ?? 'unknown CPU'}, ${cpus().length} CPUs; a fixed JS workload ${js.toFixed(0)} ms; 256 MiB of fresh memory filled in ${first.toFixed(0)} ms, again ${again.toFixed(0)} ms; ${cpuPressure()}`;
}

/** the host's CPU pressure now: "some avg10 / avg60" of /proc/pressure/cpu */
export function cpuPressure(): string {
  try {
    const m = /^some avg10=([\d.]+) avg60=([\d.]+)/.exec(readFileSync('/proc/pressure/cpu', 'utf8'));
    return m ? `CPU pressure (some) avg10 ${m[1]}, avg60 ${m[2]}` : 'CPU pressure unknown';
  } catch {
    return 'CPU pressure unknown (no /proc/pressure/cpu)';
  }
}

// --- plots

/** `--plot DIR`: where the benchmark writes its plots, or undefined (no plots) */
export const plotDir = (args: readonly string[]): string | undefined => arg(args, 'plot', '') || undefined;

/** One series of a plot: points of x and y, drawn and named together. */
export interface Point {
  series: string;
  x: number | string;
  y: number;
}

export interface PlotSpec {
  /** the file's name, without .svg */
  name: string;
  title: string;
  /** what was run, printed under the title (the command line is added) */
  subtitle?: string;
  x: { title: string; log?: boolean; ordinal?: boolean };
  y: { title: string; log?: boolean; zero?: boolean };
  series: string;
  /** lines (x a quantity) or grouped bars (x a category) */
  mark: 'line' | 'bar';
  points: readonly Point[];
}

/**
 * Writes dir/name.svg: the points as a vega-lite chart, rendered to SVG in
 * this process by vega's headless View (no browser, no canvas: text is
 * measured by estimate). Under the title: the subtitle and the command line
 * (npm run bench -- ...), so a plot says how to draw it again.
 */
export async function writePlot(dir: string, spec: PlotSpec): Promise<string> {
  const [vega, vegaLite] = await Promise.all([import('vega'), import('vega-lite')]);
  const command = `npm run bench -- ${process.argv.slice(2).join(' ')}`;
  const bars = spec.mark === 'bar';
  const quantity = (a: { log?: boolean; zero?: boolean }) => (a.log ? { type: 'log', nice: false } : { type: 'linear', zero: a.zero ?? true });
  const lite = {
    $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
    width: 520,
    height: 300,
    background: 'white',
    padding: 12,
    title: { text: spec.title, subtitle: [...(spec.subtitle ? [spec.subtitle] : []), command], anchor: 'start', subtitleColor: '#555' },
    data: { values: spec.points.map((p) => ({ ...p })) },
    mark: bars ? { type: 'bar' } : { type: 'line', point: true, strokeWidth: 2 },
    encoding: {
      x: bars ? { field: 'x', type: 'nominal', title: spec.x.title, axis: { labelAngle: 0 }, sort: null } : { field: 'x', type: spec.x.ordinal ? 'ordinal' : 'quantitative', title: spec.x.title, ...(spec.x.ordinal ? {} : { scale: quantity(spec.x) }) },
      y: { field: 'y', type: 'quantitative', title: spec.y.title, scale: quantity(spec.y) },
      // in the order of the points, not alphabetical
      color: { field: 'series', type: 'nominal', title: spec.series, sort: null },
      ...(bars ? { xOffset: { field: 'series', type: 'nominal', sort: null } } : {}),
      tooltip: [{ field: 'series' }, { field: 'x' }, { field: 'y' }],
    },
    config: { font: 'sans-serif', legend: { orient: 'right', labelLimit: 320 } },
  };
  const view = new vega.View(vega.parse(vegaLite.compile(lite as never).spec), { renderer: 'none' });
  const svg = await view.toSVG();
  view.finalize();
  mkdirSync(dir, { recursive: true });
  const file = join(dir, `${spec.name}.svg`);
  writeFileSync(file, svg + '\n');
  console.log(`plot: ${relative(process.cwd(), file) || file}`);
  return file;
}
