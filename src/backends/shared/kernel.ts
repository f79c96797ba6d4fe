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
  /** send on libuv's thread pool: the kernel's work on a big batch does not block this thread */
  sendAsync(fd: number, buf: Buffer, len: number, flags: number): Promise<number>;
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

/** koffi's asynchronous call of a function (on libuv's thread pool) as a promise */
function asyncCall(f: { async: (...args: unknown[]) => void }) {
  return (...args: unknown[]) =>
    new Promise<number>((resolve, reject) => f.async(...args, (err: unknown, r: number | bigint) => (err ? reject(err as Error) : resolve(Number(r)))));
}

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
      sendAsync: asyncCall(c.func('long send(int, void *, size_t, int)')),
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
export const NETLINK_NETFILTER = 12;
const SOL_SOCKET = 1;
const SO_SNDBUFFORCE = 32;
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

// --- netlink

const NLMSG_ERROR = 2;
const NLMSG_DONE = 3;
export const NLM_F_REQUEST = 1;
export const NLM_F_ACK = 4;
export const NLM_F_DUMP = 0x300;

/** One netlink message in a receive buffer: its header, and attributes after a 4-byte family header (nfgenmsg, genlmsghdr). */
export class NetlinkMessage {
  readonly type: number;
  readonly flags: number;
  readonly seq: number;
  /** the sender's port (an answer: this socket's) */
  readonly pid: number;

  constructor(
    private readonly buf: Buffer,
    private readonly off: number,
    readonly len: number,
  ) {
    this.type = buf.readUInt16LE(off + 4);
    this.flags = buf.readUInt16LE(off + 6);
    this.seq = buf.readUInt32LE(off + 8);
    this.pid = buf.readUInt32LE(off + 12);
  }

  /** the byte after the netlink header: nfgenmsg's family, genlmsghdr's command */
  get head0(): number {
    return this.buf.readUInt8(this.off + 16);
  }

  /** NLMSG_ERROR's error (0: an ACK), as a positive errno */
  get errno(): number {
    return -this.buf.readInt32LE(this.off + 16);
  }

  get isError(): boolean {
    return this.type === NLMSG_ERROR;
  }

  get isDone(): boolean {
    return this.type === NLMSG_DONE;
  }

  /** attribute type -> [start, end) of its payload, top level (after the 4-byte family header) */
  attrs(): Map<number, [number, number]> {
    return parseAttrs(this.buf, this.off + 20, this.off + this.len);
  }

  u8(r: [number, number] | undefined): number | undefined {
    return r && r[1] - r[0] >= 1 ? this.buf.readUInt8(r[0]) : undefined;
  }
  u16(r: [number, number] | undefined): number | undefined {
    return r && r[1] - r[0] >= 2 ? this.buf.readUInt16LE(r[0]) : undefined;
  }
  /** a u16 in network order (ports) */
  be16(r: [number, number] | undefined): number | undefined {
    return r && r[1] - r[0] >= 2 ? this.buf.readUInt16BE(r[0]) : undefined;
  }
  u32(r: [number, number] | undefined): number | undefined {
    return r && r[1] - r[0] >= 4 ? this.buf.readUInt32LE(r[0]) : undefined;
  }
  be32(r: [number, number] | undefined): number | undefined {
    return r && r[1] - r[0] >= 4 ? this.buf.readUInt32BE(r[0]) : undefined;
  }
  /** nftables' u32 attributes are in network order */
  u32BE(r: [number, number] | undefined): number | undefined {
    return this.be32(r);
  }
  string(r: [number, number] | undefined): string | undefined {
    if (!r) return undefined;
    let end = r[1];
    while (end > r[0] && this.buf[end - 1] === 0) end--;
    return this.buf.toString('latin1', r[0], end);
  }
  bytes(r: [number, number] | undefined): Buffer | undefined {
    return r && Buffer.from(this.buf.subarray(r[0], r[1]));
  }
  /** the attributes nested in one */
  nested(r: [number, number] | undefined): Map<number, [number, number]> {
    return r ? parseAttrs(this.buf, r[0], r[1]) : new Map();
  }
}

function parseAttrs(buf: Buffer, from: number, to: number): Map<number, [number, number]> {
  const out = new Map<number, [number, number]>();
  for (let a = from; a + 4 <= to; ) {
    const alen = buf.readUInt16LE(a);
    if (alen < 4 || a + alen > to) break;
    out.set(buf.readUInt16LE(a + 2) & 0x3fff, [a + 4, a + alen]);
    a += (alen + 3) & ~3;
  }
  return out;
}

/** A raw netlink socket of one protocol, in this process's network namespace or another's. */
export class NetlinkSocket {
  private readonly c: Libc;
  private fd: number;
  /** this socket's port id: answers to its requests carry it */
  readonly port: number;
  private readonly buf = Buffer.alloc(1 << 20);
  /** the kernel dropped messages (the buffer was full) since this was last cleared */
  lost = false;

  constructor(protocol: number, netns?: string, receiveBuffer = 4 << 20) {
    this.c = lib();
    const c = this.c;
    this.fd = inNetns(netns, () => c.socket(AF_NETLINK, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, protocol));
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
    // room for a burst (root may exceed rmem_max)
    const size = Buffer.alloc(4);
    size.writeInt32LE(receiveBuffer);
    c.setsockopt(this.fd, SOL_SOCKET, SO_RCVBUFFORCE, size, 4);
  }

  /** Receive a multicast group's messages (or stop). */
  membership(group: number, on: boolean): void {
    const g = Buffer.alloc(4);
    g.writeInt32LE(group);
    if (this.c.setsockopt(this.fd, SOL_NETLINK, on ? NETLINK_ADD_MEMBERSHIP : NETLINK_DROP_MEMBERSHIP, g, 4) !== 0) throw new KernelError(`netlink membership: errno ${this.c.errno()}`);
  }

  send(msg: Buffer): void {
    if (Number(this.c.send(this.fd, msg, msg.length, 0)) !== msg.length) throw new KernelError(`netlink send: errno ${this.c.errno()}`);
  }

  /**
   * Sends a big message (a batch) from libuv's thread pool: the kernel
   * handles a netlink batch within the send, and this thread goes on
   * meanwhile. Answers are queued on the socket when it resolves.
   */
  async sendLarge(msg: Buffer): Promise<void> {
    if (msg.length + 4096 > this.sendBuffer) {
      // the kernel refuses a message bigger than the socket's send buffer (root may exceed wmem_max)
      const size = Buffer.alloc(4);
      size.writeInt32LE(msg.length + 65536);
      if (this.c.setsockopt(this.fd, SOL_SOCKET, SO_SNDBUFFORCE, size, 4) !== 0) throw new KernelError(`netlink send buffer: errno ${this.c.errno()}`);
      this.sendBuffer = msg.length + 65536;
    }
    const n = await this.c.sendAsync(this.fd, msg, msg.length, 0);
    if (n !== msg.length) throw new KernelError(`netlink send of ${msg.length} bytes: ${n}`);
  }
  private sendBuffer = 0;

  /** every queued message to fn; 'empty' when nothing was queued */
  drain(fn: (m: NetlinkMessage) => void): 'read' | 'empty' {
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
        fn(new NetlinkMessage(this.buf, off, len));
        off += (len + 3) & ~3;
      }
    }
  }

  /** waits (at most ms, blocking this thread) until answered() or nothing more comes; what is not an answer goes to other */
  await(answered: () => boolean, onMessage: (m: NetlinkMessage) => void, ms = 10_000): void {
    const end = Date.now() + ms;
    while (!answered()) {
      if (this.drain(onMessage) === 'empty' && !answered()) {
        if (Date.now() > end) throw new KernelError('no answer from the kernel');
        Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 1);
      }
    }
  }

  close(): void {
    if (this.fd >= 0) this.c.close(this.fd);
    this.fd = -1;
  }
}

/**
 * Builds netlink messages into one growing buffer: a header, a 4-byte family
 * header, attributes (nested ones too). Nothing is allocated per attribute:
 * a cold start's element batches (nftables/netlink.ts) are 10k elements.
 */
export class NetlinkWriter {
  /** the bytes so far (space() gives offsets into it) */
  buf = Buffer.alloc(4096);
  /** bytes written */
  at = 0;
  private readonly starts: number[] = [];

  /** starts a message; end() finishes it */
  begin(type: number, flags: number, seq: number, head: [number, number, number]): this {
    this.room(20);
    const b = this.buf;
    const start = this.at;
    b.writeUInt32LE(0, start);
    b.writeUInt16LE(type, start + 4);
    b.writeUInt16LE(flags, start + 6);
    b.writeUInt32LE(seq >>> 0, start + 8);
    b.writeUInt32LE(0, start + 12);
    b.writeUInt8(head[0], start + 16);
    b.writeUInt8(head[1], start + 17);
    b.writeUInt16BE(head[2], start + 18);
    this.at += 20;
    this.starts.push(start);
    return this;
  }

  end(): this {
    const start = this.starts.pop()!;
    this.buf.writeUInt32LE(this.at - start, start);
    return this;
  }

  /**
   * an attribute of n bytes, zeroed and padded; returns where its value
   * starts (in `buf` as it is after the call: it may have grown)
   */
  space(type: number, n: number): number {
    const padded = (n + 3) & ~3;
    this.room(4 + padded);
    const b = this.buf;
    b.writeUInt16LE(4 + n, this.at);
    b.writeUInt16LE(type, this.at + 2);
    // (a loop: an attribute's value is a few bytes, and each Buffer.fill call
    // costs more than writing them; 40 ms of a 30k-Service cold load)
    for (let i = this.at + 4, end = i + padded; i < end; i++) b[i] = 0;
    this.at += 4 + padded;
    return this.at - padded;
  }

  attr(type: number, value: Uint8Array): this {
    const at = this.space(type, value.length);
    this.buf.set(value, at);
    return this;
  }
  u16(type: number, v: number): this {
    const at = this.space(type, 2);
    this.buf.writeUInt16LE(v, at);
    return this;
  }
  be16(type: number, v: number): this {
    const at = this.space(type, 2);
    this.buf.writeUInt16BE(v, at);
    return this;
  }
  u32(type: number, v: number): this {
    const at = this.space(type, 4);
    this.buf.writeUInt32LE(v >>> 0, at);
    return this;
  }
  be32(type: number, v: number): this {
    const at = this.space(type, 4);
    this.buf.writeUInt32BE(v >>> 0, at);
    return this;
  }
  string(type: number, v: string): this {
    const at = this.space(type, Buffer.byteLength(v, 'latin1') + 1);
    this.buf.write(v, at, 'latin1');
    return this;
  }

  /** a nested attribute's header; close(start) ends it */
  open(type: number): number {
    this.room(4);
    const start = this.at;
    this.buf.writeUInt16LE(type | 0x8000 /* NLA_F_NESTED */, start + 2);
    this.at += 4;
    return start;
  }
  close(start: number): this {
    this.buf.writeUInt16LE(this.at - start, start);
    return this;
  }

  /** a nested attribute: fill() adds its attributes */
  nest(type: number, fill: (w: NetlinkWriter) => void): this {
    const start = this.open(type);
    fill(this);
    return this.close(start);
  }

  /** the messages written; the writer starts again on a buffer of its own */
  take(): Buffer {
    const out = this.buf.subarray(0, this.at);
    this.buf = Buffer.alloc(4096);
    this.at = 0;
    this.starts.length = 0;
    return out;
  }

  private room(n: number): void {
    if (this.at + n <= this.buf.length) return;
    const next = Buffer.allocUnsafe(Math.max(this.buf.length * 2, this.at + n));
    this.buf.copy(next, 0, 0, this.at);
    this.buf = next;
  }
}

// --- nftables over netlink

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
