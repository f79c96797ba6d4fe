// nftables over netlink: the ruleset's generation, and the change events of
// every committed transaction (each ended by a generation message naming the
// process and the netlink port that committed it).
import { KernelError } from './libc.js';
import { NetlinkSocket, NetlinkWriter, NETLINK_NETFILTER, NLM_F_REQUEST, type NetlinkMessage } from './netlink.js';

const NFNL_SUBSYS_NFTABLES = 10;
const NFT_MSG_NEWGEN = 15;
const NFT_MSG_GETGEN = 16;
const NFNLGRP_NFTABLES = 7;

/** A change event: which table (and, for rules and chains, which chain) it touched. */
export interface NftEvent {
  /** nfgenmsg family: 2 ip, 10 ip6, 1 inet, ... */
  readonly family: number;
  readonly table: string;
  /** the chain of a rule or chain event; '' otherwise */
  readonly chain: string;
}

/** The end of a committed transaction: its generation and the process that committed it. */
export interface NftGeneration {
  readonly id: number;
  /** the committing thread's pid, as the kernel's own pid namespace numbers it */
  readonly pid: number;
  readonly process: string;
  /** the netlink port of the socket that committed it */
  readonly portid: number;
}

/** A netlink socket to nftables: the generation id, and (subscribed) the change events of every transaction. */
export class NftNetlink {
  private readonly nl: NetlinkSocket;
  private seq = 0;
  private subscribed = false;
  /** events read while waiting for an answer, for the next read() */
  private queued: ({ e: NftEvent } | { g: NftGeneration })[] = [];

  constructor(netns?: string) {
    // room for a burst of events between two checks
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
    // the answer (a NEWGEN to this port) comes at once; events may be queued before it
    let id: number | undefined;
    this.nl.await(
      () => id !== undefined,
      (m) => {
        if (m.pid === this.nl.port && m.seq === seq) {
          if (m.isError) throw new KernelError(`GETGEN refused: errno ${m.errno}`);
          if ((m.type & 0xff) === NFT_MSG_NEWGEN) id = m.u32BE(m.attrs().get(1));
          return;
        }
        this.queue(m);
      },
    );
    return id!;
  }

  /**
   * Reads what is queued: change events and generations, in order. Returns
   * 'lost' when the kernel dropped events (the buffer was full).
   */
  read(onEvent: (e: NftEvent) => void, onGeneration: (g: NftGeneration) => void): 'ok' | 'lost' {
    this.nl.drain((m) => (m.pid === this.nl.port ? undefined : this.queue(m)));
    const list = this.queued;
    this.queued = [];
    for (const x of list) ('e' in x ? onEvent(x.e) : onGeneration(x.g));
    const lost = this.nl.lost;
    this.nl.lost = false;
    return lost ? 'lost' : 'ok';
  }

  close(): void {
    this.nl.close();
  }

  private queue(m: NetlinkMessage): void {
    if (m.isError || m.type >> 8 !== NFNL_SUBSYS_NFTABLES) return;
    const type = m.type & 0xff;
    const a = m.attrs();
    if (type === NFT_MSG_NEWGEN) this.queued.push({ g: { id: m.u32BE(a.get(1)) ?? 0, pid: m.u32BE(a.get(2)) ?? 0, process: m.string(a.get(3)) ?? '', portid: m.pid } });
    // table: attribute 1 of every kind; chain: 3 of a chain event (3-5), 2 of a rule event (6-8)
    else this.queued.push({ e: { family: m.head0, table: m.string(a.get(1)) ?? '', chain: type >= 3 && type <= 8 ? (m.string(a.get(type <= 5 ? 3 : 2)) ?? '') : '' } });
  }
}
