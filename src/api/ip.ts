// IP and CIDR helpers shared by sources, node-local state and backends.
// Addresses are kept as canonical strings (what Go's net.IP.String() prints),
// so that string equality is address equality.
import { isIPv4, isIPv6 } from 'node:net';

export type Family = 4 | 6;

/** Canonical form of an IP address, or undefined if it is not one. */
export function canonicalIP(s: string): string | undefined {
  const t = s.trim();
  if (isIPv4(t)) return t;
  // node's isIPv6 accepts a zone ("fe80::1%eth0"); no Kubernetes address has one
  if (t.includes('%') || !isIPv6(t)) return undefined;
  const words = ipv6Words(t);
  if (words.length !== 8 || words.some((w) => !(w >= 0 && w <= 0xffff))) return undefined;
  // IPv4-mapped addresses are IPv4 for kube-proxy (ParseIPSloppy + To4)
  if (words.slice(0, 5).every((w) => w === 0) && words[5] === 0xffff) {
    return `${words[6] >> 8}.${words[6] & 255}.${words[7] >> 8}.${words[7] & 255}`;
  }
  return formatIPv6(words);
}

/** Writes the 16 bytes of an IPv6 address, as written (a mapped IPv4 address stays mapped), at buf[at]; false when s is not one. */
export function writeIPv6(buf: Uint8Array, at: number, s: string): boolean {
  if (s.includes('%') || !isIPv6(s)) return false;
  const words = ipv6Words(s);
  if (words.length !== 8) return false;
  for (let i = 0; i < 8; i++) {
    buf[at + 2 * i] = words[i] >> 8;
    buf[at + 2 * i + 1] = words[i] & 255;
  }
  return true;
}

export function ipFamily(ip: string): Family {
  return ip.includes(':') ? 6 : 4;
}

function ipv6Words(s: string): number[] {
  let head = s;
  let tail4: number[] = [];
  const lastColon = s.lastIndexOf(':');
  const last = s.slice(lastColon + 1);
  if (last.includes('.')) {
    const b = last.split('.').map(Number);
    tail4 = [(b[0] << 8) | b[1], (b[2] << 8) | b[3]];
    head = s.slice(0, lastColon + 1) + '0';
  }
  const [l, r] = head.split('::') as [string, string | undefined];
  const left = l ? l.split(':').map((x) => parseInt(x, 16)) : [];
  const right = r !== undefined && r !== '' ? r.split(':').map((x) => parseInt(x, 16)) : [];
  const want = 8 - (tail4.length ? 2 : 0);
  let words: number[];
  if (r === undefined) {
    words = left;
  } else {
    const zeros = want + (tail4.length ? 1 : 0) - left.length - right.length;
    if (zeros < 0) return []; // more words than an address has: not one
    words = [...left, ...new Array<number>(zeros).fill(0), ...right];
  }
  if (tail4.length) words = [...words.slice(0, 6), ...tail4];
  return words.slice(0, 8);
}

function formatIPv6(w: number[]): string {
  // RFC 5952: compress the longest run (>= 2) of zero words, leftmost first
  let best = -1;
  let bestLen = 0;
  for (let i = 0; i < 8; ) {
    if (w[i] !== 0) { i++; continue; }
    let j = i;
    while (j < 8 && w[j] === 0) j++;
    if (j - i > bestLen && j - i >= 2) { best = i; bestLen = j - i; }
    i = j;
  }
  const hex = w.map((x) => x.toString(16));
  if (best < 0) return hex.join(':');
  return `${hex.slice(0, best).join(':')}::${hex.slice(best + bestLen).join(':')}`;
}

export interface CIDR {
  /** canonical network address (host bits cleared) */
  ip: string;
  prefix: number;
  family: Family;
}

/** Parses "a.b.c.d/n" or "x::/n"; surrounding spaces are tolerated (upstream does). */
export function parseCIDR(s: string): CIDR | undefined {
  const t = s.trim();
  const slash = t.indexOf('/');
  if (slash < 0) return undefined;
  const ip = canonicalIP(t.slice(0, slash));
  const ps = t.slice(slash + 1);
  if (!ip || !/^\d{1,3}$/.test(ps)) return undefined;
  const family = ipFamily(ip);
  const prefix = Number(ps);
  if (prefix > (family === 4 ? 32 : 128)) return undefined;
  return { ip: bigToIP(ipToBig(ip) & maskBig(family, prefix), family), prefix, family };
}

export function formatCIDR(c: CIDR): string {
  return `${c.ip}/${c.prefix}`;
}

export function cidrContains(c: CIDR, ip: string): boolean {
  const f = ipFamily(ip);
  if (f !== c.family) return false;
  return (ipToBig(ip) & maskBig(f, c.prefix)) === ipToBig(c.ip);
}

function maskBig(f: Family, prefix: number): bigint {
  const bits = f === 4 ? 32n : 128n;
  if (prefix === 0) return 0n;
  return ((1n << bits) - 1n) ^ ((1n << (bits - BigInt(prefix))) - 1n);
}

export function ipToBig(ip: string): bigint {
  if (ipFamily(ip) === 4) {
    return ip.split('.').reduce((a, b) => (a << 8n) | BigInt(Number(b)), 0n);
  }
  return ipv6Words(ip).reduce((a, w) => (a << 16n) | BigInt(w), 0n);
}

function bigToIP(v: bigint, f: Family): string {
  if (f === 4) return [24n, 16n, 8n, 0n].map((s) => Number((v >> s) & 255n)).join('.');
  const w: number[] = [];
  for (let i = 7; i >= 0; i--) w.push(Number((v >> BigInt(i * 16)) & 0xffffn));
  return formatIPv6(w);
}
