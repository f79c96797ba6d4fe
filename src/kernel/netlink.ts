// Raw netlink: a socket of one protocol, the messages it receives (header,
// family header, attributes) and a writer that builds messages into one
// buffer. Used for nftables (generations, change events, element batches),
// IPVS (generic netlink) and conntrack.
import { KernelError, libc, type Libc } from './libc.js';
import { inNetns } from './netns.js';

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
    this.c = libc();
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

  /**
   * every queued message to fn; 'empty' when nothing was queued. maxReads
   * bounds the receive calls: a dump goes on inside each one, so a reader
   * that must give the event loop a turn reads a few buffers at a time.
   */
  drain(fn: (m: NetlinkMessage) => void, maxReads = Infinity): 'read' | 'empty' {
    let any = false;
    for (let reads = 0; reads < maxReads; reads++) {
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
    return any ? 'read' : 'empty';
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
 * a cold start's element batches (nftables/netlink.ts) hold thousands of
 * elements each.
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
    // costs more than writing them, once per attribute of a cold load)
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
