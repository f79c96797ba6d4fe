// Elements over netlink: a transaction of element adds and deletes only (a
// cold start's chunks, a sync's changes) goes to the kernel as one
// nf_tables batch built here, instead of as text for nft to parse. nft
// spends microseconds of CPU per element parsing and evaluating it, and a
// large node has hundreds of thousands; building the same messages here
// costs a fraction of that, and a change's few skip nft's round trip
// (docs/design/netlink-batches.md).
// Only sets and maps whose declaration kpng made (learned from the
// transactions it ran) and whose key and data are plain concatenations of
// addresses, protocols, ports and numgen values qualify: no intervals, no
// timeouts. Whatever does not qualify, or fails here, goes to nft as text.
import { endianness } from 'node:os';
import { KernelError } from '../../../kernel/libc.js';
import { NETLINK_NETFILTER, NetlinkSocket, NetlinkWriter, type NetlinkMessage } from '../../../kernel/netlink.js';
import { writeIPv6 } from '../../../api/ip.js';
import type { ElementData, TableFamily, Transaction } from './transaction.js';

/** one component of a key or data: its bytes in the kernel's register layout */
type Field = 'ipv4' | 'ipv6' | 'proto' | 'port' | 'host32';

export interface SetLayout {
  readonly key: readonly Field[];
  /** a map's data; undefined for a set */
  readonly data?: readonly Field[] | 'verdict';
}

const TYPES: Record<string, Field> = { ipv4_addr: 'ipv4', ipv6_addr: 'ipv6', inet_proto: 'proto', inet_service: 'port' };

function typeofField(expr: string): Field | undefined {
  if (/^ip [sd]addr$/.test(expr)) return 'ipv4';
  if (/^ip6 [sd]addr$/.test(expr)) return 'ipv6';
  if (expr === 'meta l4proto') return 'proto';
  if (/^(th|tcp|udp|sctp) [sd]port$/.test(expr)) return 'port';
  if (/^numgen (random|inc) mod \d+$/.test(expr)) return 'host32';
  return undefined;
}

/**
 * The layout of a set or map from its declaration ("type ipv4_addr . inet_proto
 * . inet_service : verdict ;", "typeof ip daddr . meta l4proto : ip daddr .
 * tcp dport ;"); undefined for anything else (flags, timeouts, other types).
 */
export function layoutOf(body: string): SetLayout | undefined {
  const statements = body
    .split(';')
    .map((s) => s.trim())
    .filter(Boolean);
  if (statements.length !== 1) return undefined;
  const m = /^(type|typeof) (.+?)(?: : (.+))?$/.exec(statements[0]);
  if (!m) return undefined;
  const fields = (s: string): Field[] | undefined => {
    const out = s.split(' . ').map((p) => (m[1] === 'type' ? TYPES[p] : typeofField(p)));
    return out.every((f) => f !== undefined) ? (out as Field[]) : undefined;
  };
  const key = fields(m[2]);
  if (!key) return undefined;
  if (m[3] === undefined) return { key };
  if (m[3] === 'verdict') return { key, data: 'verdict' };
  const data = fields(m[3]);
  return data && { key, data };
}

class Unencodable extends Error {}

/** a batch this small is sent from the main thread: a thread pool's round trip costs more than the kernel's work on it */
const SEND_HERE_BYTES = 16 * 1024;

/** the kernel refused a batch (nothing of it was applied) */
export class NetlinkRefused extends KernelError {}

const PROTOCOLS: Record<string, number> = { icmp: 1, tcp: 6, udp: 17, icmpv6: 58, sctp: 132 };
const LITTLE_ENDIAN = endianness() === 'LE';

// verdict codes (linux/netfilter.h, nf_tables.h)
const VERDICTS: Record<string, number> = { drop: 0, accept: 1, continue: -1, return: -5 };
const NFT_JUMP = -3;
const NFT_GOTO = -4;

// netlink and nf_tables message and attribute numbers (linux/netfilter/nf_tables.h)
const NFNL_MSG_BATCH_BEGIN = 16;
const NFNL_MSG_BATCH_END = 17;
const NFNL_SUBSYS_NFTABLES = 10;
const NFT_MSG_GETTABLE = 1;
const NFT_MSG_NEWSETELEM = 12;
const NFT_MSG_DELSETELEM = 14;
const NLM_F_REQUEST = 1;
const NLM_F_ACK = 4;
const NLM_F_CREATE = 0x400;
const NFTA_TABLE_NAME = 1;
const NFTA_SET_ELEM_LIST_TABLE = 1;
const NFTA_SET_ELEM_LIST_SET = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS = 3;
const NFTA_LIST_ELEM = 1;
const NFTA_SET_ELEM_KEY = 1;
const NFTA_SET_ELEM_DATA = 2;
const NFTA_SET_ELEM_USERDATA = 6;
const NFTA_DATA_VALUE = 1;
const NFTA_DATA_VERDICT = 2;
const NFTA_VERDICT_CODE = 1;
const NFTA_VERDICT_CHAIN = 2;
/** libnftnl's userdata type of an element's comment */
const UDATA_SET_ELEM_COMMENT = 0;
const NFPROTO: Record<TableFamily, number> = { inet: 1, ip: 2, ip6: 10 };
const ENOENT = 2;
/** an attribute's length is 16 bits: a message's element list stays under it */
const MAX_LIST_BYTES = 60_000;

/** bytes of one component, alone or padded to a register in a concatenation */
const size = (f: Field) => (f === 'ipv6' ? 16 : f === 'proto' ? 1 : f === 'port' ? 2 : 4);

function valueLength(fields: readonly Field[]): number {
  if (fields.length === 1) return size(fields[0]);
  let n = 0;
  for (const f of fields) n += (size(f) + 3) & ~3;
  return n;
}

/** the decimal number in text[from, to), at most max */
function decimal(text: string, from: number, to: number, max: number): number {
  if (to <= from || to - from > 10) throw new Unencodable(`not a number: ${text.slice(from, to)}`);
  let n = 0;
  for (let i = from; i < to; i++) {
    const d = text.charCodeAt(i) - 48;
    if (d < 0 || d > 9) throw new Unencodable(`not a number: ${text.slice(from, to)}`);
    n = n * 10 + d;
  }
  if (n > max) throw new Unencodable(`out of range: ${text.slice(from, to)}`);
  return n;
}

function writeIPv4(b: Buffer, at: number, text: string, from: number, to: number): void {
  let start = from;
  for (let i = 0; i < 4; i++) {
    let end = i < 3 ? text.indexOf('.', start) : to;
    if (end < 0 || end > to) end = -1;
    if (end < 0) throw new Unencodable(`not an IPv4 address: ${text.slice(from, to)}`);
    b[at + i] = decimal(text, start, end, 255);
    start = end + 1;
  }
}

/** one component, text[from, to), into its bytes */
function writeField(b: Buffer, at: number, f: Field, text: string, from: number, to: number): void {
  switch (f) {
    case 'ipv4':
      return writeIPv4(b, at, text, from, to);
    case 'ipv6':
      if (!writeIPv6(b, at, text.slice(from, to))) throw new Unencodable(`not an IPv6 address: ${text.slice(from, to)}`);
      return;
    case 'proto': {
      const c = text.charCodeAt(from);
      b[at] = c >= 48 && c <= 57 ? decimal(text, from, to, 255) : (PROTOCOLS[text.slice(from, to)] ?? decimal(text, from, to, 255));
      return;
    }
    case 'port':
      b.writeUInt16BE(decimal(text, from, to, 65535), at);
      return;
    case 'host32': {
      const n = decimal(text, from, to, 0xffffffff);
      if (LITTLE_ENDIAN) b.writeUInt32LE(n, at);
      else b.writeUInt32BE(n, at);
    }
  }
}

/** a value (key or data: components joined by " . ") as NFTA_DATA_VALUE in a nest of type `type` */
function writeValue(w: NetlinkWriter, type: number, fields: readonly Field[], text: string): void {
  const nest = w.open(type);
  let at = w.space(NFTA_DATA_VALUE, valueLength(fields));
  let from = 0;
  for (let i = 0; i < fields.length; i++) {
    const last = i === fields.length - 1;
    const to = last ? text.length : text.indexOf(' . ', from);
    if (to < 0 || (last && text.includes(' . ', from))) throw new Unencodable(`"${text}" does not have ${fields.length} parts`);
    writeField(w.buf, at, fields[i], text, from, to);
    from = to + 3;
    if (fields.length > 1) at += (size(fields[i]) + 3) & ~3;
  }
  w.close(nest);
}

function writeVerdict(w: NetlinkWriter, text: string): void {
  const sp = text.indexOf(' ');
  const word = sp < 0 ? text : text.slice(0, sp);
  const data = w.open(NFTA_SET_ELEM_DATA);
  const verdict = w.open(NFTA_DATA_VERDICT);
  if (word === 'goto' || word === 'jump') {
    const chain = text.slice(sp + 1);
    if (!/^[A-Za-z0-9_.-]+$/.test(chain)) throw new Unencodable(`not a chain: ${chain}`);
    const at = w.space(NFTA_VERDICT_CODE, 4);
    w.buf.writeInt32BE(word === 'goto' ? NFT_GOTO : NFT_JUMP, at);
    w.string(NFTA_VERDICT_CHAIN, chain);
  } else {
    const code = VERDICTS[text];
    if (code === undefined) throw new Unencodable(`not a verdict: ${text}`);
    const at = w.space(NFTA_VERDICT_CODE, 4);
    w.buf.writeInt32BE(code, at);
  }
  w.close(verdict);
  w.close(data);
}

function writeElement(w: NetlinkWriter, layout: SetLayout, e: ElementData, withData: boolean): void {
  const item = w.open(NFTA_LIST_ELEM);
  writeValue(w, NFTA_SET_ELEM_KEY, layout.key, e.key);
  if (withData && layout.data) {
    if (layout.data === 'verdict') writeVerdict(w, e.value);
    else writeValue(w, NFTA_SET_ELEM_DATA, layout.data, e.value);
  } else if (withData && e.value) throw new Unencodable(`a set element with data: ${e.key} : ${e.value}`);
  if (withData && e.comment) {
    // nft's userdata TLV: type, length (with the NUL), the string
    const n = Buffer.byteLength(e.comment, 'utf8') + 1;
    if (n > 253) throw new Unencodable('comment too long');
    const at = w.space(NFTA_SET_ELEM_USERDATA, 2 + n);
    w.buf[at] = UDATA_SET_ELEM_COMMENT;
    w.buf[at + 1] = n;
    w.buf.write(e.comment, at + 2, 'utf8');
  }
  w.close(item);
}

/**
 * Sends element-only transactions to nftables over netlink, in this
 * process's network namespace or `netns`. It knows the sets it learned the
 * declarations of (learn); run() throws when a transaction is not for it,
 * or the kernel refused it (atomic: nothing was applied), so the caller can
 * give it to nft instead.
 */
export class NetlinkElements {
  private readonly layouts = new Map<string, SetLayout | undefined>();
  private nl?: NetlinkSocket;
  private seq = Math.floor(Math.random() * 0x7fffffff);
  private busy: Promise<void> = Promise.resolve();

  constructor(private readonly netns?: string) {}

  /** learns the sets a transaction (applied) declared or deleted */
  learn(tx: Transaction): void {
    for (const op of tx.ops) {
      if ('elements' in op) continue;
      const o = op.object;
      if (o.kind === 'table' && op.verb === 'delete') {
        for (const k of [...this.layouts.keys()]) if (k.startsWith(`${o.family} ${o.name} `)) this.layouts.delete(k);
      } else if (o.kind === 'set' || o.kind === 'map') {
        const id = `${o.table.family} ${o.table.name} ${o.name}`;
        if (op.verb === 'add') this.layouts.set(id, layoutOf(o.body));
        else if (op.verb === 'delete') this.layouts.delete(id);
      }
    }
  }

  /** whether every operation is an element add or delete into a set it knows */
  takes(tx: Transaction): boolean {
    if (tx.empty) return false;
    for (const op of tx.ops) if (!('elements' in op) || !this.layouts.get(`${op.table.family} ${op.table.name} ${op.set}`)) return false;
    return true;
  }

  /** Applies a transaction takes() accepted, as one atomic batch; resolves with its size. */
  async run(tx: Transaction): Promise<number> {
    let batch: Buffer;
    let expect: Set<number>;
    try {
      ({ batch, expect } = this.encode(tx));
    } catch (e) {
      if (e instanceof Unencodable) throw new NetlinkRefused(`not for netlink: ${e.message}`);
      throw e;
    }
    await this.exclusive(async (nl) => {
      // a change's batch is sent from here (the kernel's work on it is short); a big one from libuv's thread pool
      if (batch.length <= SEND_HERE_BYTES) nl.send(batch);
      else await nl.sendLarge(batch);
      // the kernel handled the batch within the send: its answers are queued
      let refused: string | undefined;
      nl.drain((m: NetlinkMessage) => {
        if (m.pid !== nl.port || !m.isError || !expect.has(m.seq)) return;
        expect.delete(m.seq);
        if (m.errno) refused ??= `errno ${m.errno}`;
      });
      if (refused) throw new NetlinkRefused(`the kernel refused the batch: ${refused}`);
      if (expect.size) throw new NetlinkRefused(`the kernel did not answer ${expect.size} message(s) of the batch`);
    });
    return batch.length;
  }

  /**
   * fn with the socket to itself: one request at a time on it (the kernel
   * takes one batch at a time anyway), each reading its own answers, none
   * of an earlier one that failed half way
   */
  private async exclusive<T>(fn: (nl: NetlinkSocket) => Promise<T> | T): Promise<T> {
    const previous = this.busy;
    let done!: () => void;
    this.busy = new Promise<void>((r) => (done = r));
    await previous;
    try {
      this.nl ??= new NetlinkSocket(NETLINK_NETFILTER, this.netns);
      this.nl.drain(() => {});
      return await fn(this.nl);
    } finally {
      done();
    }
  }

  /**
   * Whether the kernel has this table: a question without a process (`nft
   * list` of a missing table is a fork of this process, which costs more
   * as the process grows, twice in a cold start). Throws a KernelError when
   * netlink does not tell.
   */
  hasTable(family: TableFamily, name: string): Promise<boolean> {
    return this.exclusive((nl) => {
      const seq = (this.seq = (this.seq + 1) & 0x7fffffff);
      const w = new NetlinkWriter().begin((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETTABLE, NLM_F_REQUEST | NLM_F_ACK, seq, [NFPROTO[family], 0, 0]);
      w.string(NFTA_TABLE_NAME, name);
      nl.send(w.end().take());
      // the table (if any), then the ACK or the error: both within the send
      let errno: number | undefined;
      nl.await(
        () => errno !== undefined,
        (m) => {
          if (m.pid === nl.port && m.seq === seq && m.isError) errno = m.errno;
        },
        1000,
      );
      if (errno === 0) return true;
      if (errno === ENOENT) return false;
      throw new KernelError(`GETTABLE: errno ${errno}`);
    });
  }

  close(): void {
    this.nl?.close();
    this.nl = undefined;
  }

  private encode(tx: Transaction): { batch: Buffer; expect: Set<number> } {
    const w = new NetlinkWriter();
    const expect = new Set<number>();
    const next = () => (this.seq = (this.seq + 1) & 0x7fffffff);
    w.begin(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, next(), [0, 0, NFNL_SUBSYS_NFTABLES]).end();
    for (const op of tx.ops) {
      if (!('elements' in op)) throw new Unencodable(`not elements: ${op.verb} ${op.object.kind}`);
      const layout = this.layouts.get(`${op.table.family} ${op.table.name} ${op.set}`);
      if (!layout) throw new Unencodable(`a set it does not know: ${op.set}`);
      const add = op.verb === 'add';
      const type = (NFNL_SUBSYS_NFTABLES << 8) | (add ? NFT_MSG_NEWSETELEM : NFT_MSG_DELSETELEM);
      let i = 0;
      while (i < op.elements.length) {
        const seq = next();
        expect.add(seq);
        w.begin(type, NLM_F_REQUEST | NLM_F_ACK | (add ? NLM_F_CREATE : 0), seq, [NFPROTO[op.table.family], 0, 0]);
        w.string(NFTA_SET_ELEM_LIST_TABLE, op.table.name);
        w.string(NFTA_SET_ELEM_LIST_SET, op.set);
        const list = w.open(NFTA_SET_ELEM_LIST_ELEMENTS);
        for (; i < op.elements.length && w.at - list < MAX_LIST_BYTES; i++) writeElement(w, layout, op.elements[i], add);
        w.close(list);
        w.end();
      }
    }
    w.begin(NFNL_MSG_BATCH_END, NLM_F_REQUEST, next(), [0, 0, NFNL_SUBSYS_NFTABLES]).end();
    return { batch: w.take(), expect };
  }
}

