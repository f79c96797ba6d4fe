// Waiting between attempts, shared by everything that retries (the gRPC
// watch client, the sync runner, the lab's probes).

/** attempt 0, 1, 2...: min doubling up to max, jittered to [0.5, 1.5) so that nodes do not retry in lockstep */
export function backoffDelay(attempt: number, min: number, max: number, random: () => number = Math.random): number {
  const base = Math.min(max, min * 2 ** Math.min(attempt, 30));
  return Math.round(base * (0.5 + random()));
}

/** Sleeps ms; resolves early (false) when signal aborts, true when the time passed. */
export function sleep(ms: number, signal?: AbortSignal): Promise<boolean> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve(false);
    const onAbort = () => {
      clearTimeout(t);
      resolve(false);
    };
    const t = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve(true);
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}
