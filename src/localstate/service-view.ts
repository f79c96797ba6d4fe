// One service as one node must see it: the service (with per-node facts) and
// the endpoints this node may use, each with the scopes it is used for.
import { hash } from 'node:crypto';
import { type Service, type Endpoint, type EndpointScopes, type PortMapping, type PortName } from '../api/gen/api/localv1/api_pb.js';
import { encodeEndpointFast, encodeEndpointsFast, encodeServiceFast } from '../api/fast-encode.js';
import { sortSmall } from '../runtime/sort.js';
import { flat } from '../runtime/memory.js';
import type { EndpointInfo } from '../api/gen/api/globalv1/api_pb.js';
import { externallyAccessible, serviceKey, SERVICE_PROXY_NAME_LABEL } from '../api/model.js';
import { sharedPortNames } from '../api/compact.js';
import { categorize, isReady, type Candidate, type Categorized, type EndpointFacts, type NodeContext } from './topology.js';
import type { ScannedEndpoint } from '../api/fast-decode.js';

/** a slice's endpoints as a view reads them: decoded, or scanned from its bytes when it can be */
export interface SliceEndpoints {
  readonly endpoints: readonly EndpointInfo[];
  scanned?(): readonly ScannedEndpoint[] | undefined;
}

export interface EndpointView {
  /** Ref.Path: ns/svc/podName, or ns/svc/<hash> for an endpoint without pod name */
  readonly path: string;
  readonly endpoint: Endpoint;
  readonly bytes: Uint8Array;
  /** false for hash-named (anonymous) endpoints */
  readonly named: boolean;
  /** the OpItem (Set, EndpointsSet, path, bytes) that sends it, when the views keep them (a server) */
  readonly frame?: Buffer;
}

export interface ServiceView {
  /** ns/name, also its Ref.Path */
  readonly key: string;
  readonly service: Service;
  readonly bytes: Uint8Array;
  /** sorted by path */
  readonly endpoints: readonly EndpointView[];
  /** the OpItem (Set, ServicesSet, key, bytes) that sends it, when the views keep them (a server) */
  readonly frame?: Buffer;
}

/**
 * kube-proxy's ShouldSkipService plus the proxy-name label: headless and
 * ExternalName services and services without a cluster IP are not proxied;
 * a service labelled with a proxy name is ours only if the name is ours, and
 * when we have a name only the services labelled with it are ours.
 */
export function serviceIsProxied(svc: Service, proxyName: string): boolean {
  if (svc.Type === 'ExternalName') return false;
  if (svc.IPs?.Headless) return false;
  const cips = svc.IPs?.ClusterIPs;
  if (!cips || cips.V4.length + cips.V6.length === 0) return false;
  const label = svc.Labels[SERVICE_PROXY_NAME_LABEL];
  if (proxyName === '') return label === undefined;
  return label === proxyName;
}

// Parts of endpoint messages shared between views (frozen: nothing may change
// them): a few hundred bytes per service less to allocate and keep.
const NONE = Object.freeze([]) as unknown as string[];
const INTERNAL = 1;
const EXTERNAL = 2;
const CLUSTER = 4;
const SCOPES: EndpointScopes[] = [];
for (let i = 0; i < 8; i++) SCOPES.push(Object.freeze({ $typeName: 'localv1.EndpointScopes', Internal: (i & INTERNAL) !== 0, External: (i & EXTERNAL) !== 0, Cluster: (i & CLUSTER) !== 0 }));
const scopesOf = (r: PortResult) => SCOPES[(r.internal ? INTERNAL : 0) | (r.external ? EXTERNAL : 0) | (r.cluster ? CLUSTER : 0)];

/** marks the candidates categorize put in each list */
function markUses(cat: Categorized): void {
  for (const c of (cat.cluster ?? []) as Mark[]) c.inCluster = true;
  for (const c of (cat.local ?? []) as Mark[]) c.inLocal = true;
}

/** how a marked candidate is used, as SCOPES' index (0: not at all): internal traffic, external, cluster-wide */
function useOf(c: Mark, itpLocal: boolean, etpLocal: boolean): number {
  return ((itpLocal ? c.inLocal : c.inCluster) ? INTERNAL : 0) | ((etpLocal ? c.inLocal : c.inCluster) ? EXTERNAL : 0) | (c.inCluster ? CLUSTER : 0);
}

function samePorts(built: readonly PortName[], ports: readonly PortResult[]): boolean {
  if (built.length !== ports.length) return false;
  for (let i = 0; i < ports.length; i++) {
    const b = built[i];
    const p = ports[i];
    if (b.Name !== p.port.Name || b.Port !== p.target || b.Protocol !== p.port.Protocol) return false;
  }
  return true;
}

/** An endpoint view that keeps the message only: encoded when its bytes are read (an in-process consumer reads them rarely). */
export class DecodedEndpointView implements EndpointView {
  constructor(
    readonly path: string,
    readonly named: boolean,
    readonly endpoint: Endpoint,
  ) {}
  get bytes(): Uint8Array {
    return encodeEndpointFast(this.endpoint);
  }
}

/** An endpoint's encoding is a part of one buffer shared by the service's endpoints. */
class ComputedEndpointView implements EndpointView {
  constructor(
    readonly path: string,
    readonly endpoint: Endpoint,
    readonly named: boolean,
    private readonly buf: Uint8Array,
    private readonly start: number,
    private readonly end: number,
  ) {}
  get bytes(): Uint8Array {
    return this.buf.subarray(this.start, this.end);
  }
}

interface PortResult {
  port: PortMapping;
  target: number;
  internal: boolean;
  external: boolean;
  cluster: boolean;
}

interface FamilyEndpoint {
  ip: string;
  podName: string;
  hostname: string;
  nodeName: string;
  local: boolean;
  terminating: boolean;
  ports: PortResult[];
}

export interface Mark extends Candidate {
  inCluster: boolean;
  inLocal: boolean;
}

/** a group of ports an endpoint serves the same way */
interface Segment {
  fams: FamilyEndpoint[];
  ports: PortResult[];
}

const sameUse = (a: PortResult, b: PortResult) => a.internal === b.internal && a.external === b.external && a.cluster === b.cluster;

/** one segment per way the endpoint's ports are used (usually one) */
function segmentsOf(fe: FamilyEndpoint): Segment[] {
  const ports = fe.ports;
  if (ports.length === 1 || ports.every((p) => sameUse(p, ports[0]))) return [{ fams: [fe], ports }];
  const out: Segment[] = [];
  for (const p of ports) {
    const seg = out.find((g) => sameUse(g.ports[0], p));
    if (seg) seg.ports.push(p);
    else out.push({ fams: [fe], ports: [p] });
  }
  return out;
}

/** two families' segments can be one endpoint when everything but the address agrees */
function mergeable(a: Segment, b: Segment): boolean {
  const fa = a.fams[0];
  const fb = b.fams[0];
  if (fa.local !== fb.local || fa.terminating !== fb.terminating || fa.hostname !== fb.hostname || fa.nodeName !== fb.nodeName) return false;
  if (a.ports.length !== b.ports.length) return false;
  return a.ports.every((p, i) => {
    const q = b.ports[i];
    return sameUse(p, q) && p.port.Name === q.port.Name && p.port.Protocol === q.port.Protocol && p.target === q.target;
  });
}

/**
 * One service port's candidates in one family: the endpoints of the slices
 * that serve it (matched by port name and protocol), deduplicated by IP:port
 * (a local copy wins). kpng get explains its choice from the same list.
 */
export function portCandidates(slices: readonly SliceEndpoints[], port: PortMapping, family: 4 | 6, node: NodeContext): Mark[] {
  const list = new CandidateList();
  for (const slice of slices) {
    for (const info of slice.endpoints) {
      const ips = family === 4 ? info.Endpoint?.IPs?.V4 : info.Endpoint?.IPs?.V6;
      const ip = ips?.[0];
      if (!ip) continue;
      const sp = info.Endpoint!.PortOverrides.find((o) => o.Name === port.Name && o.Protocol === port.Protocol);
      if (sp) list.add(info, ip, sp.Port, node.name !== '' && info.Topology?.Node === node.name);
    }
  }
  return list.list;
}

/** portCandidates of IPv4 endpoints scanned from their bytes (each with one address and one port) */
function scannedCandidates(scanned: readonly (readonly ScannedEndpoint[])[], port: PortMapping, node: NodeContext): Mark[] {
  const list = new CandidateList();
  for (const eps of scanned)
    for (const e of eps) if (e.portName === port.Name && e.protocol === port.Protocol) list.add(e, e.ip, e.port, node.name !== '' && e.Topology?.Node === node.name);
  return list.list;
}

/** candidates deduplicated by IP:port (a local copy wins) */
class CandidateList {
  readonly list: Mark[] = [];
  private index?: Map<string, number>;

  add(info: EndpointFacts, ip: string, port: number, local: boolean): void {
    const list = this.list;
    // a linear scan for small lists, an index past that
    let dup = -1;
    if (list.length > 16 && !this.index) this.index = new Map(list.map((x, i) => [`${x.ip}:${x.port}`, i]));
    if (this.index) dup = this.index.get(`${ip}:${port}`) ?? -1;
    else dup = list.findIndex((x) => x.ip === ip && x.port === port);
    const c: Mark = { info, ip, port, local, inCluster: false, inLocal: false };
    if (dup >= 0) {
      if (local) list[dup] = c;
      return;
    }
    this.index?.set(`${ip}:${port}`, list.length);
    list.push(c);
  }
}

/** The traffic policies as the node-local state applies them (eTP matters only for a Service reachable from outside). */
export function trafficPolicies(svc: Service): { itpLocal: boolean; etpLocal: boolean; externallyAccessible: boolean } {
  const extAcc = externallyAccessible(svc);
  return { itpLocal: svc.InternalTrafficToLocal, etpLocal: svc.ExternalTrafficToLocal && extAcc, externallyAccessible: extAcc };
}

/**
 * Computes the view, or undefined when this service is not proxied at all.
 * encoded false: the view's bytes and its endpoints' are made when read,
 * not with it (DecodedEndpointView): for a consumer that keeps the messages
 * (a node agent's views, `to-file --once`), the encodings were most of a
 * view's garbage.
 */
export function computeServiceView(
  svc: Service,
  slices: readonly SliceEndpoints[],
  node: NodeContext,
  proxyName = '',
  encoded = true,
  /** (tests) every Service the general way */
  general = false,
): ServiceView | undefined {
  if (!serviceIsProxied(svc, proxyName)) return undefined;
  const key = serviceKey(svc.Namespace, svc.Name);
  const { itpLocal, etpLocal, externallyAccessible: extAcc } = trafficPolicies(svc);
  const usesCluster = !itpLocal || extAcc;
  const usesLocal = itpLocal || etpLocal;

  // the node's copy differs only in the ports' HasEndpoints flags: share the rest
  const out: Service = { ...svc, Ports: svc.Ports.map((p) => ({ ...p })) };
  let simple: { built: Endpoint[]; names: string[] } | undefined;
  let hasV6 = false;
  const onePort = svc.Ports.length === 1 && !general;
  // most slices are read without decoding them (scanned); any other goes the general way
  const scanned = onePort ? scanAll(slices) : undefined;
  if (scanned) simple = singlePortEndpoints(scannedCandidates(scanned, out.Ports[0], node), out.Ports[0], node, itpLocal, etpLocal, usesCluster, usesLocal);
  else {
    for (const slice of slices) for (const info of slice.endpoints) if (info.Endpoint?.IPs?.V6.length) hasV6 = true;
    if (onePort && !hasV6) simple = singlePortEndpoints(portCandidates(slices, out.Ports[0], 4, node), out.Ports[0], node, itpLocal, etpLocal, usesCluster, usesLocal);
  }
  const { built, names } = simple ?? anyEndpoints(slices, svc, out, node, hasV6, itpLocal, etpLocal, usesCluster, usesLocal);
  return viewOf(key, out, built, names, encoded);
}

/** every slice's endpoints scanned, or undefined when one of them cannot be */
function scanAll(slices: readonly SliceEndpoints[]): (readonly ScannedEndpoint[])[] | undefined {
  const out: (readonly ScannedEndpoint[])[] = [];
  for (const slice of slices) {
    const eps = slice.scanned?.();
    if (!eps) return undefined;
    out.push(eps);
  }
  return out;
}

/**
 * The endpoints of a Service with one port and IPv4 addresses only, each
 * address once (most Services): what anyEndpoints makes of them, in the
 * same order, without its records per address and per way of use (a good
 * part of a first diff's allocations otherwise). Undefined otherwise.
 */
function singlePortEndpoints(
  list: Mark[],
  port: PortMapping,
  node: NodeContext,
  itpLocal: boolean,
  etpLocal: boolean,
  usesCluster: boolean,
  usesLocal: boolean,
): { built: Endpoint[]; names: string[] } | undefined {
  if (list.length > 1) {
    // an address twice (with two target ports): anyEndpoints merges them
    const seen = new Set<string>();
    for (const c of list) {
      if (seen.has(c.ip)) return undefined;
      seen.add(c.ip);
    }
  }
  const cat = categorize(list, node, usesCluster, usesLocal);
  port.HasEndpointsV4 = cat.hasAny;
  markUses(cat);
  const built: Endpoint[] = [];
  const names: string[] = [];
  let lastPorts = NONE as unknown as PortName[];
  let lastTarget = -1;
  for (const c of list) {
    const use = useOf(c, itpLocal, etpLocal);
    if (!use) continue;
    if (c.port !== lastTarget) {
      lastPorts = sharedPortNames([{ $typeName: 'localv1.PortName', Name: port.Name, Port: c.port, Protocol: port.Protocol }]) as PortName[];
      lastTarget = c.port;
    }
    built.push({
      $typeName: 'localv1.Endpoint',
      Hostname: c.info.Endpoint?.Hostname ?? '',
      IPs: { $typeName: 'localv1.IPSet', V4: [c.ip], V6: NONE },
      Local: c.local,
      PortOverrides: lastPorts,
      Scopes: SCOPES[use],
      Terminating: !isReady(c),
      NodeName: c.info.Topology?.Node ?? '',
    });
    names.push(c.info.PodName);
  }
  return { built, names };
}

/** The endpoints of any Service, and their names (a pod's, or '' for one to be named by its hash). */
function anyEndpoints(
  slices: readonly SliceEndpoints[],
  svc: Service,
  out: Service,
  node: NodeContext,
  hasV6: boolean,
  itpLocal: boolean,
  etpLocal: boolean,
  usesCluster: boolean,
  usesLocal: boolean,
): { built: Endpoint[]; names: string[] } {
  // per family, the endpoints by IP (one record whatever the number of ports)
  const byFamily: Map<string, FamilyEndpoint>[] = [];

  for (const family of hasV6 ? ([4, 6] as const) : ([4] as const)) {
    const fams = new Map<string, FamilyEndpoint>();
    byFamily.push(fams);
    svc.Ports.forEach((port, pi) => {
      const list = portCandidates(slices, port, family, node);
      const cat = categorize(list, node, usesCluster, usesLocal);
      if (family === 4) out.Ports[pi].HasEndpointsV4 = cat.hasAny;
      else out.Ports[pi].HasEndpointsV6 = cat.hasAny;
      markUses(cat);
      for (const c of list) {
        const use = useOf(c, itpLocal, etpLocal);
        if (!use) continue;
        const pr: PortResult = { port, target: c.port, internal: (use & INTERNAL) !== 0, external: (use & EXTERNAL) !== 0, cluster: (use & CLUSTER) !== 0 };
        const fe = fams.get(c.ip);
        if (fe) fe.ports.push(pr);
        else {
          // (a list made with its first item: one made empty and pushed to keeps room for 16 more)
          fams.set(c.ip, {
            ip: c.ip,
            podName: c.info.PodName,
            hostname: c.info.Endpoint?.Hostname ?? '',
            nodeName: c.info.Topology?.Node ?? '',
            local: c.local,
            terminating: !isReady(c),
            ports: [pr],
          });
        }
      }
    });
  }

  // one endpoint per way an address is used; a dual-stack pod used the same
  // way in both families is one endpoint with both addresses
  const groups: { podName: string; segments: Segment[] }[] = [];
  const byPod = new Map<string, { podName: string; segments: Segment[]; families: FamilyEndpoint[] }>();
  byFamily.forEach((fams, fi) => {
    for (const fe of fams.values()) {
      const segs = segmentsOf(fe);
      const pod = fe.podName ? byPod.get(fe.podName) : undefined;
      // the same pod seen with a second address of one family (bad data): apart, anonymous
      if (!pod || pod.families.some((f) => f.ip.includes(':') === fe.ip.includes(':'))) {
        const g = { podName: fi === 0 || !pod ? fe.podName : '', segments: segs, families: [fe] };
        if (fe.podName && !pod) byPod.set(fe.podName, g);
        groups.push(g);
        continue;
      }
      if (!pod.families.includes(fe)) pod.families.push(fe);
      for (const seg of segs) {
        const match = pod.segments.find((x) => x.fams.length === 1 && mergeable(x, seg));
        if (match) match.fams.push(fe);
        else pod.segments.push(seg);
      }
    }
  });

  const built: Endpoint[] = [];
  const names: string[] = [];
  let lastPorts = NONE as unknown as PortName[];
  for (const g of groups) {
    g.segments.forEach((seg, i) => {
      const first = seg.fams[0];
      const r0 = seg.ports[0];
      // exact-size arrays (a pushed-to array keeps room for 16 more)
      let v4: string[] = NONE;
      let v6: string[] = NONE;
      if (seg.fams.length === 1) {
        if (first.ip.includes(':')) v6 = [first.ip];
        else v4 = [first.ip];
      } else {
        const f4 = seg.fams.filter((f) => !f.ip.includes(':')).map((f) => f.ip);
        const f6 = seg.fams.filter((f) => f.ip.includes(':')).map((f) => f.ip);
        if (f4.length) v4 = f4;
        if (f6.length) v6 = f6;
      }
      // consecutive endpoints usually map the same ports, and most Services
      // one of a few lists: the pool's frozen list (kept by proxiers)
      if (!samePorts(lastPorts, seg.ports)) lastPorts = sharedPortNames(seg.ports.map((p) => ({ $typeName: 'localv1.PortName', Name: p.port.Name, Port: p.target, Protocol: p.port.Protocol }))) as PortName[];
      // message literals: protobuf-es messages are plain objects, and its
      // reflective create() is a large part of a cold sync
      built.push({
        $typeName: 'localv1.Endpoint',
        Hostname: first.hostname,
        IPs: { $typeName: 'localv1.IPSet', V4: v4, V6: v6 },
        Local: first.local,
        PortOverrides: lastPorts,
        Scopes: scopesOf(r0),
        Terminating: first.terminating,
        NodeName: first.nodeName,
      });
      names.push(g.podName !== '' && i === 0 ? g.podName : '');
    });
  }
  return { built, names };
}

/** The view of a Service computed for a node and its endpoints (names: a pod's, or '' for a path by hash). */
function viewOf(key: string, out: Service, built: Endpoint[], names: string[], encoded: boolean): ServiceView {
  /** an anonymous endpoint's path: a hash of its encoding */
  const hashed = (bytes: Uint8Array) => hash('sha256', bytes, 'hex').slice(0, 16);
  let endpoints: EndpointView[];
  let serviceBytes: Uint8Array | undefined;
  if (encoded) {
    // the service is encoded in the same buffer, after the endpoints: one allocation per view
    const { buf, starts } = encodeEndpointsFast(built, out);
    endpoints = built.map((ep, i) => {
      const named = names[i] !== '';
      const start = starts[i];
      const end = starts[i + 1];
      return new ComputedEndpointView(flat(key, '/', named ? names[i] : hashed(buf.subarray(start, end))), ep, named, buf, start, end);
    });
    serviceBytes = buf.subarray(starts[built.length]);
  } else {
    endpoints = built.map((ep, i) => {
      const named = names[i] !== '';
      return new DecodedEndpointView(flat(key, '/', named ? names[i] : hashed(encodeEndpointFast(ep))), named, ep);
    });
  }
  sortSmall(endpoints, (a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
  // identical anonymous endpoints (same content) would share a path: keep one
  const dup = endpoints.some((e, i) => i > 0 && e.path === endpoints[i - 1].path);
  const unique = dup ? endpoints.filter((e, i) => i === 0 || e.path !== endpoints[i - 1].path) : endpoints;
  return serviceBytes ? { key, service: out, bytes: serviceBytes, endpoints: unique } : new UnencodedServiceView(key, out, unique);
}

/** computeServiceView's view with encoded false: the service's bytes made when read */
class UnencodedServiceView implements ServiceView {
  constructor(
    readonly key: string,
    readonly service: Service,
    readonly endpoints: readonly EndpointView[],
  ) {}
  get bytes(): Uint8Array {
    return encodeServiceFast(this.service);
  }
}
