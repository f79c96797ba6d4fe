// What to-ipvs keeps in nftables (kube-proxy's IPVS mode does it with
// iptables and ipsets): one table per family, `kpng-ipvs`, with a constant
// number of sets and chains; every Service is elements. IPVS does the load
// balancing; the table marks for masquerading what kube-proxy masquerades,
// drops LoadBalancer traffic from outside loadBalancerSourceRanges before
// IPVS sees it, masquerades hairpin traffic, short-circuits pods and the
// node to externalTrafficPolicy Local Services, rejects or drops what has no
// endpoint and what reaches a service address on no Service port, drops
// unallocated ServiceCIDR addresses, and records which NodePort virtual
// servers are kpng's (IPVS keeps no owner).
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
    // every address bound to kube-ipvs0, and its virtual servers: anything
    // else sent there is refused (the host's own sockets are not exposed)
    'service-addresses': `type ${f.addr} ;`,
    'virtual-servers': `type ${vip} ;`,
    // every cluster IP: traffic from outside the cluster is masqueraded
    'cluster-ips': `type ${f.addr} ;`,
    // ServiceCIDRs: an address in them that no Service has is dropped
    'service-cidrs': `type ${f.addr} ; flags interval ;`,
    // external and LoadBalancer IPs of externalTrafficPolicy Cluster Services: masqueraded
    'external-cluster': `type ${vip} ;`,
    // NodePorts of externalTrafficPolicy Cluster Services: masqueraded
    'nodeports-cluster': 'type inet_proto . inet_service ;',
    // externalTrafficPolicy Local: pods and the node itself short-circuit to the cluster IP
    'external-local': `type ${vip} ;`,
    'external-local-shortcut': `type ${vip} : ${f.addr} . inet_service ;`,
    // virtual servers without a real server: REJECT (no endpoint anywhere) or DROP (none for this traffic here)
    'no-endpoints-reject': `type ${vip} ;`,
    'no-endpoints-drop': `type ${vip} ;`,
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
  /** nft matches for "the source is (not) a pod" (detect-local), undefined without a detector */
  readonly podSource?: string;
  readonly notPodSource?: string;
}

/** chain -> rules */
export function chains(f: FamilyNames, s: StaticInputs): Map<string, string[]> {
  const ip = f.ip;
  const vipKey = `${ip} daddr . meta l4proto . th dport`;
  const mark = `meta mark set meta mark or ${s.mark}`;
  const toClusterIP = s.masqueradeAll ? [`${ip} daddr @cluster-ips ${mark}`] : s.notPodSource ? [`${ip} daddr @cluster-ips ${s.notPodSource} ${mark}`] : [];
  const shortcut = `dnat ${ip} to ${vipKey} map @external-local-shortcut`;
  return new Map([
    ['filter-prerouting-pre-dnat', ['ct state new jump firewall-check']],
    ['filter-output-pre-dnat', ['ct state new jump firewall-check']],
    ['firewall-check', [`${vipKey} . ${ip} saddr @firewall-allow return`, `${vipKey} @firewall-ips drop`]],
    [
      'filter-input',
      [
        `ct state new ${vipKey} @no-endpoints-drop drop`,
        `ct state new ${vipKey} @no-endpoints-reject reject`,
        `ct state new meta l4proto { tcp, udp, sctp } ${ip} daddr @service-addresses ${vipKey} != @virtual-servers reject`,
      ],
    ],
    ['filter-forward', ['ct state new jump cluster-ips-check']],
    ['filter-output', ['ct state new jump cluster-ips-check']],
    ['cluster-ips-check', [`${ip} daddr @service-cidrs ${ip} daddr != @service-addresses drop`]],
    ['nat-prerouting', ['jump services']],
    ['nat-output', ['jump services']],
    [
      'services',
      [
        ...toClusterIP,
        `${vipKey} @external-cluster ${mark}`,
        `fib daddr type local meta l4proto . th dport @nodeports-cluster ${mark}`,
        `${vipKey} @external-local jump external-local`,
      ],
    ],
    // externalTrafficPolicy Local, pods and the node itself: to the cluster IP (all endpoints), the node masqueraded
    ['external-local', [...(s.podSource ? [`${s.podSource} ${shortcut}`] : []), `fib saddr type local ${mark} ${shortcut}`]],
    // IPVS's connections go through here with net.ipv4.vs.conntrack=1
    ['nat-postrouting', [`meta mark & ${s.mark} != 0 meta mark set meta mark xor ${s.mark} masquerade fully-random`, `${ip} saddr . ${ip} daddr @hairpin masquerade fully-random`]],
  ]);
}
