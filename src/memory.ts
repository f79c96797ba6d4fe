// Giving back what a burst of work left behind. V8 keeps the heap it grew to
// for a cold sync (two to three times what stays in use) until its memory
// reducer notices the process is idle, which may be never on a busy node; a
// node agent's RSS is multiplied by the cluster. After the burst: a full
// collection (compacting at once where that does not raise the peak, in
// steps of a few MB where it would), glibc's
// malloc_trim for what malloc kept of freed buffers (the kube source's list
// pages, TLS), and later a scavenge that lets the young generation shrink
// (measured: docs/benchmarks.md).
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { getHeapSpaceStatistics, setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';

let trim: (() => void) | undefined | null;

/** glibc's malloc_trim(0) through koffi; null where there is none (musl, no koffi) */
function mallocTrim(): (() => void) | null {
  if (trim !== undefined) return trim;
  try {
    const koffi = createRequire(import.meta.url)('koffi');
    const f = koffi.load('libc.so.6').func('int malloc_trim(size_t)');
    trim = () => void f(0);
  } catch {
    trim = null;
  }
  return trim;
}

/** the process's peak RSS (VmHWM), bytes; undefined where /proc has none */
function peakRss(): number | undefined {
  try {
    const kib = /^VmHWM:\s+(\d+) kB/m.exec(readFileSync('/proc/self/status', 'utf8'))?.[1];
    return kib === undefined ? undefined : Number(kib) * 1024;
  } catch {
    return undefined;
  }
}

/** how long after a burst (a full sync) its garbage is collected: off what follows it */
export const TRIM_AFTER_BURST_MS = 2000;

/** after the full collection, when the young generation is collected (and shrunk) */
const YOUNG_AFTER_MS = 8000;

/** between two steps of a compaction in steps */
const STEP_MS = 500;
/** at most this many steps (a full collection each: 0.1-0.3 s at 10k Services) */
const MAX_STEPS = 10;
/**
 * what one step may add to RSS: the live objects V8 copies in one
 * collection under --optimize-for-size (at most 6 MB), and a page
 */
const STEP_COPY = 8 * 2 ** 20;
/** a step that gives back less of V8's heap than this is the last */
const STEP_MIN_GAIN = 2 * 2 ** 20;

type Gc = (opts?: { type: 'minor' | 'major' }) => void;
let collect: Gc | undefined;

function collector(): Gc {
  if (collect) return collect;
  const g = (globalThis as { gc?: Gc }).gc;
  if (g) return (collect = g);
  // --expose-gc for a new context only: nothing else of the process sees gc()
  setFlagsFromString('--expose-gc');
  collect = runInNewContext('gc') as Gc;
  setFlagsFromString('--no-expose-gc');
  return collect;
}

/**
 * A full collection after delayMs (at least the next turn of the event loop:
 * the caller's garbage is then garbage). A delay keeps its cost (0.1-0.3 s
 * at 10k Services) off what follows the burst: the node is
 * programmed, the first changes come. youngAfterMs after it, the young
 * generation is collected once more. Returns a canceller (a process on its
 * way out has nothing to give back).
 */
export function trimMemory(delayMs = 0, youngAfterMs = YOUNG_AFTER_MS, stepMs = STEP_MS): () => void {
  let young: NodeJS.Timeout | undefined;
  let step: NodeJS.Timeout | undefined;
  const t = setTimeout(() => {
    // the young generation grew to 32 MB for the burst; V8 shrinks it in a
    // collection only once allocation has been slow for a while: a
    // scavenge (about a millisecond) some seconds later gives it back
    young = setTimeout(() => collector()({ type: 'minor' }), youngAfterMs).unref();
    // A plain full collection frees the objects but keeps most of the pages
    // they were spread over (at 10k Services V8's heap stayed 196 MB for
    // 109 MB in use). A compacting one then moves the live objects together
    // and the emptied pages go back, but it copies them first: RSS rises by
    // up to the heap in use before it falls. It runs only when that stays
    // under the peak the process already reached (a node's memory limit is
    // set by its peak): at 10k Services with the file source it does; with
    // the kube source (its start peaks lower) and at 30k it does not, and
    // the heap is compacted in steps instead (docs/benchmarks.md).
    const gc = collector();
    gc();
    mallocTrim()?.();
    const { rss, heapUsed } = process.memoryUsage();
    const peak = peakRss();
    if (peak === undefined) return;
    if (rss + heapUsed > peak) {
      let left = MAX_STEPS;
      const next = () => (step = --left > 0 ? setTimeout(compactStep, stepMs).unref() : undefined);
      const compactStep = () => {
        // what is left free is spread too thin to take a collection for it
        if (oldSpaceFree() < STEP_MIN_GAIN) return;
        const before = process.memoryUsage();
        // RSS may not have fallen yet (V8 unmaps freed pages in the background): later
        if (before.rss + STEP_COPY > (peakRss() ?? 0)) return next();
        gcForSize(gc);
        mallocTrim()?.();
        if (before.heapTotal - process.memoryUsage().heapTotal >= STEP_MIN_GAIN) next();
      };
      step = setTimeout(compactStep, stepMs).unref();
      return;
    }
    setFlagsFromString('--compact-on-every-full-gc');
    try {
      gc();
    } finally {
      setFlagsFromString('--no-compact-on-every-full-gc');
    }
    mallocTrim()?.();
  }, delayMs).unref();
  return () => {
    clearTimeout(t);
    clearTimeout(young);
    clearTimeout(step);
  };
}

/** bytes of V8's old space committed but not in use, beyond the tenth of it any heap keeps free */
function oldSpaceFree(): number {
  const old = getHeapSpaceStatistics().find((s) => s.space_name === 'old_space');
  return old ? old.space_size - old.space_used_size - old.space_size / 10 : 0;
}

/**
 * A full collection that compacts the old generation a step: with
 * --optimize-for-size set (for that collection only) V8 picks as
 * evacuation candidates the emptiest pages that are at least 20 % free,
 * and copies at most 6 MB of live objects out of them; a plain collection
 * only pages about 70 % free, at most 4 MB. Repeated, the heap shrinks
 * towards what a compacting collection leaves, but no collection copies
 * more than those 6 MB on top of what the process holds. The flag only
 * chooses the heuristics of this collection (and the heap limit it sets,
 * which the next collection sets again).
 */
function gcForSize(gc: Gc): void {
  setFlagsFromString('--optimize-for-size');
  try {
    gc();
  } finally {
    setFlagsFromString('--no-optimize-for-size');
  }
}

/**
 * The parts as one flat string. A template literal or `+` makes a rope: a
 * 32-byte cell per join that a long-kept string (an nftables element key, a
 * map key) keeps for its life; 390k of them were 13 MiB at 10k Services.
 * Array.prototype.join writes one sequential string instead (given two or
 * more non-empty parts: a single part comes back as it is, rope or not).
 */
export function flat(...parts: (string | number)[]): string {
  return parts.join('');
}
