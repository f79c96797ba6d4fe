// One service as one node must see it: the service (with per-node facts) and
// the endpoints this node may use, each with the scopes it is used for.
import { toBinary } from '@bufbuild/protobuf';
import { createHash } from 'node:crypto';
import { ServiceSchema, type Service, type Endpoint, type PortMapping } from '../api/gen/api/localv1/api_pb.js';
import { encodeEndpointFast } from '../api/fast-encode.js';
import type { StoredSlice } from '../store/store.js';
import { externallyAccessible } from '../api/model.js';
import { categorize, isReady, type Candidate, type NodeContext } from './topology.js';

export const SERVICE_PROXY_NAME_LABEL = 'service.kubernetes.io/service-proxy-name';

export interface EndpointView {
  /** Ref.Path: ns/svc/podName, or ns/svc/<hash> for an endpoint without pod name */
  readonly path: string;
  readonly endpoint: Endpoint;
  readonly bytes: Uint8Array;
  /** false for hash-named (anonymous) endpoints */
  readonly named: boolean;
}

export interface ServiceView {
  /** ns/name, also its Ref.Path */
  readonly key: string;
  readonly service: Service;
  readonly bytes: Uint8Array;
  /** sorted by path */
  readonly endpoints: readonly EndpointView[];
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

interface PortResult {
  port: PortMapping;
  target: number;
  internal: boolean;
  external: boolean;
  cluster: boolean;
}

interface FamilyEndpoint {
  ip: string;
  hostname: string;
  nodeName: string;
  local: boolean;
  terminating: boolean;
  ports: PortResult[];
}

/** Computes the view, or undefined when this service is not proxied at all. */
export function computeServiceView(
  svc: Service,
  slices: readonly StoredSlice[],
  node: NodeContext,
  proxyName = '',
): ServiceView | undefined {
  if (!serviceIsProxied(svc, proxyName)) return undefined;
  const key = `${svc.Namespace}/${svc.Name}`;
  const extAcc = externallyAccessible(svc);
  const itpLocal = svc.InternalTrafficToLocal;
  const etpLocal = svc.ExternalTrafficToLocal && extAcc;
  const usesCluster = !itpLocal || extAcc;
  const usesLocal = itpLocal || etpLocal;

  // the node's copy differs only in the ports' HasEndpoints flags: share the rest
  const out: Service = { ...svc, Ports: svc.Ports.map((p) => ({ ...p })) };
  // identity (pod name or IP) -> family -> endpoint facts
  const byIdentity = new Map<string, { podName: string; fams: Map<4 | 6, FamilyEndpoint> }>();

  for (const family of [4, 6] as const) {
    svc.Ports.forEach((port, pi) => {
      // candidates for this port, deduplicated by IP:port (a local copy wins)
      const cands = new Map<string, Candidate>();
      for (const slice of slices) {
        for (const info of slice.endpoints) {
          const ips = family === 4 ? info.Endpoint?.IPs?.V4 : info.Endpoint?.IPs?.V6;
          const ip = ips?.[0];
          if (!ip) continue;
          const sp = info.Endpoint!.PortOverrides.find((o) => o.Name === port.Name && o.Protocol === port.Protocol);
          if (!sp) continue;
          const local = node.name !== '' && info.Topology?.Node === node.name;
          const k = `${ip}:${sp.Port}`;
          if (cands.has(k) && !local) continue;
          cands.set(k, { info, ip, port: sp.Port, local });
        }
      }
      const list = [...cands.values()];
      const cat = categorize(list, node, usesCluster, usesLocal);
      if (family === 4) out.Ports[pi].HasEndpointsV4 = cat.hasAny;
      else out.Ports[pi].HasEndpointsV6 = cat.hasAny;

      const internalSet = new Set(itpLocal ? cat.local : cat.cluster);
      const externalSet = new Set(etpLocal ? cat.local : cat.cluster);
      const clusterSet = new Set(cat.cluster);
      for (const c of list) {
        const r: PortResult = {
          port,
          target: c.port,
          internal: internalSet.has(c),
          external: externalSet.has(c),
          cluster: clusterSet.has(c),
        };
        if (!r.internal && !r.external && !r.cluster) continue;
        const podName = c.info.PodName;
        const id = podName ? `pod:${podName}` : `ip:${c.ip}`;
        let ident = byIdentity.get(id);
        if (!ident) byIdentity.set(id, (ident = { podName, fams: new Map() }));
        let fe = ident.fams.get(family);
        if (!fe || fe.ip !== c.ip) {
          // a pod has one address per family; a second one in the same
          // family (bad data) is kept apart below under its own identity
          if (fe && fe.ip !== c.ip) {
            const alt = `ip:${c.ip}`;
            let other = byIdentity.get(alt);
            if (!other) byIdentity.set(alt, (other = { podName: '', fams: new Map() }));
            ident = other;
            fe = ident.fams.get(family);
          }
          if (!fe) {
            fe = { ip: c.ip, hostname: c.info.Endpoint?.Hostname ?? '', nodeName: c.info.Topology?.Node ?? '', local: c.local, terminating: !isReady(c), ports: [] };
            ident.fams.set(family, fe);
          }
        }
        fe.ports.push(r);
      }
    });
  }

  const endpoints: EndpointView[] = [];
  for (const ident of byIdentity.values()) {
    // split each family's ports by how they are used, then merge families
    // that are used identically (a dual-stack pod becomes one endpoint)
    const segments: { sig: string; fams: FamilyEndpoint[]; ports: PortResult[] }[] = [];
    for (const fam of [4, 6] as const) {
      const fe = ident.fams.get(fam);
      if (!fe) continue;
      const groups = new Map<string, PortResult[]>();
      for (const r of fe.ports) {
        const g = `${r.internal ? 'i' : ''}${r.external ? 'e' : ''}${r.cluster ? 'c' : ''}`;
        let list = groups.get(g);
        if (!list) groups.set(g, (list = []));
        list.push(r);
      }
      for (const [g, ports] of groups) {
        const sig = `${g}|${fe.local}|${fe.terminating}|${fe.hostname}|${fe.nodeName}|` + ports.map((p) => `${p.port.Name}/${p.port.Protocol}=${p.target}`).join(',');
        const seg = segments.find((s) => s.sig === sig && !s.fams.some((f) => f === fe || (f.ip.includes(':') === fe.ip.includes(':'))));
        if (seg) seg.fams.push(fe);
        else segments.push({ sig, fams: [fe], ports });
      }
    }
    segments.forEach((seg, i) => {
      const first = seg.fams[0];
      const r0 = seg.ports[0];
      // message literals: protobuf-es messages are plain objects, and its
      // reflective create() is a large part of a cold sync
      const ep: Endpoint = {
        $typeName: 'localv1.Endpoint',
        Hostname: first.hostname,
        IPs: {
          $typeName: 'localv1.IPSet',
          V4: seg.fams.filter((f) => !f.ip.includes(':')).map((f) => f.ip),
          V6: seg.fams.filter((f) => f.ip.includes(':')).map((f) => f.ip),
        },
        Local: first.local,
        PortOverrides: seg.ports.map((p) => ({ $typeName: 'localv1.PortName', Name: p.port.Name, Port: p.target, Protocol: p.port.Protocol })),
        Scopes: { $typeName: 'localv1.EndpointScopes', Internal: r0.internal, External: r0.external, Cluster: r0.cluster },
        Terminating: first.terminating,
        NodeName: first.nodeName,
      };
      const bytes = encodeEndpointFast(ep);
      const named = ident.podName !== '' && i === 0;
      const path = named ? `${key}/${ident.podName}` : `${key}/${createHash('sha256').update(bytes).digest('hex').slice(0, 16)}`;
      endpoints.push({ path, endpoint: ep, bytes, named });
    });
  }
  endpoints.sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
  // identical anonymous endpoints (same content) would share a path: keep one
  const unique = endpoints.filter((e, i) => i === 0 || e.path !== endpoints[i - 1].path);
  return { key, service: out, bytes: toBinary(ServiceSchema, out), endpoints: unique };
}
