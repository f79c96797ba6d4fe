// The few kernel interfaces kpng reads directly, through koffi (FFI to libc):
// the nftables generation and change events (netlink, NETLINK_NETFILTER), and
// the size of an iptables-legacy table (getsockopt IPT_SO_GET_INFO). They make
// the periodic drift check cheap: no tool to run and nothing to list while
// nobody else changed anything. The boundary is small and typed on purpose
// (a wrong pointer crashes the process instead of throwing); anything that
// fails here throws a KernelError and the caller falls back.
import { closeSync, openSync } from 'node:fs';
import { createRequire } from 'node:module';

export class KernelError extends Error {}

interface Libc {
  socket(domain: number, type: number, protocol: number): number;
  bind(fd: number, addr: Buffer, len: number): number;
  send(fd: number, buf: Buffer, len: number, flags: number): number | bigint;
  recv(fd: number, buf: Buffer, len: number, flags: number): number | bigint;
  setsockopt(fd: number, level: number, name: number, val: Buffer, len: number): number;
  getsockopt(fd: number, level: number, name: number, val: Buffer, len: Buffer): number;
  getsockname(fd: number, addr: Buffer, len: Buffer): number;
  setns(fd: number, nstype: number): number;
  close(fd: number): number;
  errno(): number;
}

let libc: Libc | undefined;
let loadError: string | undefined;

/** libc through koffi, loaded on first use; throws KernelError where that cannot work. */
function lib(): Libc {
  if (libc) return libc;
  if (loadError) throw new KernelError(loadError);
  try {
    const koffi = createRequire(import.meta.url)('koffi');
    const c = koffi.load('libc.so.6');
    libc = {
      socket: c.func('int socket(int, int, int)'),
      bind: c.func('int bind(int, void *, uint32_t)'),
      send: c.func('long send(int, void *, size_t, int)'),
      recv: c.func('long recv(int, _Out_ void *, size_t, int)'),
      setsockopt: c.func('int setsockopt(int, int, int, void *, uint32_t)'),
      getsockopt: c.func('int getsockopt(int, int, int, _Inout_ void *, _Inout_ void *)'),
      getsockname: c.func('int getsockname(int, _Inout_ void *, _Inout_ void *)'),
      setns: c.func('int setns(int, int)'),
      close: c.func('int close(int)'),
      errno: () => koffi.errno() as number,
    };
    return libc;
  } catch (e) {
    loadError = `no FFI to libc (koffi): ${(e as Error).message}`;
    throw new KernelError(loadError);
  }
}

const AF_INET = 2;
const AF_INET6 = 10;
const AF_NETLINK = 16;
const SOCK_RAW = 3;
const SOCK_NONBLOCK = 0o4000;
const SOCK_CLOEXEC = 0o2000000;
const NETLINK_NETFILTER = 12;
const SOL_SOCKET = 1;
const SO_RCVBUFFORCE = 33;
const SOL_NETLINK = 270;
const NETLINK_ADD_MEMBERSHIP = 1;
const NETLINK_DROP_MEMBERSHIP = 2;
const MSG_DONTWAIT = 0x40;
const EAGAIN = 11;
const ENOBUFS = 105;
const CLONE_NEWNET = 0x40000000;
const IPPROTO_RAW = 255;

/**
 * Runs fn with this thread in another network namespace (a name under
 * /run/netns, or a path); sockets made there stay there. Without netns, in
 * this process's own.
 */
function inNetns<T>(netns: string | undefined, fn: () => T): T {
  if (!netns) return fn();
  const c = lib();
  const own = openSync('/proc/thread-self/ns/net', 'r');
  const target = openSync(netns.includes('/') ? netns : `/run/netns/${netns}`, 'r');
  try {
    if (c.setns(target, CLONE_NEWNET) !== 0) throw new KernelError(`setns ${netns}: errno ${c.errno()}`);
    try {
      return fn();
    } finally {
      if (c.setns(own, CLONE_NEWNET) !== 0) throw new KernelError(`setns back: errno ${c.errno()}`); // cannot happen: the thread was there
    }
  } finally {
    closeSync(own);
    closeSync(target);
  }
}

// --- nftables over netlink

const NFNL_SUBSYS_NFTABLES = 10;
const NFT_MSG_NEWGEN = 15;
const NFT_MSG_GETGEN = 16;
const NFNLGRP_NFTABLES = 7;
const NLMSG_ERROR = 2;

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
  readonly pid: number;
  readonly process: string;
}

/** A netlink socket to nftables: the generation id, and (subscribed) the change events of every transaction. */
export class NftNetlink {
  private readonly c: Libc;
  private fd: number;
  /** this socket's netlink port id: answers to its requests carry it */
  private readonly port: number;
  private seq = 0;
  private readonly buf = Buffer.alloc(1 << 20);
  private subscribed = false;
  /** events read while waiting for an answer, for the next read() */
  private queued: ({ e: NftEvent } | { g: NftGeneration })[] = [];
  private lost = false;

  constructor(netns?: string) {
    this.c = lib();
    const c = this.c;
    this.fd = inNetns(netns, () => c.socket(AF_NETLINK, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, NETLINK_NETFILTER));
    if (this.fd < 0) throw new KernelError(`netlink socket: errno ${c.errno()}`);
    const sa = Buffer.alloc(12);
    sa.writeUInt16LE(AF_NETLINK, 0);
    const len = Buffer.alloc(4);
    len.writeUInt32LE(12);
    if (c.bind(this.fd, sa, 12) !== 0 || c.getsockname(this.fd, sa, len) !== 0) {
      const e = c.errno();
      this.close();
      throw new KernelError(`netlink bind: errno ${e}`);
    }
    this.port = sa.readUInt32LE(4);
    // room for a burst of events between two checks (root may exceed rmem_max)
    const size = Buffer.alloc(4);
    size.writeInt32LE(32 << 20);
    c.setsockopt(this.fd, SOL_SOCKET, SO_RCVBUFFORCE, size, 4);
  }

  /** Receive every transaction's change events (or stop). */
  subscribe(on: boolean): void {
    if (on === this.subscribed) return;
    const g = Buffer.alloc(4);
    g.writeInt32LE(NFNLGRP_NFTABLES);
    if (this.c.setsockopt(this.fd, SOL_NETLINK, on ? NETLINK_ADD_MEMBERSHIP : NETLINK_DROP_MEMBERSHIP, g, 4) !== 0) throw new KernelError(`netlink membership: errno ${this.c.errno()}`);
    this.subscribed = on;
  }

  /** The ruleset's current generation (every committed transaction adds one). */
  generation(): number {
    const seq = ++this.seq;
    const msg = Buffer.alloc(20);
    msg.writeUInt32LE(20, 0);
    msg.writeUInt16LE((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETGEN, 4);
    msg.writeUInt16LE(1 /* NLM_F_REQUEST */, 6);
    msg.writeUInt32LE(seq, 8);
    if (Number(this.c.send(this.fd, msg, 20, 0)) !== 20) throw new KernelError(`netlink send: errno ${this.c.errno()}`);
    // the answer (a NEWGEN to this port) comes at once; events may be queued before it
    let id: number | undefined;
    for (let tries = 0; id === undefined && tries < 1000; tries++) {
      const r = this.drain((m) => {
        if (m.pid === this.port && m.seq === seq) {
          if (m.type === NLMSG_ERROR) throw new KernelError('GETGEN refused');
          if (m.type === NFT_MSG_NEWGEN) id = m.attrU32(1);
          return;
        }
        this.queue(m);
      });
      if (r === 'empty' && id === undefined) Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 1);
    }
    if (id === undefined) throw new KernelError('no answer to GETGEN');
    return id;
  }

  /**
   * Reads what is queued: change events and generations, in order. Returns
   * 'lost' when the kernel dropped events (the buffer was full).
   */
  read(onEvent: (e: NftEvent) => void, onGeneration: (g: NftGeneration) => void): 'ok' | 'lost' {
    this.drain((m) => (m.pid === this.port ? undefined : this.queue(m)));
    const list = this.queued;
    this.queued = [];
    for (const x of list) ('e' in x ? onEvent(x.e) : onGeneration(x.g));
    const lost = this.lost;
    this.lost = false;
    return lost ? 'lost' : 'ok';
  }

  close(): void {
    if (this.fd >= 0) this.c.close(this.fd);
    this.fd = -1;
  }

  private queue(m: Message): void {
    if (m.type === NLMSG_ERROR) return;
    if (m.type === NFT_MSG_NEWGEN) this.queued.push({ g: { id: m.attrU32(1) ?? 0, pid: m.attrU32(2) ?? 0, process: m.attrString(3) ?? '' } });
    else this.queued.push({ e: { family: m.family, table: m.attrString(1) ?? '', chain: m.type >= 3 && m.type <= 8 ? (m.attrString(m.type <= 5 ? 3 : 2) ?? '') : '' } });
  }

  /** every queued message to fn; 'empty' when nothing was queued */
  private drain(fn: (m: Message) => void): 'read' | 'empty' {
    let any = false;
    for (;;) {
      const n = Number(this.c.recv(this.fd, this.buf, this.buf.length, MSG_DONTWAIT));
      if (n < 0) {
        const e = this.c.errno();
        if (e === ENOBUFS) {
          this.lost = true;
          continue;
        }
        if (e === EAGAIN) return any ? 'read' : 'empty';
        throw new KernelError(`netlink recv: errno ${e}`);
      }
      any = true;
      for (let off = 0; off + 16 <= n; ) {
        const len = this.buf.readUInt32LE(off);
        if (len < 16 || off + len > n) break;
        const type = this.buf.readUInt16LE(off + 4);
        if (type >> 8 === NFNL_SUBSYS_NFTABLES || type === NLMSG_ERROR) fn(new Message(this.buf, off, len, type === NLMSG_ERROR ? NLMSG_ERROR : type & 0xff));
        off += (len + 3) & ~3;
      }
    }
  }
}

/** One nfnetlink message: header, nfgenmsg, attributes. */
class Message {
  readonly seq: number;
  /** the sender's port (an answer: this socket's) */
  readonly pid: number;
  readonly family: number;

  constructor(
    private readonly buf: Buffer,
    private readonly off: number,
    private readonly len: number,
    readonly type: number,
  ) {
    this.seq = buf.readUInt32LE(off + 8);
    this.pid = buf.readUInt32LE(off + 12);
    this.family = buf.readUInt8(off + 16);
  }

  private attr(want: number): [number, number] | undefined {
    const end = this.off + this.len;
    for (let a = this.off + 20; a + 4 <= end; ) {
      const alen = this.buf.readUInt16LE(a);
      if (alen < 4) return undefined;
      if ((this.buf.readUInt16LE(a + 2) & 0x7fff) === want) return [a + 4, a + alen];
      a += (alen + 3) & ~3;
    }
    return undefined;
  }

  attrU32(t: number): number | undefined {
    const r = this.attr(t);
    return r && r[1] - r[0] >= 4 ? this.buf.readUInt32BE(r[0]) : undefined;
  }

  attrString(t: number): string | undefined {
    const r = this.attr(t);
    if (!r) return undefined;
    let end = r[1];
    while (end > r[0] && this.buf[end - 1] === 0) end--;
    return this.buf.toString('latin1', r[0], end);
  }
}

// --- iptables-legacy

/** The number of rules and the size of an iptables-legacy table: they move with any change to it. */
export function xtablesInfo(family: 4 | 6, table: string, netns?: string): { entries: number; size: number } | undefined {
  const c = lib();
  const fd = inNetns(netns, () => c.socket(family === 4 ? AF_INET : AF_INET6, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_RAW));
  if (fd < 0) throw new KernelError(`raw socket: errno ${c.errno()}`);
  try {
    // struct ipt_getinfo: name[32], valid_hooks, hook_entry[5], underflow[5], num_entries, size
    const info = Buffer.alloc(84);
    info.write(table, 0, 31, 'latin1');
    const len = Buffer.alloc(4);
    len.writeUInt32LE(84);
    // IPT_SO_GET_INFO / IP6T_SO_GET_INFO (64) at SOL_IP (0) / SOL_IPV6 (41)
    if (c.getsockopt(fd, family === 4 ? 0 : 41, 64, info, len) !== 0) {
      const e = c.errno();
      if (e === 2 /* ENOENT: no such table */) return undefined;
      throw new KernelError(`getsockopt IPT_SO_GET_INFO ${table}: errno ${e}`);
    }
    return { entries: info.readUInt32LE(76), size: info.readUInt32LE(80) };
  } finally {
    c.close(fd);
  }
}
