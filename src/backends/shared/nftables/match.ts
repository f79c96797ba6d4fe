// nft expressions both nftables-based backends build from node facts.
import type { LocalDetector } from '../node-facts.js';

/** "from a pod" and "not from a pod" in nft syntax (ip or ip6), or undefined when pod traffic cannot be told apart. */
export function podSourceMatches(local: LocalDetector | undefined, ip: 'ip' | 'ip6'): { podSource?: string; notPodSource?: string } {
  if (local?.kind === 'cidrs') {
    const set = local.cidrs.length === 1 ? local.cidrs[0] : `{ ${local.cidrs.join(', ')} }`;
    return { podSource: `${ip} saddr ${set}`, notPodSource: `${ip} saddr != ${set}` };
  }
  if (local?.kind === 'interface') {
    const name = local.prefix ? `${local.name}*` : local.name;
    return { podSource: `iifname "${name}"`, notPodSource: `iifname != "${name}"` };
  }
  return {};
}

/** An interval set's element for a CIDR: a single address is written bare (as nft lists it). */
export function singleAddress(cidr: string): string {
  return cidr.endsWith('/32') || cidr.endsWith('/128') ? cidr.slice(0, cidr.lastIndexOf('/')) : cidr;
}
