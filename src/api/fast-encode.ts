// Hand-written protobuf encoders for localv1.Endpoint, the most frequent
// message (one per endpoint per node view), and localv1.Service (the store's
// canonical bytes of each, and each node view's). Byte-identical to
// toBinary(EndpointSchema) and toBinary(ServiceSchema)
// (test/core/fast-encode.test.ts and encode-service.test.ts check it), and
// several times faster: a cold sync encodes every endpoint and service once.
// One scratch writer is reused, so encoding allocates only its result. The
// store's slice encoder writes its endpoints with writeEndpoint too.
import { toBinary } from '@bufbuild/protobuf';
import { ServiceSchema, type Endpoint, type IPSet, type Service } from './gen/api/localv1/api_pb.js';
import { ProtoWriter } from './proto-writer.js';

const main = new ProtoWriter();

export function encodeEndpointFast(e: Endpoint): Uint8Array {
  main.pos = 0;
  writeEndpoint(main, e);
  return main.buf.slice(0, main.pos);
}

export function encodeServiceFast(s: Service): Uint8Array {
  main.pos = 0;
  writeService(main, s);
  return main.buf.slice(0, main.pos);
}

/**
 * Encodes endpoints one after the other into one buffer: endpoint i is
 * buf[starts[i], starts[i + 1]), and the service's encoding (if given)
 * follows from starts[list.length]. One allocation for all of a service's
 * encodings instead of one ArrayBuffer each (most of their memory).
 */
export function encodeEndpointsFast(list: readonly Endpoint[], service?: Service): { buf: Uint8Array; starts: number[] } {
  main.pos = 0;
  const starts: number[] = [];
  for (const e of list) {
    starts.push(main.pos);
    writeEndpoint(main, e);
  }
  starts.push(main.pos);
  if (service) writeService(main, service);
  return { buf: main.buf.slice(0, main.pos), starts };
}

/** localv1.Endpoint's fields, as toBinary writes them */
export function writeEndpoint(w: ProtoWriter, e: Endpoint): void {
  w.str(1, e.Hostname);
  if (e.IPs) writeIPSet(w, 2, e.IPs);
  w.bool(3, e.Local);
  // indexed loops: these lists are often shared frozen ones, and for-of over
  // a frozen array takes V8's slow path (3 times slower, an object a step)
  const ports = e.PortOverrides;
  for (let i = 0; i < ports.length; i++) {
    const p = ports[i];
    const at = w.begin(4);
    w.str(1, p.Name);
    w.int(2, p.Port);
    w.int(3, p.Protocol);
    w.end(at);
  }
  if (e.Scopes) {
    const at = w.begin(5);
    w.bool(1, e.Scopes.Internal);
    w.bool(2, e.Scopes.External);
    w.bool(3, e.Scopes.Cluster);
    w.end(at);
  }
  w.bool(6, e.Terminating);
  w.str(7, e.NodeName);
}

const isInt32 = (v: number) => (v | 0) === v;

/** whether writeService can write s: its numbers are int32s (toBinary throws on others, and does so when given them) */
function serviceWritable(s: Service): boolean {
  if (!isInt32(s.HealthCheckNodePort)) return false;
  if (s.SessionAffinity.case === 'ClientIP' && !isInt32(s.SessionAffinity.value.TimeoutSeconds)) return false;
  for (const p of s.Ports) if (!isInt32(p.Protocol) || !isInt32(p.Port) || !isInt32(p.NodePort) || !isInt32(p.TargetPort)) return false;
  return true;
}

/**
 * localv1.Service's fields, as toBinary writes them: by field number (so
 * IPs, 4, before MapIP, 5, and the maps, 8 and 9, after the ports), proto3
 * defaults left out, a message field that is set written even when empty,
 * each map entry (key and value written even when empty) in Object.keys
 * order as toBinary takes them, unknown fields last in each message.
 */
export function writeService(w: ProtoWriter, s: Service): void {
  if (!serviceWritable(s)) {
    w.bytes(toBinary(ServiceSchema, s));
    return;
  }
  w.str(1, s.Namespace);
  w.str(2, s.Name);
  w.str(3, s.Type);
  const ips = s.IPs;
  if (ips) {
    const at = w.begin(4);
    if (ips.ClusterIPs) writeIPSet(w, 1, ips.ClusterIPs);
    if (ips.ExternalIPs) writeIPSet(w, 2, ips.ExternalIPs);
    w.bool(3, ips.Headless);
    if (ips.LoadBalancerIPs) writeIPSet(w, 4, ips.LoadBalancerIPs);
    if (ips.ProxyLoadBalancerIPs) writeIPSet(w, 5, ips.ProxyLoadBalancerIPs);
    if (ips.$unknown) writeUnknown(w, ips.$unknown);
    w.end(at);
  }
  w.bool(5, s.MapIP);
  for (let i = 0; i < s.Ports.length; i++) {
    const p = s.Ports[i];
    const at = w.begin(6);
    w.str(1, p.Name);
    w.int(2, p.Protocol);
    w.int(3, p.Port);
    w.int(4, p.NodePort);
    w.int(5, p.TargetPort);
    w.str(6, p.TargetPortName);
    w.bool(7, p.HasEndpointsV4);
    w.bool(8, p.HasEndpointsV6);
    if (p.$unknown) writeUnknown(w, p.$unknown);
    w.end(at);
  }
  w.bool(7, s.ExternalTrafficToLocal);
  writeMap(w, 8, s.Labels);
  writeMap(w, 9, s.Annotations);
  for (let i = 0; i < s.IPFilters.length; i++) {
    const f = s.IPFilters[i];
    const at = w.begin(10);
    if (f.TargetIPs) writeIPSet(w, 1, f.TargetIPs);
    for (let j = 0; j < f.SourceRanges.length; j++) w.string(2, f.SourceRanges[j]);
    if (f.$unknown) writeUnknown(w, f.$unknown);
    w.end(at);
  }
  if (s.SessionAffinity.case === 'ClientIP') {
    const a = s.SessionAffinity.value;
    const at = w.begin(11);
    w.int(1, a.TimeoutSeconds);
    if (a.$unknown) writeUnknown(w, a.$unknown);
    w.end(at);
  }
  w.bool(12, s.InternalTrafficToLocal);
  w.int(13, s.HealthCheckNodePort);
  w.str(14, s.TrafficDistribution);
  if (s.$unknown) writeUnknown(w, s.$unknown);
}

function writeIPSet(w: ProtoWriter, field: number, ips: IPSet): void {
  const at = w.begin(field);
  for (let i = 0; i < ips.V4.length; i++) w.string(1, ips.V4[i]);
  for (let i = 0; i < ips.V6.length; i++) w.string(2, ips.V6[i]);
  if (ips.$unknown) writeUnknown(w, ips.$unknown);
  w.end(at);
}

/** a map<string, string>: one entry message each, key and value always written */
function writeMap(w: ProtoWriter, field: number, m: { [key: string]: string }): void {
  const keys = Object.keys(m);
  for (let i = 0; i < keys.length; i++) {
    const at = w.begin(field);
    w.string(1, keys[i]);
    w.string(2, m[keys[i]]);
    w.end(at);
  }
}

/** unknown fields, as toBinary writes them back: their tag, then their data as read */
function writeUnknown(w: ProtoWriter, list: NonNullable<Service['$unknown']>): void {
  for (const { no, wireType, data } of list) {
    w.varint(((no << 3) | wireType) >>> 0);
    w.bytes(data);
  }
}
