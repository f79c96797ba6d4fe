// kube-proxy's iptables layout (pkg/proxy/iptables/proxier.go): what one
// service port adds to the top-level chains, its own chains (KUBE-SVC/SVL/
// EXT/FW/SEP), and the fixed chains and jump rules. Rules are written in the
// canonical form iptables-save prints (addresses with their prefix length,
// -s/-d/-i/-p first, quoted comments), so that what kpng reads back from the
// kernel compares equal to what it wrote, and `iptables-save` lists exactly
// the rules kube-proxy's own would.
import type { Family } from '../../api/ip.js';
import type { ServicePort, Target } from '../shared/service-ports.js';
import { rangesContain } from '../shared/service-ports.js';
import { safeComment, IPTABLES_COMMENT_MAX } from '../shared/comment.js';
import { addr, endpointChain, hostPort, probabilityOf, saveString, serviceChains } from './names.js';

export const KUBE_SERVICES = 'KUBE-SERVICES';
export const KUBE_EXTERNAL_SERVICES = 'KUBE-EXTERNAL-SERVICES';
export const KUBE_NODEPORTS = 'KUBE-NODEPORTS';
export const KUBE_POSTROUTING = 'KUBE-POSTROUTING';
export const KUBE_MARK_MASQ = 'KUBE-MARK-MASQ';
export const KUBE_FORWARD = 'KUBE-FORWARD';
export const KUBE_PROXY_FIREWALL = 'KUBE-PROXY-FIREWALL';
export const KUBE_FIREWALL = 'KUBE-FIREWALL';
export const KUBE_PROXY_CANARY = 'KUBE-PROXY-CANARY';

export interface RenderContext {
  readonly family: Family;
  /** 1 << masqueradeBit, e.g. 0x4000 */
  readonly mark: string;
  readonly masqueradeAll: boolean;
  /** detect-local: "-s <cidr>" or "-i <iface>" (canonical position is taken care of); undefined = no detector */
  readonly local?: { readonly kind: 's' | 'i'; readonly value: string };
  /** the node's addresses of this family (a source range covering the node allows the LB IPs as sources) */
  readonly nodeIPs: readonly string[];
  /** large-cluster mode: endpoint rules without comments (upstream: more than 1000 endpoints) */
  readonly comments: boolean;
}

/** The parts of a rule in iptables-save's order; a leading "!" negates s, d and i. */
interface Spec {
  s?: string;
  d?: string;
  i?: string;
  p?: string;
  /** matches, in order (e.g. `-m comment --comment x -m tcp --dport 80`) */
  m?: string;
  /** target with its options, '' for none */
  j: string;
}

function neg(flag: string, v: string): string {
  return v.startsWith('!') ? `! ${flag} ${v.slice(1)}` : `${flag} ${v}`;
}

export function rule(chain: string, x: Spec): string {
  // joined, not concatenated: a flat string (kept for long as committed state) instead of a rope
  const parts = ['-A', chain];
  if (x.s) parts.push(neg('-s', x.s));
  if (x.d) parts.push(neg('-d', x.d));
  if (x.i) parts.push(neg('-i', x.i));
  if (x.p) parts.push('-p', x.p);
  if (x.m) parts.push(x.m);
  if (x.j) parts.push('-j', x.j);
  return parts.join(' ');
}

const comment = (text: string) => `-m comment --comment ${saveString(safeComment(text, IPTABLES_COMMENT_MAX))}`;

/** What one service port (one family) puts in the top-level chains and its own chains. */
export interface PortRules {
  readonly natServices: string[];
  readonly natNodePorts: string[];
  readonly filterServices: string[];
  readonly filterExternal: string[];
  readonly filterNodePorts: string[];
  readonly filterFirewall: string[];
  /** this port's nat chains and their rules */
  readonly chains: Map<string, string[]>;
}

export function emptyPortRules(): PortRules {
  return { natServices: [], natNodePorts: [], filterServices: [], filterExternal: [], filterNodePorts: [], filterFirewall: [], chains: new Map() };
}

export interface PortFacts {
  /** the Service is externally accessible (any family): decides whether eTP=Local applies */
  readonly serviceExternallyAccessible: boolean;
  /** healthCheckNodePort of an eTP=Local LoadBalancer, else 0 */
  readonly healthCheckNodePort: number;
}

/**
 * Renders one service port into out: upstream syncProxyRules, one loop
 * iteration, kept as one function so that it reads beside upstream's loop.
 */
export function renderPort(sp: ServicePort, facts: PortFacts, ctx: RenderContext, out: PortRules): void {
  const f = ctx.family;
  const proto = sp.protocol;
  const name = sp.portName;
  const P = sp.port.Port;
  const ch = serviceChains(name, proto);
  const reject = f === 4 ? 'REJECT --reject-with icmp-port-unreachable' : 'REJECT --reject-with icmp6-port-unreachable';
  const dport = (port: number) => `-m ${proto} --dport ${port}`;

  const itpLocal = sp.internalLocal;
  const etpLocal = sp.externalLocal && facts.serviceExternallyAccessible;
  const externallyAccessible = sp.nodePort !== 0 || sp.externalIPs.length > 0 || sp.loadBalancerIPs.length > 0;
  const clusterEndpoints = sp.cluster;
  const localEndpoints = itpLocal ? sp.internal : etpLocal ? sp.external : [];
  const usesClusterChain = clusterEndpoints.length > 0;
  const usesLocalChain = localEndpoints.length > 0 && (itpLocal || (etpLocal && externallyAccessible));
  const hasEndpoints = sp.hasEndpoints;

  const internalChain = itpLocal ? ch.svl : ch.svc;
  const hasInternal = hasEndpoints && !(itpLocal && localEndpoints.length === 0);
  const externalPolicyChain = etpLocal ? ch.svl : ch.svc;
  const hasExternal = hasEndpoints && !(etpLocal && localEndpoints.length === 0);
  const usesExt = hasEndpoints && externallyAccessible;
  const usesFW = hasEndpoints && sp.loadBalancerIPs.length > 0 && sp.sourceRanges.length > 0;
  const lbChain = usesFW ? ch.fw : ch.ext;

  let internalFilter = '';
  let internalFilterComment = '';
  let externalFilter = '';
  let externalFilterComment = '';
  if (!hasEndpoints) {
    internalFilter = externalFilter = reject;
    internalFilterComment = externalFilterComment = `${name} has no endpoints`;
  } else {
    if (!hasInternal) {
      internalFilter = 'DROP';
      internalFilterComment = `${name} has no local endpoints`;
    }
    if (!hasExternal) {
      externalFilter = 'DROP';
      externalFilterComment = `${name} has no local endpoints`;
    }
  }

  // cluster IP
  const cip = addr(sp.clusterIP, f);
  if (hasInternal) out.natServices.push(rule(KUBE_SERVICES, { d: cip, p: proto, m: `${comment(`${name} cluster IP`)} ${dport(P)}`, j: internalChain }));
  else out.filterServices.push(rule(KUBE_SERVICES, { d: cip, p: proto, m: `${comment(internalFilterComment)} ${dport(P)}`, j: internalFilter }));

  // external IPs
  for (const ip of sp.externalIPs) {
    if (hasEndpoints) out.natServices.push(rule(KUBE_SERVICES, { d: addr(ip, f), p: proto, m: `${comment(`${name} external IP`)} ${dport(P)}`, j: ch.ext }));
    if (!hasExternal) out.filterExternal.push(rule(KUBE_EXTERNAL_SERVICES, { d: addr(ip, f), p: proto, m: `${comment(externalFilterComment)} ${dport(P)}`, j: externalFilter }));
  }

  // load-balancer IPs
  for (const ip of sp.loadBalancerIPs) {
    if (hasEndpoints) out.natServices.push(rule(KUBE_SERVICES, { d: addr(ip, f), p: proto, m: `${comment(`${name} loadbalancer IP`)} ${dport(P)}`, j: lbChain }));
    if (usesFW) out.filterFirewall.push(rule(KUBE_PROXY_FIREWALL, { d: addr(ip, f), p: proto, m: `${comment(`${name} traffic not accepted by ${ch.fw}`)} ${dport(P)}`, j: 'DROP' }));
  }
  if (!hasExternal) {
    for (const ip of sp.loadBalancerIPs) out.filterExternal.push(rule(KUBE_EXTERNAL_SERVICES, { d: addr(ip, f), p: proto, m: `${comment(externalFilterComment)} ${dport(P)}`, j: externalFilter }));
  }

  // NodePort (not subject to loadBalancerSourceRanges)
  if (sp.nodePort) {
    if (hasEndpoints) out.natNodePorts.push(rule(KUBE_NODEPORTS, { p: proto, m: `${comment(name)} ${dport(sp.nodePort)}`, j: ch.ext }));
    if (!hasExternal) {
      out.filterExternal.push(rule(KUBE_EXTERNAL_SERVICES, { p: proto, m: `${comment(externalFilterComment)} -m addrtype --dst-type LOCAL ${dport(sp.nodePort)}`, j: externalFilter }));
    }
  }
  if (facts.healthCheckNodePort) {
    out.filterNodePorts.push(rule(KUBE_NODEPORTS, { p: 'tcp', m: `${comment(`${name} health check node port`)} -m tcp --dport ${facts.healthCheckNodePort}`, j: 'ACCEPT' }));
  }

  const chains = out.chains;
  const chain = (n: string): string[] => {
    let c = chains.get(n);
    if (!c) chains.set(n, (c = []));
    return c;
  };

  // internal traffic: masquerade what does not come from a pod (or everything)
  if (hasInternal) {
    const m = `${comment(`${name} cluster IP`)} ${dport(P)}`;
    if (ctx.masqueradeAll) chain(internalChain).push(rule(internalChain, { d: cip, p: proto, m, j: KUBE_MARK_MASQ }));
    else if (ctx.local) chain(internalChain).push(rule(internalChain, { ...notLocal(ctx.local), d: cip, p: proto, m, j: KUBE_MARK_MASQ }));
  }

  // external destinations
  if (usesExt) {
    const ext = chain(ch.ext);
    if (!etpLocal) {
      ext.push(rule(ch.ext, { m: comment(`masquerade traffic for ${name} external destinations`), j: KUBE_MARK_MASQ }));
    } else {
      // pods and the node itself short-circuit to every endpoint (as if via the LB and back)
      if (ctx.local) ext.push(rule(ch.ext, { ...isLocal(ctx.local), m: comment(`pod traffic for ${name} external destinations`), j: ch.svc }));
      ext.push(rule(ch.ext, { m: `${comment(`masquerade LOCAL traffic for ${name} external destinations`)} -m addrtype --src-type LOCAL`, j: KUBE_MARK_MASQ }));
      ext.push(rule(ch.ext, { m: `${comment(`route LOCAL traffic for ${name} external destinations`)} -m addrtype --src-type LOCAL`, j: ch.svc }));
    }
    if (hasExternal) ext.push(rule(ch.ext, { j: externalPolicyChain }));
  }

  // loadBalancerSourceRanges: allowed sources go on, the rest falls through to KUBE-PROXY-FIREWALL's DROP
  if (usesFW) {
    const fw = chain(ch.fw);
    const m = comment(`${name} loadbalancer IP`);
    for (const cidr of sp.sourceRanges) fw.push(rule(ch.fw, { s: cidr, m, j: ch.ext }));
    if (ctx.nodeIPs.some((ip) => rangesContain(sp.sourceRanges, ip))) {
      for (const ip of sp.loadBalancerIPs) fw.push(rule(ch.fw, { s: addr(ip, f), m, j: ch.ext }));
    }
    fw.push(rule(ch.fw, { m: comment(`other traffic to ${name} will be dropped by KUBE-PROXY-FIREWALL`), j: '' }));
  }

  // one chain per endpoint reachable from this node
  const reachable = new Map<string, { t: Target; sep: string }>();
  const sepOf = (t: Target) => {
    const ep = hostPort(t.ip, t.port);
    let r = reachable.get(ep);
    if (!r) reachable.set(ep, (r = { t, sep: endpointChain(name, proto, ep) }));
    return { ep, sep: r.sep };
  };
  if (usesClusterChain) serviceToEndpoints(chain(ch.svc), ch.svc, sp, clusterEndpoints.map(sepOf), ctx);
  if (usesLocalChain) serviceToEndpoints(chain(ch.svl), ch.svl, sp, localEndpoints.map(sepOf), ctx);
  const svcComment = ctx.comments ? `${comment(name)} ` : '';
  for (const [ep, { t, sep }] of reachable) {
    const affinity = sp.affinitySeconds ? `-m recent --set --name ${sep} --mask ${fullMask(f)} --rsource ` : '';
    chains.set(sep, [
      rule(sep, { s: addr(t.ip, f), m: svcComment.trimEnd(), j: KUBE_MARK_MASQ }),
      rule(sep, { p: proto, m: `${svcComment}${affinity}-m ${proto}`, j: `DNAT --to-destination ${ep}` }),
    ]);
  }
}

function fullMask(f: Family): string {
  return f === 4 ? '255.255.255.255' : 'ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff';
}

function isLocal(l: NonNullable<RenderContext['local']>): Pick<Spec, 's' | 'i'> {
  return l.kind === 's' ? { s: l.value } : { i: l.value };
}

function notLocal(l: NonNullable<RenderContext['local']>): Pick<Spec, 's' | 'i'> {
  return l.kind === 's' ? { s: `!${l.value}` } : { i: `!${l.value}` };
}

/** upstream writeServiceToEndpointRules: affinity checks first, then 1/(n-i) probabilities, the last unconditional */
function serviceToEndpoints(out: string[], chain: string, sp: ServicePort, eps: readonly { ep: string; sep: string }[], ctx: RenderContext): void {
  const f = ctx.family;
  const c = (ep: string) => (ctx.comments ? `${comment(`${sp.portName} -> ${ep}`)} ` : '');
  if (sp.affinitySeconds) {
    for (const { ep, sep } of eps) out.push(rule(chain, { m: `${c(ep)}-m recent --rcheck --seconds ${sp.affinitySeconds} --reap --name ${sep} --mask ${fullMask(f)} --rsource`, j: sep }));
  }
  const n = eps.length;
  eps.forEach(({ ep, sep }, i) => {
    const m = i < n - 1 ? `${c(ep)}-m statistic --mode random --probability ${probabilityOf(n - i)}` : c(ep).trimEnd();
    out.push(rule(chain, { m: m || undefined, j: sep }));
  });
}

export interface StaticInputs {
  readonly family: Family;
  readonly mark: string;
  /** IPv4 with localhostNodePorts: NodePorts on 127.0.0.1 (and the anti-martian KUBE-FIREWALL) */
  readonly localhostNodePorts: boolean;
  /** nf_conntrack_tcp_be_liberal is set: no DROP of INVALID packets */
  readonly tcpBeLiberal: boolean;
  /** NodePorts on every local address, or on these addresses only */
  readonly nodePortAddresses: 'all' | readonly string[];
}

const NODEPORTS_COMMENT = comment('kubernetes service nodeports; NOTE: this must be the last rule in this chain');

/** The last rule(s) of nat KUBE-SERVICES: to KUBE-NODEPORTS for the node's own addresses. */
export function nodePortJumps(s: StaticInputs): string[] {
  if (s.nodePortAddresses === 'all') {
    const not = s.family === 6 ? '!::1/128' : s.localhostNodePorts ? undefined : '!127.0.0.0/8';
    return [rule(KUBE_SERVICES, { d: not, m: `${NODEPORTS_COMMENT} -m addrtype --dst-type LOCAL`, j: KUBE_NODEPORTS })];
  }
  return s.nodePortAddresses.map((ip) => rule(KUBE_SERVICES, { d: addr(ip, s.family), m: NODEPORTS_COMMENT, j: KUBE_NODEPORTS }));
}

/** nat chains with fixed content */
export function natFixedChains(s: StaticInputs): Map<string, string[]> {
  return new Map([
    [
      KUBE_POSTROUTING,
      [
        rule(KUBE_POSTROUTING, { m: `-m mark ! --mark ${s.mark}/${s.mark}`, j: 'RETURN' }),
        rule(KUBE_POSTROUTING, { j: `MARK --set-xmark ${s.mark}/0x0` }),
        rule(KUBE_POSTROUTING, { m: comment('kubernetes service traffic requiring SNAT'), j: 'MASQUERADE --random-fully' }),
      ],
    ],
    [KUBE_MARK_MASQ, [rule(KUBE_MARK_MASQ, { j: `MARK --set-xmark ${s.mark}/${s.mark}` })]],
  ]);
}

/** filter rules with fixed content, by chain */
export function filterFixedRules(s: StaticInputs): Map<string, string[]> {
  const forward = [
    ...(s.tcpBeLiberal ? [] : [rule(KUBE_FORWARD, { m: '-m conntrack --ctstate INVALID', j: 'DROP' })]),
    rule(KUBE_FORWARD, { m: `${comment('kubernetes forwarding rules')} -m mark --mark ${s.mark}/${s.mark}`, j: 'ACCEPT' }),
    rule(KUBE_FORWARD, { m: `${comment('kubernetes forwarding conntrack rule')} -m conntrack --ctstate RELATED,ESTABLISHED`, j: 'ACCEPT' }),
  ];
  const out = new Map([[KUBE_FORWARD, forward]]);
  // route_localnet lets anyone reach 127.0.0.1 from outside (#90259): drop what was not DNATed
  if (s.localhostNodePorts) {
    out.set(KUBE_FIREWALL, [
      rule(KUBE_FIREWALL, { s: '!127.0.0.0/8', d: '127.0.0.0/8', m: `${comment('block incoming localnet connections')} -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT`, j: 'DROP' }),
    ]);
  }
  return out;
}

export interface JumpRule {
  readonly table: 'filter' | 'nat';
  /** built-in chain */
  readonly from: string;
  /** the rule without "-A <from>", as iptables-save prints it */
  readonly rule: string;
}

/** upstream iptablesJumpChains (+ kubelet's KUBE-FIREWALL jumps with localhost NodePorts), in upstream's order */
export function jumpRules(localhostNodePorts: boolean): JumpRule[] {
  const j = (table: JumpRule['table'], from: string, to: string, text: string, ctNew: boolean): JumpRule => ({
    table,
    from,
    rule: `${ctNew ? '-m conntrack --ctstate NEW ' : ''}${comment(text)} -j ${to}`,
  });
  const list = [
    j('filter', 'INPUT', KUBE_EXTERNAL_SERVICES, 'kubernetes externally-visible service portals', true),
    j('filter', 'FORWARD', KUBE_EXTERNAL_SERVICES, 'kubernetes externally-visible service portals', true),
    j('filter', 'INPUT', KUBE_NODEPORTS, 'kubernetes health check service ports', false),
    j('filter', 'FORWARD', KUBE_SERVICES, 'kubernetes service portals', true),
    j('filter', 'OUTPUT', KUBE_SERVICES, 'kubernetes service portals', true),
    j('filter', 'FORWARD', KUBE_FORWARD, 'kubernetes forwarding rules', false),
    j('filter', 'INPUT', KUBE_PROXY_FIREWALL, 'kubernetes load balancer firewall', true),
    j('filter', 'OUTPUT', KUBE_PROXY_FIREWALL, 'kubernetes load balancer firewall', true),
    j('filter', 'FORWARD', KUBE_PROXY_FIREWALL, 'kubernetes load balancer firewall', true),
    j('nat', 'OUTPUT', KUBE_SERVICES, 'kubernetes service portals', false),
    j('nat', 'PREROUTING', KUBE_SERVICES, 'kubernetes service portals', false),
    j('nat', 'POSTROUTING', KUBE_POSTROUTING, 'kubernetes postrouting rules', false),
  ];
  if (localhostNodePorts) list.push({ table: 'filter', from: 'INPUT', rule: `-j ${KUBE_FIREWALL}` }, { table: 'filter', from: 'OUTPUT', rule: `-j ${KUBE_FIREWALL}` });
  return list;
}

/** filter chains kpng writes in full every sync, in upstream's order */
export const FILTER_CHAINS = [KUBE_SERVICES, KUBE_EXTERNAL_SERVICES, KUBE_FORWARD, KUBE_NODEPORTS, KUBE_PROXY_FIREWALL] as const;
/** nat chains kpng writes in full every sync */
export const NAT_CHAINS = [KUBE_SERVICES, KUBE_NODEPORTS, KUBE_POSTROUTING, KUBE_MARK_MASQ] as const;
