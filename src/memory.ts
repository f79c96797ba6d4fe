// Giving back what a burst of work left behind. V8 keeps the heap it grew to
// for a cold sync (two to three times what stays in use) until its memory
// reducer notices the process is idle, which may be never on a busy node; a
// node agent's RSS is multiplied by the cluster. A full collection after
// the burst returns the free pages at once (measured: docs/benchmarks.md).
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';

let collect: (() => void) | undefined;

function collector(): () => void {
  if (collect) return collect;
  const g = (globalThis as { gc?: () => void }).gc;
  if (g) return (collect = g);
  // --expose-gc for a new context only: nothing else of the process sees gc()
  setFlagsFromString('--expose-gc');
  collect = runInNewContext('gc') as () => void;
  setFlagsFromString('--no-expose-gc');
  return collect;
}

/** A full collection, on the next turn of the event loop (the caller's garbage is then garbage). */
export function trimMemory(): void {
  setImmediate(() => collector()());
}
