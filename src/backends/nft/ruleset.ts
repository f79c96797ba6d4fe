// The fixed part of kpng's nftables ruleset: one table per IP family, base
// chains at kube-proxy's documented priorities, fixed chains, and a constant
// number of sets and maps. Everything per Service lives in map and set
// elements (see service-elements.ts); the chains that vary are the shared
// load-balancing chains, one per endpoint count (lb-*), whatever the number
// of Services, and the chains and sets of Services with ClientIP affinity
// (affinity-*), which have their own, as in kube-proxy.
import type { Family } from '../../api/ip.js';
// names every service port refers to are one pooled copy, not one per service
import { pooled } from '../../api/compact.js';
import { flat } from '../../runtime/memory.js';

export const TABLE = 'kpng';

export interface FamilyNames {
  readonly family: Family;
  /** nft address family of the table */
  readonly table: 'ip' | 'ip6';
  /** payload protocol for addresses */
  readonly ip: 'ip' | 'ip6';
  readonly addr: 'ipv4_addr' | 'ipv6_addr';
  readonly loopback: string;
}

export const FAMILIES: Record<Family, FamilyNames> = {
  4: { family: 4, table: 'ip', ip: 'ip', addr: 'ipv4_addr', loopback: '127.0.0.0/8' },
  6: { family: 6, table: 'ip6', ip: 'ip6', addr: 'ipv6_addr', loopback: '::1' },
};

export type SetDeclarations = Readonly<Record<string, Readonly<{ kind: 'set' | 'map'; body: string }>>>;

const declarations = new Map<Family, { all: SetDeclarations; entries: readonly (readonly [string, { kind: 'set' | 'map'; body: string }])[] }>();

/** sets and maps: name -> declaration body, for a family (one frozen copy: every sync renders them) */
export function setDeclarations(f: FamilyNames): SetDeclarations {
  return declared(f).all;
}

/** setDeclarations as [name, declaration] pairs */
export function setDeclarationList(f: FamilyNames): readonly (readonly [string, { kind: 'set' | 'map'; body: string }])[] {
  return declared(f).entries;
}

function declared(f: FamilyNames) {
  let d = declarations.get(f.family);
  if (!d) {
    const all = Object.freeze(buildSetDeclarations(f));
    declarations.set(f.family, (d = { all, entries: Object.freeze(Object.entries(all)) }));
  }
  return d;
}

function buildSetDeclarations(f: FamilyNames): Record<string, { kind: 'set' | 'map'; body: string }> {
  const vip = `${f.addr} . inet_proto . inet_service`;
  const vmap = (key: string) => ({ kind: 'map' as const, body: `type ${key} : verdict ;` });
  // one endpoints map per protocol: typing the data with "<proto> dport" (not
  // "th dport", which nft 1.0.6 cannot read back from the kernel) makes the
  // lb rule match that protocol only
  const endpoints: Record<string, { kind: 'map'; body: string }> = {};
  for (const kind of LB_KINDS) {
    const key = kind.startsWith('nodeport') ? 'meta l4proto . th dport . ' : `${f.ip} daddr . meta l4proto . th dport . `;
    for (const proto of PROTOCOLS) endpoints[endpointsMapOf(kind, proto)] = { kind: 'map', body: `typeof ${key}numgen random mod 1 : ${f.ip} daddr . ${proto} dport ;` };
  }
  return {
    ...endpoints,
    // dispatch: service IP . protocol . port -> where its traffic goes
    'service-ips': vmap(vip),
    'service-nodeports': vmap('inet_proto . inet_service'),
    // external traffic: the load-balancing chain of each policy
    'external-cluster-lb': vmap(vip),
    'external-local-lb': vmap(vip),
    'nodeport-cluster-lb': vmap('inet_proto . inet_service'),
    'nodeport-local-lb': vmap('inet_proto . inet_service'),
    // filtering
    'no-endpoint-services': vmap(vip),
    'no-endpoint-nodeports': vmap('inet_proto . inet_service'),
    'cluster-ips': { kind: 'set', body: `type ${f.addr} ;` },
    'service-cidrs': { kind: 'set', body: `type ${f.addr} ; flags interval ;` },
    'nodeport-addresses': { kind: 'set', body: `type ${f.addr} ; flags interval ;` },
    'firewall-ips': { kind: 'set', body: `type ${vip} ;` },
    'firewall-allow': { kind: 'set', body: `type ${vip} . ${f.addr} ; flags interval ;` },
    // endpoint . endpoint: a pod reaching itself through its Service
    hairpin: { kind: 'set', body: `type ${f.addr} . ${f.addr} ;` },
  };
}

/**
 * ClientIP affinity, as kube-proxy does it: per endpoint of a service port, a
 * set of the clients that used it, checked by the service port's affinity
 * chain whichever of its IPs (or NodePort) the client used. Only services
 * with affinity get chains and sets of their own; their names start with
 * AFFINITY_PREFIX and carry a hash of the service port (and endpoint).
 */
export const AFFINITY_PREFIX = 'affinity-';
/** a per-endpoint affinity set: affinity-<service port hash>-<endpoint hash> */
export const AFFINITY_SET = /^affinity-[0-9a-f]{8}-[0-9a-f]{8}$/;

/** the element timeout comes with each update (the Service's timeoutSeconds, at most a day) */
export function affinitySetBody(f: FamilyNames): string {
  return `type ${f.addr} ; flags dynamic,timeout ; timeout 1d ;`;
}

export interface StaticInputs {
  /** 1 << masqueradeBit, as hex */
  readonly mark: string;
  readonly masqueradeAll: boolean;
  /** nft match for "the source is a pod" (detect-local), undefined without a detector */
  readonly podSource?: string;
  /** nft match for "the source is not a pod" */
  readonly notPodSource?: string;
  /** NodePorts on every local address, or only on @nodeport-addresses */
  readonly nodePortsOnAllAddresses: boolean;
}

/** The fixed chains and their rules for a family. */
export function staticChains(f: FamilyNames, s: StaticInputs): Map<string, string[]> {
  const ip = f.ip;
  const vipKey = `${ip} daddr . meta l4proto . th dport`;
  const mark = `meta mark set meta mark or ${s.mark}`;
  const nodePortDst = s.nodePortsOnAllAddresses
    ? `fib daddr type local ${ip} daddr != ${f.loopback}`
    : `fib daddr type local ${ip} daddr @nodeport-addresses`;
  const clusterMasq = s.masqueradeAll ? [`${ip} daddr @cluster-ips ${mark}`] : s.notPodSource ? [`${ip} daddr @cluster-ips ${s.notPodSource} ${mark}`] : [];
  return new Map([
    ['filter-prerouting-pre-dnat', ['ct state new jump firewall-check']],
    ['filter-output-pre-dnat', ['ct state new jump firewall-check']],
    ['filter-input', ['ct state new jump nodeport-endpoints-check', 'ct state new jump service-endpoints-check']],
    ['filter-forward', ['ct state new jump service-endpoints-check', 'ct state new jump cluster-ips-check']],
    ['filter-output', ['ct state new jump service-endpoints-check', 'ct state new jump cluster-ips-check']],
    ['nat-prerouting', ['jump services']],
    ['nat-output', ['jump services']],
    ['nat-postrouting', ['jump masquerading']],
    ['services', [...clusterMasq, `${vipKey} vmap @service-ips`, `${nodePortDst} meta l4proto . th dport vmap @service-nodeports`]],
    [
      'masquerading',
      [`meta mark & ${s.mark} != 0 meta mark set meta mark xor ${s.mark} masquerade fully-random`, `ct status dnat ${ip} saddr . ${ip} daddr @hairpin masquerade fully-random`],
    ],
    ['reject-chain', ['reject']],
    ['service-endpoints-check', [`${vipKey} vmap @no-endpoint-services`]],
    ['nodeport-endpoints-check', [`${nodePortDst} meta l4proto . th dport vmap @no-endpoint-nodeports`]],
    ['cluster-ips-check', [`${ip} daddr @cluster-ips reject`, `${ip} daddr @service-cidrs drop`]],
    ['firewall-check', [`${vipKey} . ${ip} saddr @firewall-allow return`, `${vipKey} @firewall-ips drop`]],
    // externalTrafficPolicy Cluster: masquerade, then any endpoint
    ['external-policy-cluster', [mark, `${vipKey} vmap @external-cluster-lb`]],
    ['nodeport-policy-cluster', [mark, 'meta l4proto . th dport vmap @nodeport-cluster-lb']],
    // externalTrafficPolicy Local: pods and the node itself short-circuit to
    // all endpoints (the node masqueraded); the rest keeps its source and
    // goes to this node's endpoints, or is dropped
    ['external-policy-local', externalLocal(vipKey, '@external-cluster-lb', '@external-local-lb', s.podSource, mark)],
    ['nodeport-policy-local', externalLocal('meta l4proto . th dport', '@nodeport-cluster-lb', '@nodeport-local-lb', s.podSource, mark)],
  ]);
}

function externalLocal(key: string, cluster: string, local: string, podSource: string | undefined, mark: string): string[] {
  return [
    ...(podSource ? [`${podSource} ${key} vmap ${cluster}`] : []),
    `fib saddr type local ${mark}`,
    `fib saddr type local ${key} vmap ${cluster}`,
    `${key} vmap ${local}`,
  ];
}

export type LbKind = 'cluster' | 'local' | 'nodeport-cluster' | 'nodeport-local';
export type Proto = 'tcp' | 'udp' | 'sctp';
export const LB_KINDS: readonly LbKind[] = ['cluster', 'local', 'nodeport-cluster', 'nodeport-local'];
export const PROTOCOLS: readonly Proto[] = ['tcp', 'udp', 'sctp'];

/** endpoints by slot, e.g. cluster-endpoints-tcp: the lb chains pick slot numgen random mod N */
export function endpointsMapOf(kind: LbKind, proto: Proto): string {
  return pooled(flat(kind, '-endpoints-', proto));
}

/** the chain that load-balances over n endpoints */
export function lbChainName(kind: LbKind, proto: Proto, n: number): string {
  return pooled(flat('lb-', kind, '-', proto, '-', n));
}

const lbRules = new Map<string, readonly [string, readonly string[]]>();

/**
 * Load-balancing chain for n endpoints: one dnat through the endpoints map
 * at slot `numgen random mod n`. One frozen copy of each: a sync compares
 * the chains it needs with those committed, and the same list is the same.
 */
export function lbChain(f: FamilyNames, kind: LbKind, proto: Proto, n: number): readonly [string, readonly string[]] {
  const id = flat(f.family, '|', kind, '|', proto, '|', n);
  let c = lbRules.get(id);
  if (!c) lbRules.set(id, (c = Object.freeze([lbChainName(kind, proto, n), Object.freeze(lbRulesOf(f, kind, proto, n))] as const)));
  return c;
}

function lbRulesOf(f: FamilyNames, kind: LbKind, proto: Proto, n: number): string[] {
  const key = kind.startsWith('nodeport') ? 'meta l4proto . th dport' : `${f.ip} daddr . meta l4proto . th dport`;
  return [`dnat ${f.ip} to ${key} . numgen random mod ${n} map @${endpointsMapOf(kind, proto)}`];
}
