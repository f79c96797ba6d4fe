// Giving back what a burst of work left behind. V8 keeps the heap it grew to
// for a cold sync (two to three times what stays in use) until its memory
// reducer notices the process is idle, which may be never on a busy node; a
// node agent's RSS is multiplied by the cluster. After the burst: full
// collections while they give pages back, glibc's malloc_trim for what
// malloc kept of freed buffers (the kube source's list pages, TLS), and
// later a scavenge that lets the young generation shrink. And from the
// start, few malloc arenas. docs/design/memory-trimming.md tells what each
// step gives back.
import { readFileSync } from 'node:fs';
import type { Session } from 'node:inspector';
import { createRequire } from 'node:module';
import { getHeapSpaceStatistics, setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { libcIfAny } from '../kernel/libc.js';

let trim: (() => void) | undefined | null;

/** glibc's malloc_trim(0); null where there is none */
function mallocTrim(): (() => void) | null {
  if (trim !== undefined) return trim;
  const c = libcIfAny();
  trim = c ? () => void c.mallocTrim(0) : null;
  return trim;
}

/** glibc's mallopt parameter for the most arenas (malloc.h) */
const M_ARENA_MAX = -8;

/**
 * At most `arenas` malloc arenas, unless MALLOC_ARENA_MAX says otherwise.
 * glibc gives each thread that mallocs (V8's GC helpers, libuv's pool) an
 * arena of its own up to 8 per CPU, and each keeps its own free fragments
 * that count in the node agent's settled RSS; two arenas leave few of them
 * (docs/design/memory-trimming.md). Called first thing, before those
 * threads malloc.
 */
export function limitMallocArenas(arenas = 2): void {
  if (process.env.MALLOC_ARENA_MAX) return;
  libcIfAny()?.mallopt(M_ARENA_MAX, arenas);
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

/**
 * Bytes a compacting collection may copy: what is in use in the spaces it
 * evacuates. Large objects (a big array's backing store) and the young
 * generation are not moved, so heapUsed overstates the copy, enough to keep
 * a compaction that fits under the peak from running.
 */
function movableBytes(): number {
  let n = 0;
  for (const s of getHeapSpaceStatistics()) if (s.space_name === 'old_space' || s.space_name === 'code_space') n += s.space_used_size;
  return n;
}

/** how long after a burst (a full sync) its garbage is collected: off what follows it */
export const TRIM_AFTER_BURST_MS = 2000;

/** after the full collections, when the young generation is given back */
const YOUNG_AFTER_MS = 1000;

/**
 * V8's low-memory notification, as the inspector's collectGarbage makes it:
 * full collections flagged to reduce memory, after which V8 shrinks the
 * young generation at once (a plain collection shrinks it only once
 * allocation has been slow for about 5 s). done() when it is over; false
 * where there is no inspector (a build without it).
 */
function lowMemoryNotification(done: () => void): boolean {
  let session: Session;
  try {
    // required here: importing node:inspector throws in a build without it
    const inspector = createRequire(import.meta.url)('node:inspector') as typeof import('node:inspector');
    session = new inspector.Session();
    session.connect();
  } catch {
    return false;
  }
  // disconnecting within the reply's callback stalled the event loop: after it
  session.post('HeapProfiler.collectGarbage', () =>
    setImmediate(() => {
      session.disconnect();
      done();
    }),
  );
  return true;
}

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

/** between two collections of a trim */
const STEP_GAP_MS = 250;
/** a collection that gave back less of V8's heap than this is the trim's last */
const STEP_MIN_GAIN = 4 << 20;
/** collections after the first stop once they took this long together (each one stops the event loop) */
const STEP_BUDGET_MS = 1000;
/**
 * a collection that stopped the event loop longer than this is the trim's
 * last step: a change that comes in waits it out, and on a heap that large
 * a step gives back little for its pause, less than the low-memory
 * notification after the steps does
 */
const STEP_MAX_PAUSE_MS = 300;
/**
 * after a full collection, V8's memory reducer runs this much later when
 * allocation is quiet: during a trim, and V8's default. (Only from a first
 * full collection: each later one while the reducer waits puts it 8 s after
 * itself, V8's fixed delay, so after a trim of several steps the reducer
 * comes about 8 s after the trim's last collection whatever this is;
 * docs/design/memory-trimming.md.)
 */
const REDUCER_DELAY_MS = 1000;
const REDUCER_DEFAULT_MS = 8000;

/**
 * How long V8 is told to favour memory after a trim: its memory reducer
 * starts 8 s after the last full collection (the trim's), and its marking
 * steps on a large heap must fit in what is left
 */
const FAVOUR_MEMORY_MS = 10_000;
const FAVOURED_BY_OPERATOR = process.execArgv.some((a) => a === '--optimize-for-size' || a === '--optimize_for_size');

/**
 * Full collections after delayMs (at least the next turn of the event loop:
 * the caller's garbage is then garbage); the delay keeps their cost off
 * what follows the burst (the node is programmed, the first changes come).
 *
 * One full collection frees the objects but keeps most of the pages they
 * were spread over. Each further one moves the survivors of a few sparse
 * pages together and gives those pages back, without the copy of the
 * whole heap that forcing compaction costs. So collections
 * follow one another, STEP_GAP_MS apart, while each gives back at least
 * STEP_MIN_GAIN and within STEP_BUDGET_MS, and none paused the event loop
 * longer than maxStepPauseMs. Then, collections being short, one
 * compacting collection moves what is left together, if copying it all
 * stays under the peak RSS the process already reached (on a large heap it
 * does only after the steps), and V8's memory reducer, told at the first
 * step to come sooner, does the rest while the process is quiet.
 * youngAfterMs after the last, V8's low-memory notification compacts in
 * its way and gives back the young generation (without an inspector, a
 * scavenge). docs/design/memory-trimming.md has what each step gives back.
 * Returns a canceller (a process on its way out has nothing to give back).
 */
export function trimMemory(delayMs = 0, youngAfterMs = YOUNG_AFTER_MS, maxStepPauseMs = STEP_MAX_PAUSE_MS): () => void {
  let timer: NodeJS.Timeout | undefined;
  /** after the steps: the low-memory notification, then the end of favouring memory */
  let after: NodeJS.Timeout | undefined;
  let committed = process.memoryUsage().heapTotal;
  let spentMs = 0;
  let first = true;
  let favouring = false;
  const unfavour = () => {
    if (favouring) setFlagsFromString('--no-optimize-for-size');
    favouring = false;
  };
  const step = () => {
    const gc = collector();
    if (first) {
      setFlagsFromString(`--gc-memory-reducer-start-delay-ms=${REDUCER_DELAY_MS}`);
      // after a trim the reducer finds little, yet each of its up to three
      // incremental collections pauses the event loop on a large heap, and
      // a change that comes in meanwhile waits
      setFlagsFromString('--memory-reducer-single-gc');
    }
    const t0 = performance.now();
    gc();
    mallocTrim()?.();
    const pauseMs = performance.now() - t0;
    if (!first) spentMs += pauseMs;
    const now = process.memoryUsage().heapTotal;
    const gained = committed - now;
    committed = now;
    first = false;
    const short = pauseMs <= maxStepPauseMs;
    if (gained >= STEP_MIN_GAIN && spentMs < STEP_BUDGET_MS && short) {
      timer = setTimeout(step, STEP_GAP_MS).unref();
      return;
    }
    // what is left sparse: one compacting collection moves it all together,
    // if copying it stays under the peak the process already reached (a
    // node's memory limit is set by its peak) and collections are short
    const peak = peakRss();
    if (short && peak !== undefined && process.memoryUsage.rss() + movableBytes() <= peak) {
      setFlagsFromString('--compact-on-every-full-gc');
      try {
        gc();
      } finally {
        setFlagsFromString('--no-compact-on-every-full-gc');
      }
      mallocTrim()?.();
    }
    // youngAfterMs later (V8's memory reducer, told to come sooner, has had
    // its turn at what the steps left), the young generation the burst grew
    // to 32 MB is given back: by a low-memory notification; without one, by
    // a scavenge, which shrinks it only once allocation has been slow for a
    // while. Later bursts' own collections are not followed by the reducer
    // so soon (its collections cost CPU). After a long collection, at once:
    // V8's memory reducer makes its one collection 8 s after the last full
    // one, and a large heap's marking steps had better come before the
    // changes do.
    after = setTimeout(() => {
      const settled = () => {
        setFlagsFromString(`--gc-memory-reducer-start-delay-ms=${REDUCER_DEFAULT_MS}`);
        // V8 rates allocation only at its own collections, over the last
        // ten, and an idle agent makes none: after a trim its memory reducer
        // keeps seeing the burst and holds its one collection of the whole
        // heap until the changes' own scavenges, and a change then waits for
        // it. Told to favour memory (as for a process in the background), it
        // collects at its next check, whatever rate it recorded, while the
        // agent is quiet. (Scavenges to record the quiet do not do: how many
        // it takes depends on the heap; docs/design/memory-trimming.md.)
        // (not when node was started with it: it stays as the operator set it)
        if (FAVOURED_BY_OPERATOR) return;
        setFlagsFromString('--optimize-for-size');
        favouring = true;
        after = setTimeout(unfavour, FAVOUR_MEMORY_MS).unref();
      };
      if (lowMemoryNotification(() => (mallocTrim()?.(), settled()))) return;
      collector()({ type: 'minor' });
      settled();
    }, short ? youngAfterMs : 0).unref();
  };
  timer = setTimeout(step, delayMs).unref();
  return () => {
    clearTimeout(timer);
    clearTimeout(after);
    unfavour();
    if (!first) setFlagsFromString(`--gc-memory-reducer-start-delay-ms=${REDUCER_DEFAULT_MS}`);
  };
}

/**
 * The parts as one flat string. A template literal or `+` makes a rope: a
 * 32-byte cell per join that a long-kept string (an nftables element key, a
 * map key) keeps for its life, and a node keeps hundreds of thousands.
 * Array.prototype.join writes one sequential string instead (given two or
 * more non-empty parts: a single part comes back as it is, rope or not;
 * docs/design/flat-strings.md).
 */
export function flat(...parts: (string | number)[]): string {
  return parts.join('');
}
