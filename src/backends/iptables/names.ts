// kube-proxy's iptables names and the text forms iptables-save prints, so
// that kpng's chains read exactly like upstream's (and a rule read back from
// the kernel compares equal to the rule kpng wrote).
import { createHash } from 'node:crypto';
import type { Family } from '../../api/ip.js';

const BASE32 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ234567';

/** RFC 4648 base32 (Go's base32.StdEncoding), without padding: only a prefix is used. */
export function base32(bytes: Uint8Array): string {
  let out = '';
  let bits = 0;
  let value = 0;
  for (const b of bytes) {
    value = (value << 8) | b;
    bits += 8;
    while (bits >= 5) {
      out += BASE32[(value >>> (bits - 5)) & 31];
      bits -= 5;
    }
  }
  if (bits > 0) out += BASE32[(value << (5 - bits)) & 31];
  return out;
}

// names are asked for again on every render of a service: remember them (bounded)
const hashes = new Map<string, string>();

function hash16(s: string): string {
  let h = hashes.get(s);
  if (h === undefined) {
    h = base32(createHash('sha256').update(s).digest().subarray(0, 10));
    if (hashes.size >= 500_000) hashes.clear();
    hashes.set(s, h);
  }
  return h;
}

/** upstream portProtoHash: base32(sha256(servicePortName + protocol))[:16] */
export function portProtoHash(servicePortName: string, protocol: string): string {
  return hash16(servicePortName + protocol);
}

export interface ServiceChains {
  /** KUBE-SVC-*: Cluster-policy endpoints */
  readonly svc: string;
  /** KUBE-SVL-*: Local-policy endpoints */
  readonly svl: string;
  /** KUBE-EXT-*: external destinations */
  readonly ext: string;
  /** KUBE-FW-*: loadBalancerSourceRanges */
  readonly fw: string;
}

export function serviceChains(servicePortName: string, protocol: string): ServiceChains {
  const h = portProtoHash(servicePortName, protocol);
  return { svc: `KUBE-SVC-${h}`, svl: `KUBE-SVL-${h}`, ext: `KUBE-EXT-${h}`, fw: `KUBE-FW-${h}` };
}

/** endpoint as Go's net.JoinHostPort prints it */
export function hostPort(ip: string, port: number): string {
  return ip.includes(':') ? `[${ip}]:${port}` : `${ip}:${port}`;
}

/** KUBE-SEP-*: base32(sha256(servicePortName + protocol + "ip:port"))[:16] */
export function endpointChain(servicePortName: string, protocol: string, endpoint: string): string {
  return `KUBE-SEP-${hash16(servicePortName + protocol + endpoint)}`;
}

const SERVICE_CHAIN_PREFIXES = ['KUBE-SVC-', 'KUBE-SVL-', 'KUBE-EXT-', 'KUBE-FW-', 'KUBE-SEP-'];

/** upstream isServiceChainName: the per-service chains, which kpng creates and deletes */
export function isServiceChain(name: string): boolean {
  return SERVICE_CHAIN_PREFIXES.some((p) => name.startsWith(p));
}

/**
 * A string argument as iptables-save prints it (xtables_save_string): bare
 * when it is only [A-Za-z0-9_-], else double-quoted with " \ ' escaped.
 */
export function saveString(s: string): string {
  if (/^[A-Za-z0-9_-]+$/.test(s)) return s;
  return `"${s.replace(/["\\']/g, (c) => `\\${c}`)}"`;
}

/**
 * `--probability` as iptables-save prints it: the kernel keeps
 * lround(2^31 * p) and prints that / 2^31 with %.11f (kube-proxy writes
 * 1/n with %0.10f; both give the same kernel value). Rounded half to even
 * like glibc's printf, on the exact binary value.
 */
export function probability(n: number): string {
  const k = BigInt(Math.round(0x80000000 * Number((1 / n).toFixed(10))));
  // k / 2^31 with 11 decimals: q = k * 10^11 / 2^31, rounded half to even
  const num = k * 100_000_000_000n;
  const den = 0x80000000n;
  let q = num / den;
  const r = num % den;
  if (r * 2n > den || (r * 2n === den && q % 2n === 1n)) q += 1n;
  const s = q.toString().padStart(12, '0');
  return `${s.slice(0, -11)}.${s.slice(-11)}`;
}

const probabilities: string[] = [];

/** probability(n), cached (most services have few endpoints) */
export function probabilityOf(n: number): string {
  if (n < 1024) return (probabilities[n] ??= probability(n));
  return probability(n);
}

/** An address as a match: iptables-save always prints the prefix length. */
export function addr(ipOrCIDR: string, family: Family): string {
  return ipOrCIDR.includes('/') ? ipOrCIDR : `${ipOrCIDR}/${family === 4 ? 32 : 128}`;
}

/** the mark for masquerading, as iptables-save prints it */
export function markHex(bit: number): string {
  return `0x${(2 ** bit).toString(16)}`;
}
