// Kubernetes objects (as the API server or kubectl prints them) to kpng's
// global model, keeping only what a proxy needs. Anything invalid throws an
// InvalidObject naming the field, so a source can skip that one object with a
// clear log line and keep the rest.
import { create } from '@bufbuild/protobuf';
import * as L from '../api/gen/api/localv1/api_pb.js';
import * as G from '../api/gen/api/globalv1/api_pb.js';
import { canonicalIP, parseCIDR, formatCIDR, ipFamily } from '../api/ip.js';
import { ipSetAdd, newIPSet, parseProtocol } from '../api/model.js';

export class InvalidObject extends Error {
  constructor(
    readonly field: string,
    readonly reason: string,
  ) {
    super(`${field}: ${reason}`);
  }
}

export type Converted =
  | { kind: 'Service'; namespace: string; name: string; service: L.Service }
  | { kind: 'EndpointSlice'; namespace: string; name: string; serviceName: string; endpoints: G.EndpointInfo[] }
  | { kind: 'Node'; name: string; node: G.Node }
  | { kind: 'ServiceCIDR'; name: string; cidr: L.ServiceCIDR }
  /** a valid object kpng does not use (say why, for debug logs) */
  | { kind: 'Ignored'; reason: string };

export const SERVICE_NAME_LABEL = 'kubernetes.io/service-name';
export const HEADLESS_LABEL = 'service.kubernetes.io/headless';
export const ZONE_LABEL = 'topology.kubernetes.io/zone';
const LEGACY_ZONE_LABEL = 'failure-domain.beta.kubernetes.io/zone';
const TO_BE_DELETED_TAINT = 'ToBeDeletedByClusterAutoscaler';
const NODE_LABELS = new Set(['kubernetes.io/hostname', ZONE_LABEL, 'topology.kubernetes.io/region', LEGACY_ZONE_LABEL]);

type Obj = Record<string, unknown>;

const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);

/** "Service ns/name" (or as much of it as the object has), for log lines. */
export function objectRef(o: unknown): string {
  if (!isObj(o)) return 'object';
  const kind = typeof o.kind === 'string' ? o.kind : 'object';
  const md = isObj(o.metadata) ? o.metadata : {};
  const name = typeof md.name === 'string' ? md.name : '<no name>';
  return typeof md.namespace === 'string' && md.namespace ? `${kind} ${md.namespace}/${name}` : `${kind} ${name}`;
}

// --- small typed readers: each names the field it failed on

function obj(v: unknown, field: string, required = false): Obj {
  if (v === undefined || v === null) {
    if (required) throw new InvalidObject(field, 'missing');
    return {};
  }
  if (!isObj(v)) throw new InvalidObject(field, `must be an object, not ${typeName(v)}`);
  return v;
}

function arr(v: unknown, field: string): unknown[] {
  if (v === undefined || v === null) return [];
  if (!Array.isArray(v)) throw new InvalidObject(field, `must be a list, not ${typeName(v)}`);
  return v;
}

function str(v: unknown, field: string, def = ''): string {
  if (v === undefined || v === null) return def;
  if (typeof v !== 'string') throw new InvalidObject(field, `must be a string, not ${typeName(v)}`);
  return v;
}

function bool(v: unknown, field: string): boolean | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'boolean') throw new InvalidObject(field, `must be true or false, not ${typeName(v)}`);
  return v;
}

function int(v: unknown, field: string, min: number, max: number): number | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'number' || !Number.isInteger(v)) throw new InvalidObject(field, `must be an integer, not ${JSON.stringify(v)}`);
  if (v < min || v > max) throw new InvalidObject(field, `${v} is out of range (${min}-${max})`);
  return v;
}

function ip(v: unknown, field: string): string {
  const s = str(v, field);
  const c = canonicalIP(s);
  if (!c) throw new InvalidObject(field, `${JSON.stringify(s)} is not an IP address`);
  return c;
}

/**
 * e, an InvalidObject naming a field of an item, renamed under the item's
 * own name (the item itself when its field is ''). Field names are made
 * only then: made for every field of every endpoint (about 15 strings),
 * they and the absent hints' lists would be a good part of a slice's conversion.
 */
function within(e: unknown, item: string): unknown {
  return e instanceof InvalidObject ? new InvalidObject(e.field ? `${item}.${e.field}` : item, e.reason) : e;
}

function typeName(v: unknown): string {
  return Array.isArray(v) ? 'a list' : v === null ? 'null' : typeof v;
}

// the API server's name rules (a file can hold anything; names end up in
// dataplane comments and log lines)
const DNS_LABEL = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;
const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;

function dnsLabel(v: string, field: string): string {
  if (!DNS_LABEL.test(v)) throw new InvalidObject(field, `${JSON.stringify(v.length > 80 ? v.slice(0, 80) + '...' : v)} is not a DNS label (at most 63 of a-z, 0-9 and "-")`);
  return v;
}

function dnsSubdomain(v: string, field: string): string {
  if (v.length > 253 || !DNS_SUBDOMAIN.test(v)) throw new InvalidObject(field, `${JSON.stringify(v.length > 80 ? v.slice(0, 80) + '...' : v)} is not a DNS subdomain (at most 253 of a-z, 0-9, "-" and ".")`);
  return v;
}

function meta(o: Obj, namespaced: boolean, nameRule: 'label' | 'subdomain' = 'subdomain'): { name: string; namespace: string; labels: Record<string, string>; md: Obj } {
  const md = obj(o.metadata, 'metadata', true);
  const name = str(md.name, 'metadata.name');
  if (!name) throw new InvalidObject('metadata.name', 'missing');
  (nameRule === 'label' ? dnsLabel : dnsSubdomain)(name, 'metadata.name');
  const namespace = namespaced ? str(md.namespace, 'metadata.namespace') || 'default' : '';
  if (namespaced) dnsLabel(namespace, 'metadata.namespace');
  const labelsObj = obj(md.labels, 'metadata.labels');
  const labels: Record<string, string> = {};
  for (const [k, v] of Object.entries(labelsObj)) labels[k] = typeof v === 'string' ? v : str(v, `metadata.labels[${k}]`);
  return { name, namespace, labels, md };
}

/** Converts one object (not a List). Throws InvalidObject. */
export function convertObject(o: unknown): Converted {
  if (!isObj(o)) throw new InvalidObject('(object)', `must be an object, not ${typeName(o)}`);
  const kind = str(o.kind, 'kind');
  switch (kind) {
    case 'Service': return convertService(o);
    case 'EndpointSlice': return convertSlice(o);
    case 'Node': return convertNode(o);
    case 'ServiceCIDR': return convertServiceCIDR(o);
    case '': throw new InvalidObject('kind', 'missing');
    default: return { kind: 'Ignored', reason: `kind ${kind} is not used by kpng` };
  }
}

const SERVICE_TYPES = new Set(['ClusterIP', 'NodePort', 'LoadBalancer', 'ExternalName']);

/** annotations a backend reads (to-ipvs: a scheduler per Service), kept with the Service's labels */
const KPNG_ANNOTATIONS = ['kpng.io/ipvs-scheduler', 'kpng.io/ipvs-scheduler-flags'];

export function convertService(o: Obj): Converted {
  const { name, namespace, labels, md } = meta(o, true, 'label');
  const spec = obj(o.spec, 'spec', true);
  const type = str(spec.type, 'spec.type', 'ClusterIP');
  if (!SERVICE_TYPES.has(type)) throw new InvalidObject('spec.type', `unknown type ${JSON.stringify(type)}`);

  // message literals, every field as create() sets it (test/core/objects-literal.test.ts):
  // protobuf-es's reflective create() is slow enough to count in a cold start's conversion
  const ips: L.ServiceIPs = { $typeName: 'localv1.ServiceIPs', ClusterIPs: newIPSet(), ExternalIPs: newIPSet(), Headless: false, LoadBalancerIPs: newIPSet(), ProxyLoadBalancerIPs: newIPSet() };
  const svc: L.Service = {
    $typeName: 'localv1.Service',
    Namespace: namespace,
    Name: name,
    Type: type,
    IPs: ips,
    Labels: {},
    Annotations: {},
    IPFilters: [],
    MapIP: false,
    Ports: [],
    ExternalTrafficToLocal: false,
    SessionAffinity: { case: undefined },
    InternalTrafficToLocal: false,
    HealthCheckNodePort: 0,
    TrafficDistribution: '',
  };
  // only the labels that change how kpng treats the service
  for (const k of Object.keys(labels).sort()) if (k.startsWith('service.kubernetes.io/')) svc.Labels[k] = labels[k];
  const annotations = obj(md.annotations, 'metadata.annotations');
  for (const k of KPNG_ANNOTATIONS) if (annotations[k] !== undefined) svc.Labels[k] = str(annotations[k], `metadata.annotations[${k}]`);

  const clusterIPs = arr(spec.clusterIPs, 'spec.clusterIPs');
  const list = clusterIPs.length ? clusterIPs.map((v, i) => [v, `spec.clusterIPs[${i}]`] as const) : [[spec.clusterIP, 'spec.clusterIP'] as const];
  for (const [v, f] of list) {
    const s = str(v, f);
    if (s === '') continue;
    if (s === 'None') ips.Headless = true;
    else ipSetAdd(ips.ClusterIPs!, ip(s, f));
  }
  arr(spec.externalIPs, 'spec.externalIPs').forEach((v, i) => ipSetAdd(ips.ExternalIPs!, ip(v, `spec.externalIPs[${i}]`)));

  const ranges = arr(spec.loadBalancerSourceRanges, 'spec.loadBalancerSourceRanges').map((v, i) => {
    const f = `spec.loadBalancerSourceRanges[${i}]`;
    const c = parseCIDR(str(v, f));
    if (!c) throw new InvalidObject(f, `${JSON.stringify(v)} is not a CIDR`);
    return formatCIDR(c);
  });
  if (ranges.length) svc.IPFilters.push({ $typeName: 'localv1.IPFilter', SourceRanges: ranges });

  const seenPorts = new Set<string>();
  arr(spec.ports, 'spec.ports').forEach((pv, i) => {
    try {
      const p = obj(pv, '', true);
      const portName = str(p.name, 'name');
      if (portName) dnsLabel(portName, 'name');
      const protocol = parseProtocol(str(p.protocol, 'protocol', 'TCP'));
      if (protocol === undefined) throw new InvalidObject('protocol', `unknown protocol ${JSON.stringify(p.protocol)}`);
      const port = int(p.port, 'port', 1, 65535);
      if (port === undefined) throw new InvalidObject('port', 'missing');
      const nodePort = int(p.nodePort, 'nodePort', 0, 65535) ?? 0;
      const pm: L.PortMapping = { $typeName: 'localv1.PortMapping', Name: portName, Protocol: protocol, Port: port, NodePort: nodePort, TargetPort: 0, TargetPortName: '', HasEndpointsV4: false, HasEndpointsV6: false };
      const tp = p.targetPort;
      if (typeof tp === 'string' && !/^\d+$/.test(tp)) {
        if (!tp) throw new InvalidObject('targetPort', 'empty');
        pm.TargetPortName = tp;
      } else {
        pm.TargetPort = int(typeof tp === 'string' ? Number(tp) : tp, 'targetPort', 1, 65535) ?? port;
      }
      const id = `${portName}/${protocol}`;
      if (seenPorts.has(id)) throw new InvalidObject('name', `duplicate port ${JSON.stringify(portName)}`);
      seenPorts.add(id);
      svc.Ports.push(pm);
    } catch (e) {
      throw within(e, `spec.ports[${i}]`);
    }
  });

  const etp = str(spec.externalTrafficPolicy, 'spec.externalTrafficPolicy', 'Cluster');
  if (!['Cluster', 'Local', 'Global'].includes(etp)) throw new InvalidObject('spec.externalTrafficPolicy', `unknown policy ${JSON.stringify(etp)}`);
  svc.ExternalTrafficToLocal = etp === 'Local';
  const itp = str(spec.internalTrafficPolicy, 'spec.internalTrafficPolicy', 'Cluster');
  if (!['Cluster', 'Local'].includes(itp)) throw new InvalidObject('spec.internalTrafficPolicy', `unknown policy ${JSON.stringify(itp)}`);
  svc.InternalTrafficToLocal = itp === 'Local';

  const affinity = str(spec.sessionAffinity, 'spec.sessionAffinity', 'None');
  if (affinity === 'ClientIP') {
    const cfg = obj(obj(spec.sessionAffinityConfig, 'spec.sessionAffinityConfig').clientIP, 'spec.sessionAffinityConfig.clientIP');
    const timeout = int(cfg.timeoutSeconds, 'spec.sessionAffinityConfig.clientIP.timeoutSeconds', 1, 86400) ?? 10800;
    svc.SessionAffinity = { case: 'ClientIP', value: { $typeName: 'localv1.ClientIPAffinity', TimeoutSeconds: timeout } };
  } else if (affinity !== 'None') {
    throw new InvalidObject('spec.sessionAffinity', `unknown affinity ${JSON.stringify(affinity)}`);
  }
  svc.HealthCheckNodePort = int(spec.healthCheckNodePort, 'spec.healthCheckNodePort', 0, 65535) ?? 0;
  svc.TrafficDistribution = str(spec.trafficDistribution, 'spec.trafficDistribution');

  const status = obj(o.status, 'status');
  const lb = obj(status.loadBalancer, 'status.loadBalancer');
  arr(lb.ingress, 'status.loadBalancer.ingress').forEach((iv, i) => {
    const f = `status.loadBalancer.ingress[${i}]`;
    const ing = obj(iv, f, true);
    if (ing.ip === undefined || ing.ip === null || ing.ip === '') return; // hostname-only ingress
    const addr = ip(ing.ip, `${f}.ip`);
    const mode = str(ing.ipMode, `${f}.ipMode`, 'VIP');
    if (mode === 'VIP') ipSetAdd(ips.LoadBalancerIPs!, addr);
    else if (mode === 'Proxy') ipSetAdd(ips.ProxyLoadBalancerIPs!, addr);
    else throw new InvalidObject(`${f}.ipMode`, `unknown ipMode ${JSON.stringify(mode)}`);
  });
  return { kind: 'Service', namespace, name, service: svc };
}

export function convertSlice(o: Obj): Converted {
  const { name, namespace, labels } = meta(o, true);
  const serviceName = labels[SERVICE_NAME_LABEL];
  if (!serviceName) return { kind: 'Ignored', reason: `no ${SERVICE_NAME_LABEL} label` };
  dnsLabel(serviceName, `metadata.labels[${SERVICE_NAME_LABEL}]`);
  if (HEADLESS_LABEL in labels) return { kind: 'Ignored', reason: 'headless service' };
  const addressType = str(o.addressType, 'addressType');
  if (addressType === 'FQDN') return { kind: 'Ignored', reason: 'FQDN address type' };
  if (addressType !== 'IPv4' && addressType !== 'IPv6') throw new InvalidObject('addressType', `unknown address type ${JSON.stringify(addressType)}`);
  const family = addressType === 'IPv4' ? 4 : 6;

  const ports: L.PortName[] = [];
  arr(o.ports, 'ports').forEach((pv, i) => {
    try {
      const p = obj(pv, '', true);
      const port = int(p.port, 'port', 1, 65535);
      if (port === undefined) return; // no port: serves nothing kube-proxy can use
      const protocol = parseProtocol(str(p.protocol, 'protocol', 'TCP'));
      if (protocol === undefined) throw new InvalidObject('protocol', `unknown protocol ${JSON.stringify(p.protocol)}`);
      const portName = str(p.name, 'name');
      if (portName) dnsLabel(portName, 'name');
      ports.push({ $typeName: 'localv1.PortName', Name: portName, Port: port, Protocol: protocol });
    } catch (e) {
      throw within(e, `ports[${i}]`);
    }
  });

  const endpoints: G.EndpointInfo[] = [];
  arr(o.endpoints, 'endpoints').forEach((ev, i) => {
    try {
      endpoints.push(convertEndpoint(ev, family, addressType, namespace, name, serviceName, ports));
    } catch (e) {
      throw within(e, `endpoints[${i}]`);
    }
  });
  return { kind: 'EndpointSlice', namespace, name, serviceName, endpoints };
}

/** a hints list's names (forZones, forNodes), sorted, empty ones left out */
function hintNames(v: unknown, field: string): string[] {
  const list = arr(v, field);
  // (most endpoints have none: no arrays, no callbacks)
  if (list.length === 0) return [];
  const out: string[] = [];
  list.forEach((z, j) => {
    const n = str(obj(z, `${field}[${j}]`, true).name, `${field}[${j}].name`);
    if (n) out.push(n);
  });
  return out.sort();
}

/** one endpoint of a slice; an InvalidObject names the field within it */
function convertEndpoint(ev: unknown, family: 4 | 6, addressType: string, namespace: string, name: string, serviceName: string, ports: readonly L.PortName[]): G.EndpointInfo {
  const e = obj(ev, '', true);
  const addrs = arr(e.addresses, 'addresses');
  if (addrs.length === 0) throw new InvalidObject('addresses', 'empty');
  const addr = ip(addrs[0], 'addresses[0]'); // kube-proxy uses the first address only
  if (ipFamily(addr) !== family) throw new InvalidObject('addresses[0]', `${addr} is not an ${addressType} address`);
  const cond = obj(e.conditions, 'conditions');
  const ready = bool(cond.ready, 'conditions.ready') ?? true;
  const serving = bool(cond.serving, 'conditions.serving') ?? true;
  const terminating = bool(cond.terminating, 'conditions.terminating') ?? false;
  const hints = obj(e.hints, 'hints');
  const zoneHints = hintNames(hints.forZones, 'hints.forZones');
  const nodeHints = hintNames(hints.forNodes, 'hints.forNodes');
  const ref = obj(e.targetRef, 'targetRef');
  const podName = str(ref.kind, 'targetRef.kind') === 'Pod' ? str(ref.name, 'targetRef.name') : '';
  const ipset = newIPSet();
  ipSetAdd(ipset, addr);
  // message literals, every field as create() sets it (test/core/objects-literal.test.ts):
  // the reflective create() would be a good part of a large file's parse
  return {
    $typeName: 'globalv1.EndpointInfo',
    Hash: 0n,
    Namespace: namespace,
    SourceName: name,
    ServiceName: serviceName,
    PodName: podName,
    Endpoint: { $typeName: 'localv1.Endpoint', Hostname: str(e.hostname, 'hostname'), IPs: ipset, Local: false, PortOverrides: ports.slice(), Terminating: false, NodeName: '' },
    Conditions: { $typeName: 'globalv1.EndpointConditions', Ready: ready, Serving: serving, Terminating: terminating },
    Topology: { $typeName: 'globalv1.TopologyInfo', Node: str(e.nodeName, 'nodeName'), Zone: str(e.zone, 'zone') },
    Hints: { $typeName: 'globalv1.TopologyHints', Zones: zoneHints, Nodes: nodeHints },
  };
}

export function convertNode(o: Obj): Converted {
  const { name, labels, md } = meta(o, false);
  const spec = obj(o.spec, 'spec');
  const status = obj(o.status, 'status');
  const internal: string[] = [];
  const external: string[] = [];
  arr(status.addresses, 'status.addresses').forEach((av, i) => {
    const f = `status.addresses[${i}]`;
    const a = obj(av, f, true);
    const type = str(a.type, `${f}.type`);
    if (type !== 'InternalIP' && type !== 'ExternalIP') return;
    (type === 'InternalIP' ? internal : external).push(ip(a.address, `${f}.address`));
  });
  // upstream GetNodeHostIPs: the first address, then the first of the other family
  const all = [...internal, ...external];
  const ips = newIPSet();
  if (all.length) {
    ipSetAdd(ips, all[0]);
    const other = all.find((a) => ipFamily(a) !== ipFamily(all[0]));
    if (other) ipSetAdd(ips, other);
  }
  const podCIDRs = arr(spec.podCIDRs, 'spec.podCIDRs').map((v, i) => v);
  if (podCIDRs.length === 0 && spec.podCIDR) podCIDRs.push(spec.podCIDR);
  const cidrs = podCIDRs.map((v, i) => {
    const f = `spec.podCIDRs[${i}]`;
    const c = parseCIDR(str(v, f));
    if (!c) throw new InvalidObject(f, `${JSON.stringify(v)} is not a CIDR`);
    return formatCIDR(c);
  });
  const taints = arr(spec.taints, 'spec.taints');
  const deleting =
    (md.deletionTimestamp !== undefined && md.deletionTimestamp !== null) ||
    taints.some((t, i) => str(obj(t, `spec.taints[${i}]`, true).key, `spec.taints[${i}].key`) === TO_BE_DELETED_TAINT);
  // only the labels that matter to a proxy (kpng's --with-node-labels
  // default): churn of other labels must not move the store's revision
  const sortedLabels: Record<string, string> = {};
  for (const k of Object.keys(labels).sort()) if (NODE_LABELS.has(k)) sortedLabels[k] = labels[k];
  const node = create(G.NodeSchema, {
    Name: name,
    Labels: sortedLabels,
    Topology: create(G.TopologyInfoSchema, { Node: name, Zone: labels[ZONE_LABEL] ?? labels[LEGACY_ZONE_LABEL] ?? '' }),
    IPs: ips,
    PodCIDRs: cidrs,
    Deleting: deleting,
  });
  return { kind: 'Node', name, node };
}

export function convertServiceCIDR(o: Obj): Converted {
  const { name } = meta(o, false);
  const spec = obj(o.spec, 'spec', true);
  const cidrs = arr(spec.cidrs, 'spec.cidrs').map((v, i) => {
    const f = `spec.cidrs[${i}]`;
    const c = parseCIDR(str(v, f));
    if (!c) throw new InvalidObject(f, `${JSON.stringify(v)} is not a CIDR`);
    return formatCIDR(c);
  });
  return { kind: 'ServiceCIDR', name, cidr: create(L.ServiceCIDRSchema, { Name: name, CIDRs: cidrs }) };
}

/** How deep Lists may nest in Lists (kubectl prints one level). */
export const MAX_LIST_DEPTH = 16;

/**
 * Flattens Lists ("List", "ServiceList", ...) into their items; typed lists
 * from the API server leave the items' kind out, so it is filled in. Lists
 * nested more than MAX_LIST_DEPTH deep are refused (InvalidObject); the walk
 * keeps its own stack, so no input can exhaust the call stack.
 */
export function flattenObjects(o: unknown): unknown[] {
  const out: unknown[] = [];
  const stack: { items: unknown[]; next: number; itemKind?: string }[] = [];
  let cur = o;
  for (;;) {
    const kind = isObj(cur) && typeof cur.kind === 'string' ? cur.kind : '';
    if (kind.endsWith('List') && Array.isArray((cur as Obj).items)) {
      if (stack.length === MAX_LIST_DEPTH) throw new InvalidObject('items', `Lists nested more than ${MAX_LIST_DEPTH} deep`);
      stack.push({ items: (cur as Obj).items as unknown[], next: 0, itemKind: kind === 'List' ? undefined : kind.slice(0, -'List'.length) });
    } else {
      out.push(cur);
    }
    let top = stack.at(-1);
    while (top && top.next === top.items.length) {
      stack.pop();
      top = stack.at(-1);
    }
    if (!top) return out;
    const it = top.items[top.next++];
    cur = top.itemKind && isObj(it) && it.kind === undefined ? { kind: top.itemKind, ...it } : it;
  }
}
