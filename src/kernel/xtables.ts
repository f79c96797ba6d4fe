// iptables-legacy's tables as the kernel describes them (getsockopt on a
// raw socket): no tool to run for the periodic drift check.
import { KernelError, libc } from './libc.js';
import { inNetns } from './netns.js';

const AF_INET = 2;
const AF_INET6 = 10;
const SOCK_RAW = 3;
const SOCK_CLOEXEC = 0o2000000;
const IPPROTO_RAW = 255;

/** The number of rules and the size of an iptables-legacy table: they move with any change to it. */
export function xtablesInfo(family: 4 | 6, table: string, netns?: string): { entries: number; size: number } | undefined {
  const c = libc();
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
