// The packet-flow scenarios (test/data/flows, see its README) through the lab:
// the lab a scenario needs, the state and configuration kpng gets, and the
// check of one flow against what really happened to its packets.
import { readFileSync, readdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { canonicalIP, cidrContains, ipFamily, parseCIDR } from '../../src/api/ip.js';
import { describeOutcome, hostPort, kernelHasSCTP, seenSource, spread, verdict, type Lab, type LabCgroup, type LabSpec, type Outcome } from '../../src/lab/index.js';
import { trace, type TraceRequest, type TraceResult } from '../../src/trace/index.js';
import { kubeProxyConfig, list, type ProxyMode } from './lab-kpng.js';

type Obj = Record<string, any>;

export const FLOWS_DIR = fileURLToPath(new URL('../data/flows/', import.meta.url));

export interface Flow {
  name: string;
  sourceIP: string;
  protocol: 'TCP' | 'UDP' | 'SCTP';
  destIP: string;
  destPort: number;
  output: string;
  masq: boolean;
}

export interface Scenario {
  source: string;
  test: string;
  subtest?: string;
  step?: number;
  node: { name: string; ips: string[]; primaryIP: string; labels: Record<string, string>; interfaces: { name: string; addresses: string[] }[] };
  config: {
    proxyMode: 'nftables' | 'iptables';
    ipFamily: 'IPv4' | 'IPv6';
    clusterCIDR: string | null;
    detectLocal: 'ClusterCIDR' | 'None';
    serviceCIDRs?: string[];
    nodePortAddresses: string[];
    masqueradeAll: boolean;
    masqueradeBit: number;
  };
  services: Obj[];
  endpointSlices: Obj[];
  flows: Flow[];
  notes?: string[];
}

export function scenarioFiles(mode: 'nftables' | 'iptables' | 'ipvs'): string[] {
  return readdirSync(FLOWS_DIR)
    .filter((f) => f.startsWith(`${mode}_`) && f.endsWith('.json'))
    .sort();
}

export function loadScenario(file: string): Scenario {
  return JSON.parse(readFileSync(FLOWS_DIR + file, 'utf8'));
}

// Pod addresses when the scenario has no clusterCIDR (detectLocal None): the
// README's pods are in 10.0.0.0/8 and fd00:10::/64 all the same.
const POD_NETS = ['10.0.0.0/8', 'fd00:10::/64'];

function podNets(s: Scenario) {
  return [...(s.config.clusterCIDR ? [s.config.clusterCIDR] : []), ...POD_NETS].map((c) => parseCIDR(c)!);
}

const podName = (ip: string) => `pod-${ip.replace(/[.:]+/g, '-').replace(/^-|-$/g, '')}`;

function endpointIPs(s: Scenario): string[] {
  return [...new Set(s.endpointSlices.flatMap((sl) => (sl.endpoints ?? []).flatMap((e: Obj) => (e.addresses ?? []).map((a: string) => canonicalIP(a) ?? a))))];
}

/**
 * The lab for a scenario: the node with its interfaces; one pod per endpoint
 * address; one pod per flow source inside the pod network that is not an
 * endpoint; every other source is the node (its own addresses) or the world.
 */
export function labSpecFor(s: Scenario, tag = 'flows'): LabSpec {
  const nodeIPs = new Set(s.node.interfaces.flatMap((i) => i.addresses.map((a) => canonicalIP(a.split('/')[0])!)));
  const pods = new Set(endpointIPs(s));
  const nets = podNets(s);
  for (const f of s.flows) {
    const ip = canonicalIP(f.sourceIP)!;
    if (!nodeIPs.has(ip) && nets.some((c) => cidrContains(c, ip))) pods.add(ip);
  }
  return {
    tag,
    node: { name: s.node.name, interfaces: s.node.interfaces },
    pods: [...pods].filter((ip) => !nodeIPs.has(ip)).map((ip) => ({ name: podName(ip), ips: [ip] })),
  };
}

/** The Kubernetes objects kpng reads: Services, EndpointSlices, the Node, the ServiceCIDR. */
export function stateFor(s: Scenario): Obj {
  const primary = canonicalIP(s.node.primaryIP)!;
  const other = s.node.ips.find((ip) => ipFamily(ip) !== ipFamily(primary));
  const node = {
    apiVersion: 'v1',
    kind: 'Node',
    metadata: { name: s.node.name, labels: { 'kubernetes.io/hostname': s.node.name, ...s.node.labels } },
    spec: {},
    status: { addresses: [primary, ...(other ? [other] : [])].map((address) => ({ type: 'InternalIP', address })) },
  };
  const cidrs = s.config.serviceCIDRs?.length
    ? [{ apiVersion: 'networking.k8s.io/v1', kind: 'ServiceCIDR', metadata: { name: 'kubernetes' }, spec: { cidrs: s.config.serviceCIDRs } }]
    : [];
  return list([node, ...cidrs, ...s.services, ...s.endpointSlices]);
}

/** kube-proxy's configuration for the scenario, in its own mode or another (a scenario of nftables run with to-ipvs). */
export function configFor(s: Scenario, mode: ProxyMode = s.config.proxyMode): Obj {
  return kubeProxyConfig({
    mode,
    localhostNodePorts: (s.config as { localhostNodePorts?: boolean }).localhostNodePorts,
    clusterCIDR: s.config.detectLocal === 'ClusterCIDR' ? (s.config.clusterCIDR ?? '') : '',
    nodePortAddresses: s.config.nodePortAddresses,
    masqueradeAll: s.config.masqueradeAll,
  });
}

/** The scenario's flows this kernel can carry (SCTP only where it has SCTP). */
export function flowsHere(s: Scenario): Flow[] {
  const sctp = kernelHasSCTP();
  return s.flows.filter((f) => f.protocol !== 'SCTP' || sctp);
}

/**
 * Servers for the flows that will be sent (default: flowsHere; only their
 * protocols are served, so a kernel without SCTP can run the rest):
 * endpoints on their ports; the node and the world on every flow port (so a
 * packet kpng leaves alone is answered, from the address it was sent to).
 * Not on a healthCheckNodePort: kpng may serve it.
 */
export async function serveScenario(lab: Lab, s: Scenario, flows: Flow[] = flowsHere(s)): Promise<void> {
  const hc = new Set(s.services.map((x) => x.spec?.healthCheckNodePort).filter(Boolean));
  const protocols = new Set<string>(flows.map((f) => f.protocol));
  const ports = (p: string) => [...new Set(flows.filter((f) => f.protocol === p).map((f) => f.destPort))];
  const flowPorts = { tcp: ports('TCP'), udp: ports('UDP'), sctp: ports('SCTP') };
  type Ports = { tcp: Set<number>; udp: Set<number>; sctp: Set<number> };
  const none = (): Ports => ({ tcp: new Set(), udp: new Set(), sctp: new Set() });
  const byIP = new Map<string, Ports>();
  for (const sl of s.endpointSlices) {
    for (const e of sl.endpoints ?? []) {
      for (const a of e.addresses ?? []) {
        const ip = canonicalIP(a)!;
        const m = byIP.get(ip) ?? none();
        byIP.set(ip, m);
        for (const p of sl.ports ?? []) {
          const proto: string = p.protocol ?? 'TCP';
          if (protocols.has(proto)) m[proto.toLowerCase() as keyof Ports].add(p.port);
        }
      }
    }
  }
  const plus = (m: Ports, skip = new Set<number>()) => {
    const list = (k: keyof Ports) => [...new Set([...m[k], ...flowPorts[k]])].filter((p) => !skip.has(p));
    return { tcp: list('tcp'), udp: list('udp'), sctp: list('sctp') };
  };
  const jobs: Promise<void>[] = [];
  const nodeExtra = none();
  for (const [ip, m] of byIP) {
    const owner = lab.ownerOf(ip);
    if (owner === lab.nodeName) {
      for (const k of ['tcp', 'udp', 'sctp'] as const) m[k].forEach((p) => nodeExtra[k].add(p));
      continue;
    }
    jobs.push(lab.serve(owner, plus(m)));
  }
  for (const ip of labSpecFor(s).pods!.flatMap((p) => p.ips)) if (!byIP.has(ip)) jobs.push(lab.serve(lab.ownerOf(ip), plus(none())));
  // the world answers UDP and SCTP on the addresses they were sent to
  const worldHosts = [...new Set(flows.filter((f) => f.protocol !== 'TCP').map((f) => canonicalIP(f.destIP)!))];
  jobs.push(lab.serve(lab.nodeName, plus(nodeExtra, hc)), lab.serve('world', { ...plus(none()), udpHosts: worldHosts }));
  await Promise.all(jobs);
}

/** The Service a flow is addressed to (by ClusterIP/externalIP/LB IP and port, or NodePort). */
function serviceOf(s: Scenario, f: Flow): Obj | undefined {
  const dst = canonicalIP(f.destIP);
  return s.services.find((svc) => {
    const sp = svc.spec ?? {};
    const ips = [...(sp.clusterIPs ?? [sp.clusterIP]), ...(sp.externalIPs ?? []), ...(svc.status?.loadBalancer?.ingress ?? []).map((i: Obj) => i.ip)]
      .filter(Boolean)
      .map((x: string) => canonicalIP(x));
    return (sp.ports ?? []).some((p: Obj) => (ips.includes(dst) && p.port === f.destPort) || p.nodePort === f.destPort);
  });
}

export function parseEndpoints(output: string): string[] {
  return output
    .split(',')
    .map((x) => x.trim())
    .filter(Boolean);
}

export interface FlowResult {
  problems: string[];
  outcomes: Outcome[];
}

/**
 * Sends a flow's packets for real and compares with the expectation:
 * endpoints (as a set; with several, a bounded number of connections, all
 * answered by one of them, more than one seen unless the Service has ClientIP
 * affinity), REJECT, DROP or "", and masq (the endpoint saw a node address
 * instead of the client's).
 */
export async function checkFlow(lab: Lab, s: Scenario, f: Flow, timeoutMs = 1500, opts: { socketLB?: boolean } = {}): Promise<FlowResult> {
  const problems: string[] = [];
  const client = canonicalIP(f.sourceIP)!;
  // translated at the socket (to-ebpf): the client connects to the endpoint itself, so nothing is masqueraded
  if (opts.socketLB && socketTranslated(lab, s, f)) f = { ...f, masq: false };
  const expectEndpoints = !['', 'DROP', 'REJECT', 'ACCEPT'].includes(f.output);
  const want = expectEndpoints ? new Set(parseEndpoints(f.output)) : undefined;
  const affinity = serviceOf(s, f)?.spec?.sessionAffinity === 'ClientIP';
  const count = !want ? 1 : want.size === 1 ? 3 : Math.min(40, Math.max(16, 10 * want.size));
  const protocol = f.protocol;
  const outcomes = count === 1 ? [await lab.connect({ from: client, to: f.destIP, port: f.destPort, protocol, timeoutMs })] : await lab.burst({ from: client, to: f.destIP, port: f.destPort, protocol, timeoutMs, count });
  const verdicts = outcomes.map((o) => verdict(o, f.destIP, f.destPort));
  const show = () => `\n  observed: ${[...spread(outcomes)].map(([k, n]) => `${k || '""'}×${n}`).join(', ')}\n  first: ${describeOutcome(outcomes[0])}`;

  if (want) {
    const bad = verdicts.filter((v) => !want.has(v));
    if (bad.length) problems.push(`expected only ${[...want].join(', ')}; got ${[...new Set(bad)].map((b) => b || '"" (not DNATed)').join(', ')}${show()}`);
    const seen = new Set(verdicts.filter((v) => want.has(v)));
    if (want.size > 1 && !affinity && seen.size < 2 && !bad.length) problems.push(`expected the connections to spread over ${[...want].join(', ')}; all ${count} went to ${[...seen].join(', ')}`);
  } else {
    const expected = f.output === '' ? '' : f.output;
    if (verdicts.some((v) => v !== expected)) problems.push(`expected ${expected === '' ? '"" (not DNATed: answered by the destination itself)' : expected}; got ${verdicts[0] || '"" (not DNATed)'}${show()}`);
  }
  for (const o of outcomes) {
    if (o.kind !== 'answered') continue;
    const saw = seenSource(o)!;
    if (f.masq && (saw === client || !lab.isNodeAddress(saw))) {
      problems.push(`expected masquerade (the endpoint sees a node address); ${o.by} saw ${saw}${saw === client ? ' (the client itself)' : ''}`);
      break;
    }
    if (!f.masq && saw !== client) {
      problems.push(`expected no masquerade; ${o.by} saw ${saw} instead of the client ${client}${lab.isNodeAddress(saw) ? ' (a node address: masqueraded)' : ''}`);
      break;
    }
  }
  return { problems, outcomes };
}

/** Puts the scenario's pod agents (those of the lab's pods) in cg, so to-ebpf's programs on it see their sockets. */
export function placePodAgents(lab: Lab, s: Scenario, cg: LabCgroup): void {
  for (const p of labSpecFor(s).pods ?? []) {
    const pid = lab.namespaces.length && p.ips.some((ip) => lab.ownerOf(ip) === p.name) ? lab.agent(p.name).pid : undefined;
    if (pid) cg.place(pid);
  }
}

/**
 * Whether to-ebpf translates this flow at the client's socket: sent by a pod
 * (its agent is in the programs' cgroup), to a Service address eBPF serves,
 * TCP or UDP. LB IPs with source ranges are left to nftables.
 */
export function socketTranslated(lab: Lab, s: Scenario, f: Flow): boolean {
  const owner = lab.ownerOf(canonicalIP(f.sourceIP)!);
  if (owner === lab.nodeName || owner === 'world' || f.protocol === 'SCTP') return false;
  const svc = serviceOf(s, f);
  if (!svc) return false;
  const dst = canonicalIP(f.destIP);
  const lbIPs = (svc.status?.loadBalancer?.ingress ?? []).map((i: Obj) => canonicalIP(i.ip));
  return !(lbIPs.includes(dst) && (svc.spec?.loadBalancerSourceRanges ?? []).length > 0);
}

export function flowTitle(f: Flow, i: number): string {
  return `#${i} ${f.name} [${f.protocol} ${hostPort(f.sourceIP, 0).replace(/:0$/, '')} -> ${hostPort(f.destIP, f.destPort)}] => ${f.output === '' ? '""' : f.output}${f.masq ? ' (masq)' : ''}`;
}

/** `kpng trace`'s request for a flow (a TCP/UDP/SCTP packet from the flow's source). */
export function traceRequestOf(f: Flow): TraceRequest {
  return { src: f.sourceIP, dst: f.destIP, dport: f.destPort, proto: f.protocol.toLowerCase() as 'tcp' | 'udp' | 'sctp' };
}

/** `kpng trace` over the rules in the lab node's kernel, run in its namespace. */
export function traceInLab(lab: Lab, f: Flow): Promise<TraceResult> {
  return trace(traceRequestOf(f), (argv) => lab.exec(lab.nodeName, argv));
}

/**
 * Does the trace predict what the real packets did? The verdict (DNAT,
 * REJECT, DROP, untouched), the endpoint set (every endpoint the trace names
 * was reached, and no other), and masquerading per endpoint.
 */
export function compareTrace(f: Flow, t: TraceResult, outcomes: Outcome[], opts: { affinity?: boolean } = {}): string[] {
  const problems: string[] = [];
  const client = canonicalIP(f.sourceIP)!;
  const seen = outcomes.map((o) => verdict(o, f.destIP, f.destPort));
  const kinds = new Set(seen.map((v) => (v === '' ? 'accept' : v === 'REJECT' ? 'reject' : v === 'DROP' ? 'drop' : /:\d+$/.test(v) ? 'dnat' : v)));
  const shown = `trace: ${t.verdict} ${t.endpoints.join(', ')}${t.masquerade ? ' (masquerade)' : ''}; real: ${[...new Set(seen)].map((v) => v || '""').join(', ')}`;
  if (kinds.size !== 1 || !kinds.has(t.verdict)) problems.push(`verdict differs: ${shown}`);
  if (t.verdict === 'dnat') {
    const real = new Set(seen.filter((v) => /:\d+$/.test(v)));
    const predicted = new Set(t.endpoints);
    // with ClientIP affinity a client sticks to one of the endpoints the trace names
    if ([...real].some((e) => !predicted.has(e)) || (!opts.affinity && [...predicted].some((e) => !real.has(e)))) problems.push(`endpoints differ: ${shown}`);
  }
  for (const o of outcomes) {
    if (o.kind !== 'answered') continue;
    const masq = seenSource(o) !== client;
    const e = verdict(o, f.destIP, f.destPort);
    const predicted = t.verdict === 'dnat' ? t.choices.find((c) => c.endpoint === e)?.masquerade : t.masquerade;
    if (predicted !== undefined && predicted !== masq) {
      problems.push(`masquerade differs for ${e || 'the destination'}: trace ${predicted}, real ${masq} (the endpoint saw ${seenSource(o)})`);
      break;
    }
  }
  if (t.unknown.length) problems.push(`unknown rules: ${t.unknown.join('; ')}`);
  if (problems.length) problems.push(`path:\n${t.path.map((s) => `  ${s.where}: ${s.rule}${s.why ? ` -> ${s.why}` : ''}`).join('\n')}`);
  return problems;
}
