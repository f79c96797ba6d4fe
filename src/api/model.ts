// The kpng model: the generated protobuf types of localv1 and globalv1 under
// kpng's names, plus small helpers that every stage uses.
import { create, toBinary, fromBinary, type MessageInitShape } from '@bufbuild/protobuf';
import { flat } from '../runtime/memory.js';
import {
  Set as LocalSet,
  Protocol,
  type Service,
  type Endpoint,
  type IPSet,
  type PortMapping,
  type Node as LocalNode,
  type ServiceCIDR,
  ServiceSchema,
  EndpointSchema,
  NodeSchema as LocalNodeSchema,
  ServiceCIDRSchema,
} from './gen/api/localv1/api_pb.js';
import { ipFamily } from './ip.js';
import { compactOne, sharedPorts } from './compact.js';
import { decodeEndpointFastOnly, decodeServiceFastOnly } from './fast-decode.js';
import { encodeServiceFast } from './fast-encode.js';

export { LocalSet, Protocol };

/** The label that hands a Service to another service proxy (kube-proxy's and kpng's ignore it unless named). */
export const SERVICE_PROXY_NAME_LABEL = 'service.kubernetes.io/service-proxy-name';
export type { Service, Endpoint, IPSet, PortMapping, LocalNode, ServiceCIDR };

export function newIPSet(ips?: Iterable<string>): IPSet {
  // a literal, every field as create() sets it (create() is reflective and slow)
  const s: IPSet = { $typeName: 'localv1.IPSet', V4: [], V6: [] };
  // (no list and no iterator for an empty set: four per Service converted)
  if (ips) for (const ip of ips) ipSetAdd(s, ip);
  return s;
}

/** Adds an IP keeping V4/V6 sorted and unique, as kpng's IPSet.Add does. */
export function ipSetAdd(s: IPSet, ip: string): void {
  const list = ipFamily(ip) === 4 ? s.V4 : s.V6;
  let lo = 0;
  let hi = list.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (list[mid] < ip) lo = mid + 1;
    else hi = mid;
  }
  if (list[lo] !== ip) list.splice(lo, 0, ip);
}

export function ipSetAll(s: IPSet | undefined): string[] {
  return s ? [...s.V4, ...s.V6] : [];
}

export function ipSetOf(s: IPSet | undefined, family: 4 | 6): string[] {
  if (!s) return [];
  return family === 4 ? s.V4 : s.V6;
}

export function protocolName(p: Protocol): 'TCP' | 'UDP' | 'SCTP' | 'Unknown' {
  return p === Protocol.TCP ? 'TCP' : p === Protocol.UDP ? 'UDP' : p === Protocol.SCTP ? 'SCTP' : 'Unknown';
}

export function parseProtocol(s: string | undefined): Protocol | undefined {
  switch (s ?? 'TCP') {
    case 'TCP': return Protocol.TCP;
    case 'UDP': return Protocol.UDP;
    case 'SCTP': return Protocol.SCTP;
    default: return undefined;
  }
}

export function serviceKey(namespace: string, name: string): string {
  return flat(namespace, '/', name);
}

/**
 * The endpoint port for a service port, from the endpoint's PortOverrides
 * (which kpng fills per node by port name and protocol). Undefined: this
 * endpoint does not serve that port.
 */
export function endpointPort(ep: Endpoint, port: PortMapping): number | undefined {
  for (const o of ep.PortOverrides) {
    if (o.Name === port.Name && (o.Protocol === port.Protocol || o.Protocol === Protocol.UnknownProtocol)) return o.Port;
  }
  return undefined;
}

/** True when traffic can reach the service other than by its cluster IPs. */
export function externallyAccessible(svc: Service): boolean {
  return (
    svc.Ports.some((p) => p.NodePort !== 0) ||
    (svc.IPs?.ExternalIPs?.V4.length ?? 0) + (svc.IPs?.ExternalIPs?.V6.length ?? 0) > 0 ||
    (svc.IPs?.LoadBalancerIPs?.V4.length ?? 0) + (svc.IPs?.LoadBalancerIPs?.V6.length ?? 0) > 0
  );
}

export const encodeService = (s: Service): Uint8Array => encodeServiceFast(s);
export const encodeEndpoint = (e: Endpoint): Uint8Array => toBinary(EndpointSchema, e);
export const encodeLocalNode = (n: LocalNode): Uint8Array => toBinary(LocalNodeSchema, n);
export const encodeServiceCIDR = (c: ServiceCIDR): Uint8Array => toBinary(ServiceCIDRSchema, c);
// decoded values are kept (by proxiers, for as long as they hold): compact
// copies (compact.ts), a third smaller than what fromBinary builds
export const decodeService = (b: Uint8Array): Service => {
  // (the hand-written decoder first: it is faster than fromBinary and
  // builds what compact copies with less to copy)
  const svc = compactOne(ServiceSchema, decodeServiceFastOnly(b) ?? fromBinary(ServiceSchema, b));
  // (a message compact hands back as it is, with a prototype chain, is not changed)
  if (Object.isFrozen(svc.Ports) || Object.getPrototypeOf(svc) !== Object.prototype) return svc;
  svc.Ports = sharedPorts(svc.Ports) as PortMapping[];
  return svc;
};
// (the hand-written decoder first: fromBinary would be half of what a node
// agent in split mode spends on each endpoint a brain sends; compact's copy
// too, as the endpoints are kept: docs/design/compact-store.md)
export const decodeEndpoint = (b: Uint8Array): Endpoint => compactOne(EndpointSchema, decodeEndpointFastOnly(b, 0, b.length) ?? fromBinary(EndpointSchema, b));
export const decodeLocalNode = (b: Uint8Array): LocalNode => fromBinary(LocalNodeSchema, b);
export const decodeServiceCIDR = (b: Uint8Array): ServiceCIDR => fromBinary(ServiceCIDRSchema, b);

export const newService = (init: MessageInitShape<typeof ServiceSchema>): Service => create(ServiceSchema, init);
export const newEndpoint = (init: MessageInitShape<typeof EndpointSchema>): Endpoint => create(EndpointSchema, init);

export function bytesEqual(a: Uint8Array, b: Uint8Array): boolean {
  if (a === b) return true;
  if (a.length !== b.length) return false;
  return Buffer.compare(a, b) === 0;
}
