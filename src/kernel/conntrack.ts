// Conntrack over netlink (ctnetlink): one dump of a family's entries of one
// protocol, filtered in the kernel where it can (CTA_FILTER, Linux 5.9+), and
// entries deleted (or created: tests) as one batch, many messages in one
// send, which the kernel handles within that send. A round of cleanup costs a
// dump and a send per batch, not a process per flow; the `conntrack` tool is
// not needed.
//
// Nothing here holds the event loop for long: a dump is read one buffer at a
// time, the event loop turning (or the caller giving way) between two, and a
// batch is sent from libuv's thread pool.
import { KernelError } from './libc.js';
import { NETLINK_NETFILTER, NLM_F_DUMP, NLM_F_REQUEST, NetlinkSocket, NetlinkWriter, type NetlinkMessage } from './netlink.js';

const NFNL_SUBSYS_CTNETLINK = 1;
const IPCTNL_MSG_CT_NEW = 0;
const IPCTNL_MSG_CT_GET = 1;
const IPCTNL_MSG_CT_DELETE = 2;
const NLM_F_CREATE = 0x400;
const NLM_F_EXCL = 0x200;

const CTA_TUPLE_ORIG = 1;
const CTA_TUPLE_REPLY = 2;
const CTA_TIMEOUT = 7;
const CTA_ID = 12;
const CTA_ZONE = 18;
const CTA_FILTER = 25;
const CTA_TUPLE_IP = 1;
const CTA_TUPLE_PROTO = 2;
const CTA_IP_V4_SRC = 1;
const CTA_IP_V4_DST = 2;
const CTA_IP_V6_SRC = 3;
const CTA_IP_V6_DST = 4;
const CTA_PROTO_NUM = 1;
const CTA_PROTO_SRC_PORT = 2;
const CTA_PROTO_DST_PORT = 3;
const CTA_FILTER_ORIG_FLAGS = 1;
const CTA_FILTER_REPLY_FLAGS = 2;
/** the kernel's CTA_FILTER_FLAG(CTA_PROTO_NUM) (net/netfilter/nf_internals.h) */
const FILTER_PROTO_NUM = 1 << 3;

const AF_INET = 2;
const AF_INET6 = 10;
const ENOENT = 2;
const EINVAL = 22;
const EOPNOTSUPP = 95;
export const IPPROTO_TCP = 6;
export const IPPROTO_UDP = 17;

/** receive calls per turn of the event loop while reading a dump (one: up to 32 KiB, a hundred or two entries) */
const READS_PER_TURN = 1;
/** messages per send: the errors of a whole batch (entries gone meanwhile) fit the receive buffer */
const BATCH = 1000;
const DUMP_TIMEOUT_MS = 30_000;

export type ConntrackFamily = 4 | 6;

/** One direction of an entry. Addresses are the hex of their bytes (8 digits for IPv4, 32 for IPv6): compared as they are, never parsed. */
export interface ConntrackTuple {
  readonly src: string;
  readonly dst: string;
  readonly sport: number;
  readonly dport: number;
}

export interface ConntrackEntry {
  readonly family: ConntrackFamily;
  /** IPPROTO_UDP, ... */
  readonly proto: number;
  readonly orig: ConntrackTuple;
  readonly reply: ConntrackTuple;
  /** the conntrack zone (0: the default one) */
  readonly zone: number;
  /** the kernel's id of the entry: a delete that names it spares an entry made since with the same tuple */
  readonly id?: number;
}

/** What a batch did: entries handled, entries already gone (ENOENT), and the other refusals. */
export interface ConntrackBatchResult {
  done: number;
  gone: number;
  failed: number;
  /** the first refusal's errno */
  errno?: number;
}

/** The connection tracking table (the kernel's, or a stand-in in tests). */
export interface ConntrackTable {
  /**
   * the entries of a family and protocol that select takes (one dump);
   * between: awaited between two reads of the dump (default: a turn of the
   * event loop), where a caller gives way to more urgent work
   */
  list(family: ConntrackFamily, proto: number, select: (e: ConntrackEntry) => boolean, between?: () => Promise<void>): Promise<ConntrackEntry[]>;
  /** deletes these entries (by original tuple, zone and id), in batches */
  delete(entries: readonly ConntrackEntry[]): Promise<ConntrackBatchResult>;
  close(): void;
}

/** The kernel's conntrack table over netlink, in this process's network namespace or another's (a name under /run/netns, or a path). */
export class ConntrackNetlink implements ConntrackTable {
  private nl?: NetlinkSocket;
  private seq = 0;
  /** the kernel refused CTA_FILTER once: dumps go unfiltered (matched here anyway) */
  private filterRefused = false;
  /** one operation at a time on the socket */
  private queue: Promise<unknown> = Promise.resolve();

  constructor(private readonly netns?: string) {}

  list(family: ConntrackFamily, proto: number, select: (e: ConntrackEntry) => boolean, between = nextTurn): Promise<ConntrackEntry[]> {
    return this.exclusive(async () => {
      try {
        return await this.dump(family, proto, select, between, !this.filterRefused);
      } catch (e) {
        if (this.filterRefused || !(e instanceof DumpRefused) || (e.errno !== EINVAL && e.errno !== EOPNOTSUPP)) throw e;
        this.filterRefused = true;
        return this.dump(family, proto, select, between, false);
      }
    });
  }

  delete(entries: readonly ConntrackEntry[]): Promise<ConntrackBatchResult> {
    // (every message carries CTA_TUPLE_ORIG: a delete without a tuple flushes the whole table)
    return this.exclusive(() => this.batches(entries, (w, e, seq) => writeEntry(w.begin((NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_DELETE, NLM_F_REQUEST, seq, [afOf(e.family), 0, 0]), e, false).end()));
  }

  /** Creates entries that expire after timeoutSeconds (tests and benchmarks: the state a node's traffic leaves). */
  create(entries: readonly ConntrackEntry[], timeoutSeconds: number): Promise<ConntrackBatchResult> {
    return this.exclusive(() =>
      this.batches(entries, (w, e, seq) => {
        writeEntry(w.begin((NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW, NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL, seq, [afOf(e.family), 0, 0]), e, true);
        w.be32(CTA_TIMEOUT, timeoutSeconds).end();
      }),
    );
  }

  close(): void {
    this.nl?.close();
    this.nl = undefined;
  }

  private exclusive<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.queue.then(fn, fn);
    this.queue = run.catch(() => undefined);
    return run;
  }

  private socket(): NetlinkSocket {
    this.nl ??= new NetlinkSocket(NETLINK_NETFILTER, this.netns);
    return this.nl;
  }

  private async dump(family: ConntrackFamily, proto: number, select: (e: ConntrackEntry) => boolean, between: () => Promise<void>, filtered: boolean): Promise<ConntrackEntry[]> {
    const nl = this.socket();
    const seq = ++this.seq;
    const w = new NetlinkWriter().begin((NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_GET, NLM_F_REQUEST | NLM_F_DUMP, seq, [afOf(family), 0, 0]);
    if (filtered) {
      w.nest(CTA_TUPLE_ORIG, (t) => t.nest(CTA_TUPLE_PROTO, (p) => p.attr(CTA_PROTO_NUM, Uint8Array.of(proto))));
      w.nest(CTA_FILTER, (f) => f.u32(CTA_FILTER_ORIG_FLAGS, FILTER_PROTO_NUM).u32(CTA_FILTER_REPLY_FLAGS, 0));
    }
    nl.send(w.end().take());
    const out: ConntrackEntry[] = [];
    let done = false;
    let errno = 0;
    const onMessage = (m: NetlinkMessage) => {
      if (m.seq !== seq || done) return;
      if (m.isError) {
        errno = m.errno;
        done = true;
      } else if (m.isDone) done = true;
      else if (m.type === ((NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW)) {
        const e = parseEntry(m);
        // (an unfiltered dump, or a kernel that dumps every family, brings the others too)
        if (e && e.family === family && e.proto === proto && select(e)) out.push(e);
      }
    };
    // (only the kernel's silence counts against the timeout, not the time given way)
    let heard = Date.now();
    try {
      while (!done) {
        const r = nl.drain(onMessage, READS_PER_TURN);
        if (done) break;
        if (r === 'read') {
          heard = Date.now();
          await between();
        } else if (Date.now() - heard > DUMP_TIMEOUT_MS) throw new KernelError(`conntrack dump: nothing from the kernel for ${DUMP_TIMEOUT_MS} ms`);
        else await new Promise((resolve) => setTimeout(resolve, 1));
      }
    } catch (e) {
      // a dump left running on the socket would refuse the next one (EBUSY)
      this.close();
      throw e;
    }
    if (errno) throw new DumpRefused(errno);
    return out;
  }

  /** sends the messages write makes, BATCH per send; counts the refusals (no ACK asked: only errors come back) */
  private async batches(entries: readonly ConntrackEntry[], write: (w: NetlinkWriter, e: ConntrackEntry, seq: number) => void): Promise<ConntrackBatchResult> {
    const result: ConntrackBatchResult = { done: 0, gone: 0, failed: 0 };
    const nl = this.socket();
    for (let i = 0; i < entries.length; i += BATCH) {
      const chunk = entries.slice(i, i + BATCH);
      const first = this.seq + 1;
      const w = new NetlinkWriter();
      for (const e of chunk) write(w, e, ++this.seq);
      nl.lost = false;
      // the kernel handles every message within the send: their errors are queued when it returns
      await nl.sendLarge(w.take());
      let refused = 0;
      nl.drain((m) => {
        if (!m.isError || m.errno === 0 || m.seq < first || m.seq > this.seq) return;
        refused++;
        if (m.errno === ENOENT) result.gone++;
        else {
          result.failed++;
          result.errno ??= m.errno;
        }
      });
      if (nl.lost) throw new KernelError('conntrack: the kernel dropped answers to a batch (receive buffer full)');
      result.done += chunk.length - refused;
    }
    return result;
  }
}

/** The kernel refused a dump (errno). */
export class DumpRefused extends KernelError {
  constructor(readonly errno: number) {
    super(`conntrack dump refused: errno ${errno}`);
  }
}

const afOf = (family: ConntrackFamily) => (family === 4 ? AF_INET : AF_INET6);
const nextTurn = () => new Promise<void>((resolve) => setImmediate(resolve));

/** an entry's attributes: to delete it, its original tuple, zone and id; to create it, both tuples and its zone */
function writeEntry(w: NetlinkWriter, e: ConntrackEntry, create: boolean): NetlinkWriter {
  writeTuple(w, CTA_TUPLE_ORIG, e.family, e.proto, e.orig);
  if (create) writeTuple(w, CTA_TUPLE_REPLY, e.family, e.proto, e.reply);
  if (e.zone) w.be16(CTA_ZONE, e.zone);
  if (!create && e.id !== undefined) w.be32(CTA_ID, e.id);
  return w;
}

function writeTuple(w: NetlinkWriter, type: number, family: ConntrackFamily, proto: number, t: ConntrackTuple): void {
  const bytes = family === 4 ? 4 : 16;
  const src = Buffer.from(t.src, 'hex');
  const dst = Buffer.from(t.dst, 'hex');
  if (src.length !== bytes || dst.length !== bytes) throw new KernelError(`conntrack: not an IPv${family} tuple: ${t.src} -> ${t.dst}`);
  const tuple = w.open(type);
  const ip = w.open(CTA_TUPLE_IP);
  w.attr(family === 4 ? CTA_IP_V4_SRC : CTA_IP_V6_SRC, src).attr(family === 4 ? CTA_IP_V4_DST : CTA_IP_V6_DST, dst);
  w.close(ip);
  const p = w.open(CTA_TUPLE_PROTO);
  w.attr(CTA_PROTO_NUM, Uint8Array.of(proto)).be16(CTA_PROTO_SRC_PORT, t.sport).be16(CTA_PROTO_DST_PORT, t.dport);
  w.close(p);
  w.close(tuple);
}

function parseEntry(m: NetlinkMessage): ConntrackEntry | undefined {
  const family = m.head0 === AF_INET ? 4 : m.head0 === AF_INET6 ? 6 : undefined;
  if (!family) return undefined;
  const a = m.attrs();
  const orig = parseTuple(m, a.get(CTA_TUPLE_ORIG));
  const reply = parseTuple(m, a.get(CTA_TUPLE_REPLY));
  if (!orig || !reply) return undefined;
  return { family, proto: orig.proto, orig: orig.tuple, reply: reply.tuple, zone: m.be16(a.get(CTA_ZONE)) ?? 0, id: m.be32(a.get(CTA_ID)) };
}

function parseTuple(m: NetlinkMessage, r: [number, number] | undefined): { proto: number; tuple: ConntrackTuple } | undefined {
  if (!r) return undefined;
  const t = m.nested(r);
  const ip = m.nested(t.get(CTA_TUPLE_IP));
  const p = m.nested(t.get(CTA_TUPLE_PROTO));
  const src = m.bytes(ip.get(CTA_IP_V4_SRC) ?? ip.get(CTA_IP_V6_SRC));
  const dst = m.bytes(ip.get(CTA_IP_V4_DST) ?? ip.get(CTA_IP_V6_DST));
  const proto = m.u8(p.get(CTA_PROTO_NUM));
  if (!src || !dst || proto === undefined) return undefined;
  return { proto, tuple: { src: src.toString('hex'), dst: dst.toString('hex'), sport: m.be16(p.get(CTA_PROTO_SRC_PORT)) ?? 0, dport: m.be16(p.get(CTA_PROTO_DST_PORT)) ?? 0 } };
}
