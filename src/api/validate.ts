// Checks of model values that arrive already encoded, from another kpng (the
// `api` and `local` sources): the file and kube sources check Kubernetes
// objects as they convert them (src/sources/objects.ts); a brain's messages
// are checked here before anything uses them. Each check names the first
// field that is wrong ("IPs.ClusterIPs.V4[0]: ..."), or returns undefined.
import type { EndpointInfo, Node as GlobalNode } from './gen/api/globalv1/api_pb.js';
import { LocalSet, Protocol, type Endpoint, type IPSet, type LocalNode, type PortMapping, type Service, type ServiceCIDR } from './model.js';
import { canonicalIP, ipFamily, parseCIDR } from './ip.js';

const DNS_LABEL = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;
const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const PROTOCOLS = new Set([Protocol.TCP, Protocol.UDP, Protocol.SCTP]);

const quote = (s: string) => JSON.stringify(s.length > 80 ? `${s.slice(0, 80)}...` : s);

function label(v: string, field: string, optional = false): string | undefined {
  if (optional && v === '') return undefined;
  return DNS_LABEL.test(v) ? undefined : `${field}: ${quote(v)} is not a DNS label`;
}

function subdomain(v: string, field: string): string | undefined {
  return v.length <= 253 && DNS_SUBDOMAIN.test(v) ? undefined : `${field}: ${quote(v)} is not a DNS subdomain`;
}

/** an IP in kpng's canonical form (what every source writes), of the family its list says */
function ip(v: string, field: string, family?: 4 | 6): string | undefined {
  if (canonicalIP(v) !== v) return `${field}: ${quote(v)} is not an IP address in canonical form`;
  if (family && ipFamily(v) !== family) return `${field}: ${v} is not an IPv${family} address`;
  return undefined;
}

function ipSet(s: IPSet | undefined, field: string): string | undefined {
  if (!s) return undefined;
  for (const [i, v] of s.V4.entries()) {
    const p = ip(v, `${field}.V4[${i}]`, 4);
    if (p) return p;
  }
  for (const [i, v] of s.V6.entries()) {
    const p = ip(v, `${field}.V6[${i}]`, 6);
    if (p) return p;
  }
  return undefined;
}

function port(v: number, field: string, min = 1): string | undefined {
  return Number.isInteger(v) && v >= min && v <= 65535 ? undefined : `${field}: ${v} is out of range (${min}-65535)`;
}

function protocol(p: Protocol, field: string): string | undefined {
  return PROTOCOLS.has(p) ? undefined : `${field}: unknown protocol ${p}`;
}

function portMapping(m: PortMapping, field: string): string | undefined {
  return (
    label(m.Name, `${field}.Name`, true) ??
    protocol(m.Protocol, `${field}.Protocol`) ??
    port(m.Port, `${field}.Port`) ??
    port(m.NodePort, `${field}.NodePort`, 0) ??
    (m.TargetPortName ? undefined : port(m.TargetPort, `${field}.TargetPort`))
  );
}

export function serviceProblem(s: Service): string | undefined {
  const first = label(s.Namespace, 'Namespace') ?? label(s.Name, 'Name') ?? ipSet(s.IPs?.ClusterIPs, 'IPs.ClusterIPs') ?? ipSet(s.IPs?.ExternalIPs, 'IPs.ExternalIPs') ?? ipSet(s.IPs?.LoadBalancerIPs, 'IPs.LoadBalancerIPs');
  if (first) return first;
  for (const [i, m] of s.Ports.entries()) {
    const p = portMapping(m, `Ports[${i}]`);
    if (p) return p;
  }
  for (const [i, f] of s.IPFilters.entries()) {
    for (const [j, r] of f.SourceRanges.entries()) if (!parseCIDR(r)) return `IPFilters[${i}].SourceRanges[${j}]: ${quote(r)} is not a CIDR`;
  }
  return port(s.HealthCheckNodePort, 'HealthCheckNodePort', 0);
}

export function endpointProblem(e: Endpoint): string | undefined {
  const first = ipSet(e.IPs, 'IPs');
  if (first) return first;
  for (const [i, o] of e.PortOverrides.entries()) {
    const p = label(o.Name, `PortOverrides[${i}].Name`, true) ?? port(o.Port, `PortOverrides[${i}].Port`);
    if (p) return p;
  }
  return undefined;
}

export function endpointInfoProblem(e: EndpointInfo): string | undefined {
  return label(e.Namespace, 'Namespace') ?? label(e.ServiceName, 'ServiceName') ?? (e.Endpoint ? endpointProblem(e.Endpoint) : 'Endpoint: missing');
}

export function nodeProblem(n: LocalNode | GlobalNode): string | undefined {
  const first = subdomain(n.Name, 'Name') ?? ipSet(n.IPs, 'IPs');
  if (first) return first;
  for (const [i, c] of n.PodCIDRs.entries()) if (!parseCIDR(c)) return `PodCIDRs[${i}]: ${quote(c)} is not a CIDR`;
  return undefined;
}

export function serviceCIDRProblem(c: ServiceCIDR): string | undefined {
  for (const [i, x] of c.CIDRs.entries()) if (!parseCIDR(x)) return `CIDRs[${i}]: ${quote(x)} is not a CIDR`;
  return undefined;
}

// --- paths: what names an object on the wire, checked before its value is looked at

const setName = (set: LocalSet) => LocalSet[set] ?? `set ${set}`;

/**
 * The path of an op of /localv1.Sets/Watch: a Service "ns/name", an endpoint
 * "ns/name/key", the node and a ServiceCIDR "name".
 */
export function localPathProblem(set: LocalSet, path: string): string | undefined {
  const parts = path.split('/');
  const shape = (want: string, n: number) => (parts.length === n && parts.every((p) => p !== '') ? undefined : `path: not ${want}`);
  switch (set) {
    case LocalSet.ServicesSet:
      return shape('ns/name', 2) ?? label(parts[0], 'path (namespace)') ?? label(parts[1], 'path (name)');
    case LocalSet.EndpointsSet:
      return shape('ns/name/key', 3) ?? label(parts[0], 'path (namespace)') ?? label(parts[1], 'path (service name)');
    case LocalSet.NodesSet:
    case LocalSet.ServiceCIDRsSet:
      return shape('a name', 1) ?? subdomain(path, 'path (name)');
    default:
      return `${setName(set)} is not a set of the node-local stream`;
  }
}

/** A path of /globalv1.Sets/Watch, "Namespace|Name|Source|Key", split. */
export interface GlobalPath {
  readonly namespace: string;
  readonly name: string;
  readonly source: string;
  readonly key: string;
}

/**
 * The path of an op of /globalv1.Sets/Watch (kpng's KV paths): a node and a
 * ServiceCIDR "|name||", a Service "ns|name||", an endpoint "ns|svc|slice|key"
 * (by service) or "ns||slice|key" (by slice).
 */
export function globalPath(set: LocalSet, path: string): GlobalPath | string {
  const parts = path.split('|');
  if (parts.length !== 4) return 'path: not ns|name|source|key';
  const [namespace, name, source, key] = parts;
  const p = { namespace, name, source, key };
  const empty = (v: string, what: string) => (v === '' ? undefined : `path (${what}): ${quote(v)} should be empty`);
  let problem: string | undefined;
  switch (set) {
    case LocalSet.GlobalNodeInfos:
    case LocalSet.GlobalServiceCIDRInfos:
      problem = empty(namespace, 'namespace') ?? subdomain(name, 'path (name)') ?? empty(source, 'source') ?? empty(key, 'key');
      break;
    case LocalSet.GlobalServiceInfos:
      problem = label(namespace, 'path (namespace)') ?? label(name, 'path (name)') ?? empty(source, 'source') ?? empty(key, 'key');
      break;
    case LocalSet.GlobalEndpointInfos:
      problem = label(namespace, 'path (namespace)') ?? label(name, 'path (service name)', true) ?? subdomain(source, 'path (slice name)') ?? (key === '' ? 'path (key): empty' : undefined);
      break;
    default:
      problem = `${setName(set)} is not a set of the global stream`;
  }
  return problem ?? p;
}
