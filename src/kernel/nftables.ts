// nftables over netlink: the ruleset's generation, and the change events of
// every committed transaction (each ended by a generation message naming the
// process that committed it).
import { KernelError } from './libc.js';
import { NetlinkSocket, NetlinkWriter, NETLINK_NETFILTER, NLM_F_REQUEST, type NetlinkMessage } from './netlink.js';

const NFNL_SUBSYS_NFTABLES = 10;
const NFT_MSG_NEWGEN = 15;
const NFT_MSG_GETGEN = 16;
const NFNLGRP_NFTABLES = 7;

/** message types (linux/netfilter/nf_tables.h) -> what a change event did, for log lines */
const CHANGES: Record<number, string> = {
  0: 'table added',
  2: 'table deleted',
  3: 'chain added',
  5: 'chain deleted',
  6: 'rule added',
  8: 'rule deleted',
  9: 'set added',
  11: 'set deleted',
  12: 'element added',
  14: 'element deleted',
  18: 'object added',
  20: 'object deleted',
  22: 'flowtable added',
  24: 'flowtable deleted',
};

/** A change event: which table (and, for rules and chains, which chain; for sets and elements, which set) it touched. */
export interface NftEvent {
  /** nfgenmsg family: 2 ip, 10 ip6, 1 inet, ... */
  readonly family: number;
  readonly table: string;
  /** the chain of a rule or chain event; '' otherwise */
  readonly chain: string;
  /** the set of a set or element event; '' otherwise */
  readonly set: string;
  /** what it did: "element deleted", "rule added", ... */
  readonly change: string;
}

/** The end of a committed transaction: its generation and the name of the process that committed it. */
export interface NftGeneration {
  readonly id: number;
  /** the committing process's name, as the kernel reports it (its comm) */
  readonly process: string;
}

/** Where the change events read from the socket go, in the order the kernel sent them. */
export interface NftEventHandler {
  event(e: NftEvent): void;
  /** the end of a transaction: the events before it (since the previous one) are its */
  generation(g: NftGeneration): void;
}

/**
 * A netlink socket to nftables: the generation id, and (subscribed) the
 * change events of every transaction, which go to the handler as they are
 * read (also while waiting for a generation id: they come first).
 */
export class NftNetlink {
  private readonly nl: NetlinkSocket;
  private seq = 0;
  private subscribed = false;

  constructor(
    netns?: string,
    private readonly handler?: NftEventHandler,
  ) {
    // room for a burst of events between two reads
    this.nl = new NetlinkSocket(NETLINK_NETFILTER, netns, 32 << 20);
  }

  /** Receive every transaction's change events (or stop). */
  subscribe(on: boolean): void {
    if (on === this.subscribed) return;
    this.nl.membership(NFNLGRP_NFTABLES, on);
    this.subscribed = on;
  }

  /** The ruleset's current generation (every committed transaction adds one). */
  generation(): number {
    const seq = ++this.seq;
    this.nl.send(new NetlinkWriter().begin((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETGEN, NLM_F_REQUEST, seq, [0, 0, 0]).end().take());
    // the answer (a NEWGEN to this port) comes at once, behind the events queued before it
    let id: number | undefined;
    this.nl.await(
      () => id !== undefined,
      (m) => {
        if (m.pid === this.nl.port && m.seq === seq) {
          if (m.isError) throw new KernelError(`GETGEN refused: errno ${m.errno}`);
          if ((m.type & 0xff) === NFT_MSG_NEWGEN) id = m.u32BE(m.attrs().get(1));
          return;
        }
        this.dispatch(m);
      },
    );
    return id!;
  }

  /**
   * Reads what is queued: change events and generations go to the handler,
   * in order. Returns 'lost' when the kernel dropped events since the last
   * read (the buffer was full).
   */
  read(): 'ok' | 'lost' {
    this.nl.drain((m) => this.dispatch(m));
    const lost = this.nl.lost;
    this.nl.lost = false;
    return lost ? 'lost' : 'ok';
  }

  close(): void {
    this.nl.close();
  }

  private dispatch(m: NetlinkMessage): void {
    // answers to this socket's own requests are not events
    if (m.pid === this.nl.port || !this.handler || m.isError || m.type >> 8 !== NFNL_SUBSYS_NFTABLES) return;
    const type = m.type & 0xff;
    const a = m.attrs();
    if (type === NFT_MSG_NEWGEN) return this.handler.generation({ id: m.u32BE(a.get(1)) ?? 0, process: m.string(a.get(3)) ?? '' });
    // table: attribute 1 of every kind; chain: 3 of a chain event (3-5), 2 of a rule event (6-8); set: 2 of a set or element event (9-14)
    this.handler.event({
      family: m.head0,
      table: m.string(a.get(1)) ?? '',
      chain: type >= 3 && type <= 8 ? (m.string(a.get(type <= 5 ? 3 : 2)) ?? '') : '',
      set: type >= 9 && type <= 14 ? (m.string(a.get(2)) ?? '') : '',
      change: CHANGES[type] ?? `change ${type}`,
    });
  }
}
