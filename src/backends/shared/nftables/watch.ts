// The drift check over nftables: kpng subscribes to the kernel's change
// events and reads them at each check. Events come per transaction, ended by
// a generation message (the generation counter moves by one per committed
// transaction); a transaction that touched kpng's objects and is not one of
// kpng's own is drift. Nothing is listed or run, so the check costs nothing
// while nobody changes anything.
//
// kpng's own transactions are known by their generation, not by who
// committed them: each commit kpng makes (an nft run, a session's line, a
// netlink batch, an iptables-restore) runs inside own(), which reads the
// generation before and after it. Each commit of kpng's that succeeds is one
// transaction, and it touches kpng's objects; so between those two
// generations, as many transactions touching kpng's objects as kpng
// committed are its own, and any more is someone else's. A pid names a
// process only within its pid namespace and only while it lives (kpng in a
// pod without hostPID sees other numbers than the kernel reports, and pids
// are reused), and a netlink port id is an autobound pid too: neither is used.
//
// The kernel's events cost about as much as a big load itself, so around a
// big transaction of kpng's own (a cold start) the subscription is paused;
// then the generation counter says whether anyone else committed meanwhile.
import type { Logger } from '../../../runtime/log.js';
import { NftNetlink, type NftEvent, type NftEventHandler, type NftGeneration } from '../../../kernel/nftables.js';
import type { Nft } from './nft.js';
import type { DriftSource, OwnCommits } from '../drift.js';

export type { DriftSource, OwnCommits };

export interface NftWatchOptions {
  /** the objects that are kpng's: a transaction touching them that is not kpng's own is drift */
  readonly ours: (e: NftEvent) => boolean;
  /** the network namespace, when not this process's (tests) */
  readonly netns?: string;
  readonly log: Logger;
}

/** Generations during which kpng committed: (from, to]. */
interface OwnWindow {
  /** the generation before kpng's first commit in it */
  readonly from: number;
  /** the generation after its last; undefined while commits run */
  to?: number;
  /** kpng's commits in it that succeeded (one transaction each) */
  commits: number;
  /** the transactions in it that touched kpng's objects */
  touched: number;
  /** the first of them, described (the log line's why) */
  readonly seen: string[];
}

/** windows not settled yet past this mean the events that settle them are not coming */
const MAX_WINDOWS = 256;
/** transactions a window's log line describes */
const DESCRIBED = 3;

const FAMILIES: Record<number, string> = { 1: 'inet', 2: 'ip', 3: 'arp', 5: 'netdev', 7: 'bridge', 10: 'ip6' };

/** "element deleted in table ip kpng set service-ips by nft, generation 57" */
function describe(e: NftEvent, g: NftGeneration): string {
  const where = `table ${FAMILIES[e.family] ?? e.family} ${e.table}${e.chain ? ` chain ${e.chain}` : ''}${e.set ? ` set ${e.set}` : ''}`;
  return `${e.change} in ${where} by ${g.process || 'a process without a name'}, generation ${g.id}`;
}

export class NftWatch implements DriftSource, OwnCommits, NftEventHandler {
  private nl?: NftNetlink;
  /** why the check cannot trust the events (not started, paused with foreign transactions, events lost) */
  private unknown?: string = 'not started';
  /** the first event of the transaction being read that touched kpng's objects */
  private touching?: NftEvent;
  private paused?: { generation: number };
  /** what drifted, since the last check */
  private drift?: string;
  private failed = false;
  /** kpng's commits awaiting their transactions' events, oldest first; the last may be open */
  private windows: OwnWindow[] = [];
  private open?: OwnWindow;
  private running = 0;
  /** the last generation whose events were read */
  private lastSeen = 0;

  constructor(private readonly o: NftWatchOptions) {}

  /** Subscribes (again). Called before the dataplane is read back: what changes after that is seen. */
  start(): void {
    this.unknown = undefined;
    if (this.nl) {
      this.read();
      // what was committed so far is in the read-back
      this.drift = this.touching = undefined;
      this.windows = this.open ? [this.open] : [];
      return;
    }
    this.drift = this.touching = undefined;
    try {
      this.nl = new NftNetlink(this.o.netns, this);
      this.nl.subscribe(true);
    } catch (e) {
      this.nl?.close();
      this.nl = undefined;
      this.unknown = `nftables change events unavailable (${(e as Error).message})`;
      if (!this.failed) this.o.log.warn({ err: (e as Error).message }, 'nftables change events unavailable: the periodic check reads the whole table back');
      this.failed = true;
    }
  }

  /** Before a big transaction of kpng's own. */
  pause(): void {
    if (!this.nl || this.paused) return;
    try {
      this.read();
      this.nl.subscribe(false);
      this.paused = { generation: this.nl.generation() };
    } catch (e) {
      this.unknown = `pausing the change events failed: ${(e as Error).message}`;
    }
  }

  /** After it: `transactions` of kpng's own were committed meanwhile. */
  resume(transactions: number): void {
    const p = this.paused;
    if (!this.nl || !p) return;
    this.paused = undefined;
    try {
      this.nl.subscribe(true);
      const now = this.nl.generation();
      if (now - p.generation !== transactions) this.unknown = `${now - p.generation - transactions} transaction(s) by another process during a big load`;
      // the count covers what was committed while paused
      this.windows = this.open ? [this.open] : [];
    } catch (e) {
      this.unknown = `resuming the change events failed: ${(e as Error).message}`;
    }
  }

  /**
   * Runs one commit of kpng's own (one transaction when it succeeds) between
   * two readings of the generation. Commits that overlap share one window.
   * While paused, the count at resume() covers them instead.
   */
  async own<T>(commit: () => Promise<T>): Promise<T> {
    if (!this.nl || this.paused) return commit();
    let w = this.open;
    if (!w) {
      const from = this.generationNow();
      if (from === undefined) return commit();
      w = this.open = { from, commits: 0, touched: 0, seen: [] };
      this.windows.push(w);
    }
    this.running++;
    let ok = false;
    try {
      const r = await commit();
      ok = true;
      return r;
    } finally {
      if (ok) w.commits++;
      if (--this.running === 0) this.closeWindow(w);
    }
  }

  /** Why kpng's objects must be read back and repaired, or undefined when nobody else touched them. */
  check(): string | undefined {
    if (this.nl && !this.paused) this.read();
    const why = this.unknown ?? this.drift;
    this.drift = undefined;
    return why;
  }

  close(): void {
    this.nl?.close();
    this.nl = undefined;
    this.windows = [];
    this.open = undefined;
  }

  /** (NftEventHandler) a change event of the transaction being read */
  event(e: NftEvent): void {
    if (!this.touching && this.o.ours(e)) this.touching = e;
  }

  /** (NftEventHandler) the end of a transaction: kpng's own, someone else's, or one not touching kpng's objects */
  generation(g: NftGeneration): void {
    const e = this.touching;
    this.touching = undefined;
    if (g.id > this.lastSeen) this.lastSeen = g.id;
    if (e) {
      const w = this.windows.find((x) => g.id > x.from && (x.to === undefined || g.id <= x.to));
      if (!w) this.drift ??= describe(e, g);
      else if (++w.touched <= DESCRIBED) w.seen.push(describe(e, g));
    }
    this.settle();
  }

  private closeWindow(w: OwnWindow): void {
    this.open = undefined;
    const to = this.generationNow();
    if (to === undefined || to === w.from) {
      // nothing to tell apart (or no way to: unknown says so)
      this.windows = this.windows.filter((x) => x !== w);
      return;
    }
    w.to = to;
    this.settle();
    if (this.windows.length > MAX_WINDOWS) {
      this.unknown = "the change events of kpng's own transactions did not come";
      this.windows = [];
    }
  }

  /** windows whose transactions were all read: more touching kpng's objects than kpng committed is drift */
  private settle(): void {
    while (this.windows.length) {
      const w = this.windows[0];
      if (w.to === undefined || w.to > this.lastSeen) return;
      this.windows.shift();
      if (w.touched > w.commits) {
        const others = w.touched - w.commits;
        this.drift ??= `${others} transaction(s) by another process among kpng's own ${w.commits} (generations ${w.from + 1}-${w.to}), one of: ${w.seen.join('; ')}${w.touched > w.seen.length ? '; ...' : ''}`;
      }
    }
  }

  /** the generation now, or undefined (and the check reads back) when the kernel does not say */
  private generationNow(): number | undefined {
    try {
      return this.nl!.generation();
    } catch (e) {
      this.unknown = `reading the generation failed: ${(e as Error).message}`;
      return undefined;
    }
  }

  private read(): void {
    if (!this.nl) return;
    try {
      if (this.nl.read() === 'lost') this.unknown = 'the kernel dropped change events (too many at once)';
    } catch (e) {
      this.unknown = `reading change events failed: ${(e as Error).message}`;
      this.close();
    }
  }
}

/**
 * The drift source of a table kpng changes through nft: the Nft's own (the
 * fake's), else the kernel's change events, with every commit the Nft makes
 * noted as kpng's own.
 */
export function nftDrift(nft: Nft, o: NftWatchOptions): DriftSource {
  const own = nft.drift?.();
  if (own) return own;
  const watch = new NftWatch(o);
  nft.commitsTo?.(watch);
  return watch;
}
