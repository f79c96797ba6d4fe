// kpng get's view of a cluster state: Services with their ports and traffic
// policies and, on a node, the endpoints each kind of traffic uses with the
// reason each is in or out (src/localstate: portCandidates, categorize,
// explainCategorized: what the node-local state, hence the dataplane, uses);
// then kubectl-style tables, JSON or YAML.
import { yaml } from '../runtime/lazy.js';
import { ipSetAll, ipSetOf, protocolName, type Service, type LocalNode } from '../api/model.js';
import { portCandidates, trafficPolicies } from '../localstate/service-view.js';
import { explainCategorized, type Use } from '../localstate/topology.js';
import type { ClusterState } from './fetch.js';

export interface EndpointState {
  endpoint: string;
  /** the Service port it serves (name, or the port number when unnamed) */
  port: string;
  node: string;
  zone: string;
  pod: string;
  ready: boolean;
  serving: boolean;
  terminating: boolean;
  hints?: { zones: string[]; nodes: string[] };
  /** on a node: used for cluster IP traffic, and why */
  internal?: Use;
  /** on a node, for a Service reachable from outside: used for NodePort, external and LB IP traffic, and why */
  external?: Use;
}

export interface ServiceState {
  namespace: string;
  name: string;
  type: string;
  clusterIPs: string[];
  externalIPs: string[];
  loadBalancerIPs: string[];
  ports: { name: string; protocol: string; port: number; nodePort?: number; targetPort?: number | string }[];
  internalTrafficPolicy: 'Cluster' | 'Local';
  externalTrafficPolicy?: 'Cluster' | 'Local';
  sessionAffinity: 'None' | 'ClientIP';
  trafficDistribution?: string;
  healthCheckNodePort?: number;
  endpoints: EndpointState[];
}

export interface NodeState {
  name: string;
  zone: string;
  ips: string[];
  podCIDRs: string[];
  deleting: boolean;
  labels: Record<string, string>;
}

/** The Services (those kpng proxies: not headless, not ExternalName), explained for node when given. */
export function servicesOf(state: ClusterState, node: LocalNode | undefined, filter: { namespace?: string; name?: string } = {}): ServiceState[] {
  const out: ServiceState[] = [];
  const ctx = node ? { name: node.Name, zone: node.Zone } : { name: '', zone: '' };
  const zoneOf = new Map(state.nodes.map((n) => [n.Name, n.Topology?.Zone ?? '']));
  for (const svc of [...state.services].sort((a, b) => (a.Namespace + '/' + a.Name).localeCompare(b.Namespace + '/' + b.Name))) {
    if (svc.Type === 'ExternalName' || svc.IPs?.Headless) continue;
    if (filter.namespace && svc.Namespace !== filter.namespace) continue;
    if (filter.name && svc.Name !== filter.name) continue;
    const pol = trafficPolicies(svc);
    const slices = state.slices.get(`${svc.Namespace}/${svc.Name}`) ?? [];
    const endpoints: EndpointState[] = [];
    for (const port of svc.Ports) {
      for (const family of [4, 6] as const) {
        if (!ipSetOf(svc.IPs?.ClusterIPs, family).length) continue;
        const cands = portCandidates(slices, port, family, ctx);
        const uses = node ? explainCategorized(cands, ctx, pol.itpLocal, pol.etpLocal) : [];
        cands.forEach((c, i) => {
          const h = c.info.Hints;
          const nodeName = c.info.Topology?.Node ?? '';
          endpoints.push({
            endpoint: family === 6 ? `[${c.ip}]:${c.port}` : `${c.ip}:${c.port}`,
            port: port.Name || String(port.Port),
            node: nodeName,
            zone: c.info.Topology?.Zone || zoneOf.get(nodeName) || '',
            pod: c.info.PodName,
            ready: c.info.Conditions?.Ready ?? true,
            serving: c.info.Conditions?.Serving ?? true,
            terminating: c.info.Conditions?.Terminating ?? false,
            ...(h && (h.Zones.length || h.Nodes.length) ? { hints: { zones: [...h.Zones], nodes: [...h.Nodes] } } : {}),
            ...(node ? { internal: uses[i]!.internal, ...(pol.externallyAccessible ? { external: uses[i]!.external } : {}) } : {}),
          });
        });
      }
    }
    // by service port, then address
    endpoints.sort((a, b) => (a.port === b.port ? a.endpoint.localeCompare(b.endpoint, 'en', { numeric: true }) : 0));
    out.push({
      ...serviceHeader(svc, pol),
      endpoints,
    });
  }
  return out;
}

/**
 * The same from a kpng local node agent's node-local state: only the
 * endpoints this node was sent, with the scopes the brain chose; why the
 * others were left out is known to the brain (kpng get --api BRAIN --node).
 */
export function servicesOfLocal(state: ClusterState, filter: { namespace?: string; name?: string } = {}): ServiceState[] {
  const local = state.local!;
  const out: ServiceState[] = [];
  for (const svc of [...local.services].sort((a, b) => (a.Namespace + '/' + a.Name).localeCompare(b.Namespace + '/' + b.Name))) {
    if (filter.namespace && svc.Namespace !== filter.namespace) continue;
    if (filter.name && svc.Name !== filter.name) continue;
    const pol = trafficPolicies(svc);
    const endpoints: EndpointState[] = [];
    for (const ep of local.endpoints.get(`${svc.Namespace}/${svc.Name}`) ?? []) {
      for (const port of svc.Ports) {
        const target = ep.PortOverrides.find((o) => o.Name === port.Name && o.Protocol === port.Protocol);
        if (!target) continue;
        const use = (scope: boolean, localPolicy: boolean): Use => {
          if (scope) return { used: true, why: ep.Terminating ? 'serving and terminating: the fallback (no ready endpoint)' : localPolicy ? 'ready, on this node (Local policy)' : svc.TrafficDistribution ? 'ready (topology: as the brain chose)' : 'ready' };
          return { used: false, why: localPolicy && !ep.Local ? 'not on this node (Local policy)' : 'not chosen for this traffic (ask the brain why)' };
        };
        for (const ip of ipSetAll(ep.IPs)) {
          endpoints.push({
            endpoint: ip.includes(':') ? `[${ip}]:${target.Port}` : `${ip}:${target.Port}`,
            port: port.Name || String(port.Port),
            node: ep.NodeName,
            zone: '',
            pod: '',
            ready: !ep.Terminating,
            serving: true,
            terminating: ep.Terminating,
            internal: use(!!ep.Scopes?.Internal, pol.itpLocal),
            ...(pol.externallyAccessible ? { external: use(!!ep.Scopes?.External, pol.etpLocal) } : {}),
          });
        }
      }
    }
    endpoints.sort((a, b) => (a.port === b.port ? a.endpoint.localeCompare(b.endpoint, 'en', { numeric: true }) : 0));
    out.push({ ...serviceHeader(svc, pol), endpoints });
  }
  return out;
}

function serviceHeader(svc: Service, pol: ReturnType<typeof trafficPolicies>): Omit<ServiceState, 'endpoints'> {
  return {
    namespace: svc.Namespace,
    name: svc.Name,
    type: svc.Type || 'ClusterIP',
    clusterIPs: ipSetAll(svc.IPs?.ClusterIPs),
    externalIPs: ipSetAll(svc.IPs?.ExternalIPs),
    loadBalancerIPs: ipSetAll(svc.IPs?.LoadBalancerIPs),
    ports: svc.Ports.map((p) => ({
      name: p.Name,
      protocol: protocolName(p.Protocol),
      port: p.Port,
      ...(p.NodePort ? { nodePort: p.NodePort } : {}),
      ...(p.TargetPortName ? { targetPort: p.TargetPortName } : p.TargetPort ? { targetPort: p.TargetPort } : {}),
    })),
    internalTrafficPolicy: pol.itpLocal ? 'Local' : 'Cluster',
    ...(pol.externallyAccessible ? { externalTrafficPolicy: svc.ExternalTrafficToLocal ? ('Local' as const) : ('Cluster' as const) } : {}),
    sessionAffinity: svc.SessionAffinity.case === 'ClientIP' ? 'ClientIP' : 'None',
    ...(svc.TrafficDistribution ? { trafficDistribution: svc.TrafficDistribution } : {}),
    ...(svc.HealthCheckNodePort ? { healthCheckNodePort: svc.HealthCheckNodePort } : {}),
  };
}

export function nodesOf(state: ClusterState, name?: string): NodeState[] {
  return state.nodes
    .filter((n) => !name || n.Name === name)
    .sort((a, b) => a.Name.localeCompare(b.Name))
    .map((n) => ({ name: n.Name, zone: n.Topology?.Zone ?? '', ips: ipSetAll(n.IPs), podCIDRs: [...n.PodCIDRs], deleting: n.Deleting, labels: { ...n.Labels } }));
}

// --- output

export type Format = 'table' | 'wide' | 'json' | 'yaml';

export interface Styler {
  header(s: string): string;
}

export const plain: Styler = { header: (s) => s };
/** kubectl prints plain text; on a terminal kpng makes the header bold */
export const terminal: Styler = { header: (s) => `\x1b[1m${s}\x1b[0m` };

/** Columns padded to their widest cell, three spaces apart, as kubectl's printer. */
export function table(head: string[], rows: string[][], style: Styler = plain): string {
  const w = head.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (cells: string[]) => cells.map((c, i) => (i === cells.length - 1 ? c : c.padEnd(w[i]!))).join('   ').trimEnd();
  return [style.header(line(head)), ...rows.map(line)].join('\n');
}

const none = (xs: readonly string[]) => (xs.length ? xs.join(',') : '<none>');

function portsCell(s: ServiceState): string {
  return s.ports.map((p) => `${p.port}${p.nodePort ? `:${p.nodePort}` : ''}/${p.protocol}`).join(',') || '<none>';
}

const useCell = (u?: Use) => (!u ? '-' : u.used ? 'yes' : 'no');

function usedCount(s: ServiceState, scope: 'internal' | 'external'): string {
  if (scope === 'external' && !s.externalTrafficPolicy) return '-';
  const list = s.endpoints.filter((e) => e[scope]);
  if (!list.length && !s.endpoints.length) return '0';
  return `${new Set(list.filter((e) => e[scope]!.used).map((e) => e.endpoint)).size}/${new Set(s.endpoints.map((e) => e.endpoint)).size}`;
}

function condCell(e: EndpointState): string {
  const c = [e.ready ? 'ready' : 'not-ready', ...(e.serving ? [] : ['not-serving']), ...(e.terminating ? ['terminating'] : [])];
  return c.join(',');
}

function whyCell(e: EndpointState): string {
  if (!e.internal) return '';
  if (!e.external || e.external.why === e.internal.why) return e.internal.why;
  return `internal: ${e.internal.why}; external: ${e.external.why}`;
}

export function endpointsTable(services: ServiceState[], style: Styler, withService: boolean): string {
  const explained = services.some((s) => s.endpoints.some((e) => e.internal));
  const head = [...(withService ? ['NAMESPACE', 'SERVICE'] : []), 'ENDPOINT', 'PORT', 'NODE', 'ZONE', 'CONDITIONS', 'HINTS', ...(explained ? ['INTERNAL', 'EXTERNAL', 'WHY'] : [])];
  const rows: string[][] = [];
  for (const s of services) {
    for (const e of s.endpoints) {
      const hints = e.hints ? [...e.hints.zones.map((z) => `zone=${z}`), ...e.hints.nodes.map((n) => `node=${n}`)].join(',') : '';
      rows.push([...(withService ? [s.namespace, s.name] : []), e.endpoint, e.port, e.node || '<unknown>', e.zone || '', condCell(e), hints || '<none>', ...(explained ? [useCell(e.internal), useCell(e.external), whyCell(e)] : [])]);
    }
  }
  return table(head, rows, style);
}

export function servicesTable(services: ServiceState[], node: LocalNode | undefined, style: Styler, wide: boolean): string {
  const head = ['NAMESPACE', 'NAME', 'TYPE', 'CLUSTER-IP', 'EXTERNAL-IP', 'PORT(S)', 'TRAFFIC-POLICY', ...(node ? ['INTERNAL', 'EXTERNAL'] : ['ENDPOINTS']), ...(wide ? ['AFFINITY', 'DISTRIBUTION'] : [])];
  const rows = services.map((s) => [
    s.namespace,
    s.name,
    s.type,
    none(s.clusterIPs),
    none([...s.externalIPs, ...s.loadBalancerIPs]),
    portsCell(s),
    `${s.internalTrafficPolicy}/${s.externalTrafficPolicy ?? '-'}`,
    ...(node ? [usedCount(s, 'internal'), usedCount(s, 'external')] : [String(new Set(s.endpoints.map((e) => e.endpoint)).size)]),
    ...(wide ? [s.sessionAffinity, s.trafficDistribution ?? '<none>'] : []),
  ]);
  return table(head, rows, style);
}

export function nodesTable(nodes: NodeState[], self: string | undefined, style: Styler, wide: boolean): string {
  const head = ['NAME', 'ZONE', 'INTERNAL-IPS', 'POD-CIDRS', 'STATUS', ...(wide ? ['LABELS'] : [])];
  const rows = nodes.map((n) => [
    n.name + (n.name === self ? ' (this node)' : ''),
    n.zone || '<none>',
    none(n.ips),
    none(n.podCIDRs),
    n.deleting ? 'Deleting' : 'Ready',
    ...(wide ? [Object.entries(n.labels).map(([k, v]) => `${k}=${v}`).join(',') || '<none>'] : []),
  ]);
  return table(head, rows, style);
}

export function structured(kind: string, items: unknown[], node: LocalNode | undefined, format: 'json' | 'yaml'): string {
  const doc = { kind, ...(node ? { node: { name: node.Name, zone: node.Zone } } : {}), items };
  return format === 'json' ? JSON.stringify(doc, null, 2) : yaml().stringify(doc);
}
