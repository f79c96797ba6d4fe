// What one service port puts in the kpng table: map and set elements, which
// shared load-balancing chains it needs, and, with ClientIP affinity only,
// chains and sets of its own.
import type { ServicePort, Target } from '../shared/service-ports.js';
import { rangesContain } from '../shared/service-ports.js';
import { safeComment, NFT_COMMENT_MAX } from '../shared/comment.js';
import { createHash } from 'node:crypto';
import { flat } from '../../runtime/memory.js';
import { AFFINITY_PREFIX, endpointsMapOf, lbChainName, type LbKind, type Proto } from './ruleset.js';
import { pooled } from '../../api/compact.js';

export type { Element } from '../shared/nftables/elements.js';
import type { Element } from '../shared/nftables/elements.js';

export interface LbRequirement {
  readonly kind: LbKind;
  readonly proto: Proto;
  readonly n: number;
}

/** A UDP flow this node programs (for conntrack cleanup when it goes away). */
export interface UdpFlow {
  /** service IP, or '' for a NodePort (any node address) */
  readonly vip: string;
  readonly port: number;
  readonly endpoint: string;
}

export interface PortElements {
  readonly elements: Element[];
  readonly lbChains: LbRequirement[];
  /** ClientIP affinity: this service port's own chains (name -> rules) and per-endpoint sets */
  readonly affinityChains: Map<string, string[]>;
  readonly affinitySets: string[];
  readonly udpFlows: UdpFlow[];
  /** service IP:port (or :NodePort) that have endpoints, for conntrack cleanup of 0 -> N */
  readonly udpWithEndpoints: UdpFlow[];
}

/** slot assignments from the previous sync, by endpoints map and key */
export type Slots = Map<string, string[]>;

/**
 * Keeps each endpoint at its slot; a removed endpoint's slot is refilled by a
 * new one, or by the last slot. One endpoint change is then a few element
 * changes, and clients sticking to other endpoints (affinity) keep them.
 */
export function assignSlots(prev: readonly string[] | undefined, targets: readonly string[]): string[] {
  const want = new Set(targets);
  const slots: (string | undefined)[] = (prev ?? []).map((t) => (want.has(t) ? t : undefined));
  const placed = new Set(slots);
  const incoming = targets.filter((t) => !placed.has(t));
  for (let i = 0; i < slots.length && incoming.length; i++) if (slots[i] === undefined) slots[i] = incoming.shift();
  slots.push(...incoming);
  for (let i = 0; i < slots.length; i++) {
    if (slots[i] !== undefined) continue;
    while (slots.length > i && slots[slots.length - 1] === undefined) slots.pop();
    if (slots.length > i) slots[i] = slots.pop();
  }
  return slots as string[];
}

export interface NodeFacts {
  /** the node's own addresses of this family (for source ranges covering the node) */
  readonly nodeIPs: readonly string[];
}

export function portElements(sp: ServicePort, node: NodeFacts, prevSlots: Slots, nextSlots: Slots): PortElements {
  const elements: Element[] = [];
  const lbChains: LbRequirement[] = [];
  const udpFlows: UdpFlow[] = [];
  const udpWithEndpoints: UdpFlow[] = [];
  const comment = safeComment(sp.portName, NFT_COMMENT_MAX);
  const proto = sp.protocol;
  const P = sp.port.Port;
  const vipKey = (ip: string) => flat(ip, ' . ', proto, ' . ', P);
  const noEndpoints = sp.hasEndpoints ? 'drop' : 'goto reject-chain';
  const add = (set: string, key: string, value = '', withComment = false) => elements.push({ set, key, value, comment: withComment ? comment : '', owner: '' });

  const udp = (targets: readonly Target[], vip: string, port: number) => {
    if (proto !== 'udp') return;
    for (const t of targets) udpFlows.push({ vip, port, endpoint: t.ip });
    udpWithEndpoints.push({ vip, port, endpoint: '' });
  };
  /** endpoints of a key in the map of kind; returns the verdict that load-balances over them */
  const lb = (kind: LbKind, key: string, targets: readonly Target[], vip: string, port: number): string => {
    udp(targets, vip, port);
    if (affinity) return flat('goto ', affinity.chain(targets));
    const map = endpointsMapOf(kind, proto);
    const slotKey = flat(map, '|', key);
    const slots = assignSlots(prevSlots.get(slotKey), targets.map((t) => flat(t.ip, ' . ', t.port)));
    nextSlots.set(slotKey, slots);
    slots.forEach((t, i) => add(map, flat(key, ' . ', i), t));
    lbChains.push({ kind, proto, n: slots.length });
    return pooled(flat('goto ', lbChainName(kind, proto, slots.length)));
  };
  const affinity = sp.affinitySeconds ? new AffinityChains(sp) : undefined;

  // cluster IP: internal traffic policy; masquerading is in the services chain
  add('cluster-ips', sp.clusterIP);
  const internalKind: LbKind = sp.internalLocal ? 'local' : 'cluster';
  if (sp.internal.length) add('service-ips', vipKey(sp.clusterIP), lb(internalKind, vipKey(sp.clusterIP), sp.internal, sp.clusterIP, P), true);
  else add('no-endpoint-services', vipKey(sp.clusterIP), noEndpoints, true);

  // external IPs and load-balancer IPs: external traffic policy
  const lbIPs = new Set(sp.loadBalancerIPs);
  const coversNode = sp.sourceRanges.length > 0 && node.nodeIPs.some((ip) => rangesContain(sp.sourceRanges, ip));
  for (const vip of new Set([...sp.externalIPs, ...sp.loadBalancerIPs])) {
    const key = vipKey(vip);
    if (sp.cluster.length === 0) {
      add('no-endpoint-services', key, noEndpoints, true);
    } else {
      add('service-ips', key, sp.externalLocal ? 'goto external-policy-local' : 'goto external-policy-cluster', true);
      add('external-cluster-lb', key, lb('cluster', key, sp.cluster, vip, P));
      if (sp.externalLocal) {
        if (sp.external.length) add('external-local-lb', key, lb('local', key, sp.external, vip, P));
        else add('no-endpoint-services', key, 'drop', true);
      }
    }
    // loadBalancerSourceRanges apply to LB IPs only (not NodePorts, not external IPs)
    if (lbIPs.has(vip) && sp.sourceRanges.length) {
      add('firewall-ips', key, '', true);
      for (const r of sp.sourceRanges) add('firewall-allow', flat(key, ' . ', r));
      // traffic from the node itself may come from an LB IP
      // (unless a range has it already: overlapping interval elements are refused)
      if (coversNode) for (const l of sp.loadBalancerIPs) if (!rangesContain(sp.sourceRanges, l)) add('firewall-allow', flat(key, ' . ', l));
    }
  }

  // NodePort: external traffic policy, any allowed node address
  if (sp.nodePort) {
    const key = `${proto} . ${sp.nodePort}`;
    if (sp.cluster.length === 0) {
      add('no-endpoint-nodeports', key, noEndpoints, true);
    } else {
      add('service-nodeports', key, sp.externalLocal ? 'goto nodeport-policy-local' : 'goto nodeport-policy-cluster', true);
      add('nodeport-cluster-lb', key, lb('nodeport-cluster', key, sp.cluster, '', sp.nodePort));
      if (sp.externalLocal) {
        if (sp.external.length) add('nodeport-local-lb', key, lb('nodeport-local', key, sp.external, '', sp.nodePort));
        else add('no-endpoint-nodeports', key, 'drop', true);
      }
    }
  }

  // hairpin: endpoints that can be on this node (local, or node unknown)
  const hairpin = new Set<string>();
  for (const list of [sp.internal, sp.external, sp.cluster]) for (const t of list) if (t.local || t.nodeName === '') hairpin.add(t.ip);
  for (const ip of hairpin) add('hairpin', flat(ip, ' . ', ip));
  return { elements, lbChains, affinityChains: affinity?.chains ?? NO_CHAINS, affinitySets: affinity?.sets ?? [], udpFlows, udpWithEndpoints };
}

const NO_CHAINS: Map<string, string[]> = new Map();

const sameTargets = (a: readonly Target[], b: readonly Target[]) => a === b || (a.length === b.length && a.every((t, i) => t.ip === b[i].ip && t.port === b[i].port));

const hash8 = (s: string) => createHash('sha256').update(s).digest('hex').slice(0, 8);

/**
 * A service port's ClientIP affinity, as kube-proxy: a chain per list of
 * endpoints (all of them; this node's) that sends a client found in an
 * endpoint's set to that endpoint, any other client to a random one; the
 * endpoint's chain records the client (refreshing its timeout) and DNATs.
 * The sets are per endpoint, so a client keeps its endpoint whichever IP or
 * NodePort of the service port it uses, wherever that endpoint is eligible.
 */
class AffinityChains {
  readonly chains = new Map<string, string[]>();
  readonly sets: string[] = [];
  private readonly id: string;
  private readonly ip: string;

  constructor(private readonly sp: ServicePort) {
    this.id = hash8(`${sp.portName}/${sp.protocol}`);
    this.ip = sp.family === 4 ? 'ip' : 'ip6';
  }

  /** the chain for one of the service port's endpoint lists (a NodePort and its IPs share it, as do lists alike) */
  chain(targets: readonly Target[]): string {
    const sp = this.sp;
    const list = sameTargets(targets, sp.cluster) ? 'cluster' : sameTargets(targets, sp.internal) ? 'internal' : 'external';
    const name = `${AFFINITY_PREFIX}${this.id}-${list}`;
    if (this.chains.has(name)) return name;
    const rules: string[] = [];
    const pick: string[] = [];
    targets.forEach((t, i) => {
      const ep = hash8(`${this.id} ${t.ip} ${t.port}`);
      const set = `${AFFINITY_PREFIX}${this.id}-${ep}`;
      const chain = `${AFFINITY_PREFIX}${this.id}-endpoint-${ep}`;
      rules.push(`${this.ip} saddr @${set} goto ${chain}`);
      pick.push(`${i} : goto ${chain}`);
      if (this.chains.has(chain)) return;
      this.sets.push(set);
      const to = this.sp.family === 4 ? `${t.ip}:${t.port}` : `[${t.ip}]:${t.port}`;
      this.chains.set(chain, [`update @${set} { ${this.ip} saddr timeout ${this.sp.affinitySeconds}s }`, `meta l4proto ${this.sp.protocol} dnat ${this.ip} to ${to}`]);
    });
    rules.push(`numgen random mod ${targets.length} vmap { ${pick.join(', ')} }`);
    this.chains.set(name, rules);
    return name;
  }
}
