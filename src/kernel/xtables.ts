// iptables-legacy's tables as the kernel describes them (getsockopt on a
// raw socket): no tool to run for the periodic drift check.
import { createHash } from 'node:crypto';
import { KernelError, libc, type Libc } from './libc.js';
import { inNetns } from './netns.js';

const AF_INET = 2;
const AF_INET6 = 10;
const SOCK_RAW = 3;
const SOCK_CLOEXEC = 0o2000000;
const IPPROTO_RAW = 255;
const SOL_IP = 0;
const SOL_IPV6 = 41;
// IPT_SO_GET_INFO / IP6T_SO_GET_INFO, IPT_SO_GET_ENTRIES / IP6T_SO_GET_ENTRIES
const SO_GET_INFO = 64;
const SO_GET_ENTRIES = 65;
const ENOENT = 2;
const EAGAIN = 11;
/** struct ipt_getinfo (ip6t_getinfo): name[32], valid_hooks, hook_entry[5], underflow[5], num_entries, size */
const GETINFO_SIZE = 84;
/** struct ipt_get_entries (ip6t_get_entries): name[32], size, then the entries at 8-byte alignment */
const GET_ENTRIES_HEAD = 40;
/**
 * where, in struct ipt_entry (ip6t_entry), next_offset (u16) and the
 * counters (two u64) are: after struct ipt_ip (84 bytes) or ip6t_ip6 (136),
 * nfcache, target_offset
 */
const ENTRY = { 4: { next: 90, counters: 96 }, 6: { next: 142, counters: 152 } } as const;
/** tries when the table changes between its size and its contents being read */
const TRIES = 3;

/** The number of rules and the size of an iptables-legacy table */
interface XtablesInfo {
  readonly entries: number;
  readonly size: number;
}

/** An iptables-legacy table's size and a digest of its rules (counters left out): the digest moves with any change to them. */
export interface XtablesDigest extends XtablesInfo {
  readonly digest: string;
}

/** GET_INFO; undefined when there is no such table */
function getInfo(c: Libc, fd: number, family: 4 | 6, table: string): XtablesInfo | undefined {
  const info = Buffer.alloc(GETINFO_SIZE);
  info.write(table, 0, 31, 'latin1');
  const len = Buffer.alloc(4);
  len.writeUInt32LE(GETINFO_SIZE);
  if (c.getsockopt(fd, family === 4 ? SOL_IP : SOL_IPV6, SO_GET_INFO, info, len) !== 0) {
    const e = c.errno();
    if (e === ENOENT) return undefined;
    throw new KernelError(`getsockopt ${family === 4 ? 'IPT' : 'IP6T'}_SO_GET_INFO ${table}: errno ${e}`);
  }
  return { entries: info.readUInt32LE(76), size: info.readUInt32LE(80) };
}

/**
 * An iptables-legacy table's size and a digest of its entries as the kernel
 * gives them back (the blob iptables-save decodes), with the packet and byte
 * counters zeroed: a rule replaced by one of the same size moves it too.
 * Undefined when the table does not exist. One copy of the table, no tool
 * run; the copy (most of the time: the kernel sums each rule's counters over
 * every CPU) on libuv's thread pool.
 */
export async function xtablesDigest(family: 4 | 6, table: string, netns?: string): Promise<XtablesDigest | undefined> {
  const c = libc();
  const fd = inNetns(netns, () => c.socket(family === 4 ? AF_INET : AF_INET6, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_RAW));
  if (fd < 0) throw new KernelError(`raw socket: errno ${c.errno()}`);
  const level = family === 4 ? SOL_IP : SOL_IPV6;
  try {
    for (let attempt = 1; ; attempt++) {
      const info = getInfo(c, fd, family, table);
      if (!info) return undefined;
      // zeroed: the kernel writes a match's or target's name only up to its NUL
      const buf = Buffer.alloc(GET_ENTRIES_HEAD + info.size);
      buf.write(table, 0, 31, 'latin1');
      buf.writeUInt32LE(info.size, 32);
      const len = Buffer.alloc(4);
      len.writeUInt32LE(buf.length);
      // the pool thread's errno cannot be read: the table most likely changed
      // size since GET_INFO (EAGAIN), so again; the last try on this thread says why
      const r = attempt < TRIES ? await c.getsockoptAsync(fd, level, SO_GET_ENTRIES, buf, len) : c.getsockopt(fd, level, SO_GET_ENTRIES, buf, len);
      if (r === 0) return { ...info, digest: digestEntries(buf, family) };
      if (attempt < TRIES) continue;
      const e = c.errno();
      if (e === ENOENT) return undefined;
      throw new KernelError(`getsockopt ${family === 4 ? 'IPT' : 'IP6T'}_SO_GET_ENTRIES ${table}: errno ${e}${e === EAGAIN ? ' (the table kept changing)' : ''}`);
    }
  } finally {
    c.close(fd);
  }
}

/**
 * sha256 of the entries (the fastest of node's hashes where the CPU has SHA
 * instructions), each entry's counters zeroed first (they move with every
 * packet). buf: struct ipt_get_entries, the entries 8-byte aligned.
 */
function digestEntries(buf: Buffer, family: 4 | 6): string {
  const at = ENTRY[family];
  const entries = buf.subarray(GET_ENTRIES_HEAD);
  // the counters are two u64 at an 8-byte aligned offset: zeroed as two
  // doubles (a byte loop or a fill() per entry costs several times more)
  const aligned = entries.byteOffset % 8 === 0;
  const words = aligned ? new Float64Array(entries.buffer, entries.byteOffset, entries.length >> 3) : undefined;
  for (let off = 0; off + at.counters + 16 <= entries.length; ) {
    if (words) words[(off + at.counters) >> 3] = words[(off + at.counters + 8) >> 3] = 0;
    else entries.fill(0, off + at.counters, off + at.counters + 16);
    const next = entries.readUInt16LE(off + at.next);
    if (next === 0) break;
    off += next;
  }
  return createHash('sha256').update(entries).digest('hex');
}
