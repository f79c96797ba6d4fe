// What to-ipvs keeps in nftables (kube-proxy's IPVS mode does it with
// iptables and ipsets): one table per family, `kpng-ipvs`, with a constant
// number of sets and chains; every Service is elements. IPVS does the load
// balancing; the table marks for masquerading what kube-proxy masquerades,
// drops LoadBalancer traffic from outside loadBalancerSourceRanges before
// IPVS sees it, masquerades hairpin traffic, and records which NodePort
// virtual servers are kpng's (IPVS keeps no owner).
import type { Family } from '../../api/ip.js';

export const TABLE = 'kpng-ipvs';
/** the dummy interface every service address is bound to, as kube-proxy's */
export const DUMMY = 'kube-ipvs0';

export interface FamilyNames {
  readonly family: Family;
  readonly table: 'ip' | 'ip6';
  readonly ip: 'ip' | 'ip6';
  readonly addr: 'ipv4_addr' | 'ipv6_addr';
}

export const FAMILIES: Record<Family, FamilyNames> = {
  4: { family: 4, table: 'ip', ip: 'ip', addr: 'ipv4_addr' },
  6: { family: 6, table: 'ip6', ip: 'ip6', addr: 'ipv6_addr' },
};

export function sets(f: FamilyNames): Record<string, string> {
  const vip = `${f.addr} . inet_proto . inet_service`;
  return {
    // every cluster IP: traffic from outside the cluster is masqueraded
    'cluster-ips': `type ${f.addr} ;`,
    // external and LoadBalancer IPs of externalTrafficPolicy Cluster Services: masqueraded
    'external-cluster': `type ${vip} ;`,
    // NodePorts of externalTrafficPolicy Cluster Services: masqueraded
    'nodeports-cluster': 'type inet_proto . inet_service ;',
    // loadBalancerSourceRanges
    'firewall-ips': `type ${vip} ;`,
    'firewall-allow': `type ${vip} . ${f.addr} ; flags interval ;`,
    // endpoint . endpoint: a pod reaching itself through its Service
    hairpin: `type ${f.addr} . ${f.addr} ;`,
    // the NodePort virtual servers kpng made (node address . protocol . port)
    'nodeport-servers': `type ${vip} ;`,
  };
}

export interface StaticInputs {
  /** 1 << masqueradeBit, hex */
  readonly mark: string;
  readonly masqueradeAll: boolean;
  /** nft match for "the source is not a pod" (detect-local), undefined without a detector */
  readonly notPodSource?: string;
}

export const BASE_CHAINS: Record<string, string> = {
  'filter-input': 'type filter hook input priority 0 ;',
  'nat-prerouting': 'type nat hook prerouting priority -100 ;',
  'nat-output': 'type nat hook output priority -100 ;',
  'nat-postrouting': 'type nat hook postrouting priority 100 ;',
};

/** chain -> rules */
export function chains(f: FamilyNames, s: StaticInputs): Map<string, string[]> {
  const ip = f.ip;
  const vipKey = `${ip} daddr . meta l4proto . th dport`;
  const mark = `meta mark set meta mark or ${s.mark}`;
  const toClusterIP = s.masqueradeAll ? [`${ip} daddr @cluster-ips ${mark}`] : s.notPodSource ? [`${ip} daddr @cluster-ips ${s.notPodSource} ${mark}`] : [];
  return new Map([
    // before IPVS (at LOCAL_IN, priority 98): LoadBalancer source ranges
    ['filter-input', [`${vipKey} . ${ip} saddr @firewall-allow return`, `${vipKey} @firewall-ips drop`]],
    ['nat-prerouting', ['jump mark-masquerade']],
    ['nat-output', ['jump mark-masquerade']],
    [
      'mark-masquerade',
      [...toClusterIP, `${vipKey} @external-cluster ${mark}`, `fib daddr type local meta l4proto . th dport @nodeports-cluster ${mark}`],
    ],
    // IPVS's connections pass here with net.ipv4.vs.conntrack=1
    ['nat-postrouting', [`meta mark & ${s.mark} != 0 meta mark set meta mark xor ${s.mark} masquerade fully-random`, `${ip} saddr . ${ip} daddr @hairpin masquerade fully-random`]],
  ]);
}
