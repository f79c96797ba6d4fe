// A node's services as the dataplane sees them: one entry per service port
// and IP family, with the endpoints each kind of traffic uses. Shared by the
// backends so they all read the node-local state the same way.
import { ipFamily, parseCIDR, formatCIDR, cidrContains, type Family } from '../../api/ip.js';
import { Protocol, endpointPort, ipSetOf, type Endpoint, type PortMapping, type Service } from '../../api/model.js';
import { sortSmall } from '../../runtime/sort.js';
import { flat } from '../../runtime/memory.js';

export interface Target {
  readonly ip: string;
  readonly port: number;
  readonly local: boolean;
  /** the endpoint's node, '' when unknown */
  readonly nodeName: string;
  readonly terminating: boolean;
}

export interface ServicePort {
  /** ns/name */
  readonly service: string;
  readonly namespace: string;
  readonly name: string;
  readonly port: PortMapping;
  /** ns/name:portName (kube-proxy's ServicePortName) */
  readonly portName: string;
  readonly protocol: 'tcp' | 'udp' | 'sctp';
  readonly family: Family;
  readonly clusterIP: string;
  readonly externalIPs: readonly string[];
  /** ipMode VIP only */
  readonly loadBalancerIPs: readonly string[];
  /** normalized (nested ranges removed), this family only */
  readonly sourceRanges: readonly string[];
  readonly nodePort: number;
  readonly healthCheckNodePort: number;
  readonly internalLocal: boolean;
  readonly externalLocal: boolean;
  /** ClientIP affinity timeout in seconds, 0 without affinity */
  readonly affinitySeconds: number;
  /** endpoints for cluster-IP traffic (internalTrafficPolicy applied) */
  readonly internal: readonly Target[];
  /** endpoints for external traffic (externalTrafficPolicy applied) */
  readonly external: readonly Target[];
  /** the cluster-wide set (pod and node short-circuit with eTP=Local) */
  readonly cluster: readonly Target[];
  /** a usable endpoint exists somewhere: DROP, not REJECT, when this node has none */
  readonly hasEndpoints: boolean;
}

const NO_RANGES: readonly string[] = Object.freeze([]);

const byAddr = (a: Target, b: Target) => (a.ip < b.ip ? -1 : a.ip > b.ip ? 1 : a.port - b.port);

const PROTO: Record<number, 'tcp' | 'udp' | 'sctp' | undefined> = { [Protocol.TCP]: 'tcp', [Protocol.UDP]: 'udp', [Protocol.SCTP]: 'sctp' };

/** Service ports of one service in one family; none without a cluster IP of that family. */
export function servicePorts(svc: Service, endpoints: Iterable<Endpoint>, family: Family): ServicePort[] {
  const clusterIP = ipSetOf(svc.IPs?.ClusterIPs, family)[0];
  if (!clusterIP) return [];
  const eps = [...endpoints];
  const sourceRanges = svc.IPFilters[0]?.SourceRanges;
  // (most Services have none: no lists made for them)
  const ranges = sourceRanges?.length ? normalizeCIDRs(sourceRanges.filter((r) => ipFamily(r.split('/')[0]) === family)) : NO_RANGES;
  const out: ServicePort[] = [];
  for (const port of svc.Ports) {
    const protocol = PROTO[port.Protocol];
    if (!protocol) continue;
    const internal: Target[] = [];
    const external: Target[] = [];
    const cluster: Target[] = [];
    for (const ep of eps) {
      const target = endpointPort(ep, port);
      if (target === undefined) continue;
      for (const ip of ipSetOf(ep.IPs, family)) {
        const t: Target = { ip, port: target, local: ep.Local, nodeName: ep.NodeName, terminating: ep.Terminating };
        if (ep.Scopes?.Internal) internal.push(t);
        if (ep.Scopes?.External) external.push(t);
        if (ep.Scopes?.Cluster) cluster.push(t);
      }
    }
    out.push({
      service: `${svc.Namespace}/${svc.Name}`,
      namespace: svc.Namespace,
      name: svc.Name,
      port,
      portName: port.Name ? flat(svc.Namespace, '/', svc.Name, ':', port.Name) : flat(svc.Namespace, '/', svc.Name),
      protocol,
      family,
      clusterIP,
      externalIPs: ipSetOf(svc.IPs?.ExternalIPs, family),
      loadBalancerIPs: ipSetOf(svc.IPs?.LoadBalancerIPs, family),
      sourceRanges: ranges,
      nodePort: port.NodePort,
      healthCheckNodePort: svc.HealthCheckNodePort,
      internalLocal: svc.InternalTrafficToLocal,
      externalLocal: svc.ExternalTrafficToLocal,
      affinitySeconds: svc.SessionAffinity.case === 'ClientIP' ? svc.SessionAffinity.value.TimeoutSeconds || 10800 : 0,
      internal: sortSmall(internal, byAddr),
      external: sortSmall(external, byAddr),
      cluster: sortSmall(cluster, byAddr),
      hasEndpoints: family === 4 ? port.HasEndpointsV4 : port.HasEndpointsV6,
    });
  }
  return out;
}

/** Sorted, unique CIDRs with the ones inside another removed (interval sets refuse overlaps). */
export function normalizeCIDRs(list: readonly string[]): string[] {
  const parsed = list.map(parseCIDR).filter((c): c is NonNullable<typeof c> => !!c);
  parsed.sort((a, b) => a.prefix - b.prefix);
  const kept: typeof parsed = [];
  for (const c of parsed) if (!kept.some((k) => k.family === c.family && k.prefix <= c.prefix && cidrContains(k, c.ip))) kept.push(c);
  return kept.map(formatCIDR).sort();
}

/** True when an address of this family is one of the source ranges. */
export function rangesContain(ranges: readonly string[], ip: string): boolean {
  return ranges.some((r) => {
    const c = parseCIDR(r);
    return !!c && cidrContains(c, ip);
  });
}
