// Bounded waiting, the one way tests wait for something to happen: poll a
// condition until it holds, and fail naming what was awaited when it does not
// in time. A test that must show that something did NOT happen first waits
// for a positive signal that it would have by now (a read counter, a store
// revision, a later change taken), never for a fixed time.

export interface UntilOptions {
  /** give up after this long (default 5 s) */
  readonly timeoutMs?: number;
  /** between two looks (default 10 ms; more for a condition that costs, as a fetch) */
  readonly everyMs?: number;
  /** more to say when it times out (the state it was in) */
  readonly detail?: () => string;
  /** a reason to stop waiting at once (the process that was to do it exited), or undefined */
  readonly failIf?: () => string | undefined;
}

/** Polls cond until it holds; throws after timeoutMs naming what it waited for. */
export async function until(what: string, cond: () => boolean | Promise<boolean>, opts: UntilOptions = {}): Promise<void> {
  const timeoutMs = opts.timeoutMs ?? 5000;
  const end = Date.now() + timeoutMs;
  while (!(await cond())) {
    const detail = () => (opts.detail ? ` ${opts.detail()}` : '');
    const failed = opts.failIf?.();
    if (failed !== undefined) throw new Error(`${failed} before ${what}${detail()}`);
    if (Date.now() > end) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${detail()}`);
    await sleep(opts.everyMs ?? 10);
  }
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
