// The drift check over nftables: kpng subscribes to the kernel's change
// events and reads them at each check. Events come per transaction, ended by
// a generation message naming the process that committed it; a transaction
// by any other process that touched kpng's objects is drift. Nothing else is
// listed or run, so the check costs nothing while nobody changes anything.
//
// The kernel's events cost about as much as a big load itself, so around a
// big transaction of kpng's own (a cold start) the subscription is paused;
// then the generation counter says whether anyone else committed meanwhile
// (the generation moves by one per transaction).
import type { Logger } from '../../../runtime/log.js';
import { NftNetlink, type NftEvent, type NftGeneration } from '../../../kernel/nftables.js';
import type { Nft } from './nft.js';
import type { DriftSource } from '../drift.js';

export type { DriftSource };

export interface NftWatchOptions {
  /** the objects that are kpng's: an event about them, from another process, is drift */
  readonly ours: (e: NftEvent) => boolean;
  /** true for the pid of a process that changes nftables for kpng */
  readonly ownsPid: (pid: number) => boolean;
  /** true for the netlink port of a socket kpng changes nftables through (netlink.ts): a port, unlike a pid, is the same in every pid namespace */
  readonly ownsPort?: (portid: number) => boolean;
  /** the network namespace, when not this process's (tests) */
  readonly netns?: string;
  readonly log: Logger;
}

export class NftWatch implements DriftSource {
  private nl?: NftNetlink;
  /** why the check cannot trust the events (not started, paused with foreign transactions, events lost) */
  private unknown?: string = 'not started';
  private touched = false;
  private paused?: { generation: number };
  /** what drifted, since the last check */
  private drift?: string;
  private failed = false;

  constructor(private readonly o: NftWatchOptions) {}

  /** Subscribes (again). Called before the dataplane is read back: what changes after that is seen. */
  start(): void {
    this.unknown = undefined;
    this.drift = undefined;
    this.touched = false;
    if (this.nl) {
      this.drain();
      this.drift = undefined;
      return;
    }
    try {
      this.nl = new NftNetlink(this.o.netns);
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
      this.drain();
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
    } catch (e) {
      this.unknown = `resuming the change events failed: ${(e as Error).message}`;
    }
  }

  /** Why kpng's objects must be read back and repaired, or undefined when nobody else touched them. */
  check(): string | undefined {
    if (this.nl && !this.paused) this.drain();
    const why = this.unknown ?? this.drift;
    this.drift = undefined;
    return why;
  }

  close(): void {
    this.nl?.close();
    this.nl = undefined;
  }

  private drain(): void {
    if (!this.nl) return;
    try {
      const r = this.nl.read(
        (e) => void (this.touched ||= this.o.ours(e)),
        (g: NftGeneration) => {
          if (this.touched && !this.o.ownsPid(g.pid) && !this.o.ownsPort?.(g.portid)) this.drift ??= `changed by process ${g.pid} (${g.process || 'unknown'}), generation ${g.id}`;
          this.touched = false;
        },
      );
      if (r === 'lost') this.unknown = 'the kernel dropped change events (too many at once)';
    } catch (e) {
      this.unknown = `reading change events failed: ${(e as Error).message}`;
      this.close();
    }
  }
}

/**
 * The drift source of a table kpng changes through nft: the Nft's own (the
 * fake's), else the kernel's change events, kpng's own transactions known
 * by the pids and netlink ports the Nft changes nftables through.
 */
export function nftDrift(nft: Nft, o: Pick<NftWatchOptions, 'ours' | 'netns' | 'log'>): DriftSource {
  return nft.drift?.() ?? new NftWatch({ ...o, ownsPid: (pid) => nft.ownsPid(pid), ownsPort: (port) => nft.ownsPort?.(port) ?? false });
}
