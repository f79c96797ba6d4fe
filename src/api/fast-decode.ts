// Hand-written protobuf decoders for globalv1.EndpointInfo, the message a
// node agent decodes most (its store keeps slices as bytes and decodes them
// for each view it computes), and for localv1.Endpoint and localv1.Service,
// what a node agent in split mode decodes of the ops a brain sends. Each
// equals fromBinary of its schema for everything kpng writes
// (test/core/fast-decode.test.ts checks them on random messages), is
// several times faster, and makes object literals with every field inside
// the object. Anything one does not expect (an unknown field, a wire type
// that does not match, a message field twice) goes to fromBinary, which
// knows every rule.
import { fromBinary } from '@bufbuild/protobuf';
import { EndpointInfoSchema, type EndpointConditions, type EndpointInfo, type TopologyHints, type TopologyInfo } from './gen/api/globalv1/api_pb.js';
import {
  EndpointSchema,
  type ClientIPAffinity,
  type Endpoint,
  type EndpointScopes,
  type IPFilter,
  type IPSet,
  type PortMapping,
  type PortName,
  type Service,
  type ServiceIPs,
} from './gen/api/localv1/api_pb.js';
import { pooled } from './compact.js';

/** the message is not one this decoder takes: fromBinary decodes it */
class Unexpected extends Error {}
const UNEXPECTED = new Unexpected();

const utf8 = new TextDecoder();
const latin1Slice = (Buffer.prototype as unknown as { latin1Slice(this: Uint8Array, start: number, end: number): string }).latin1Slice;

/** scratch for a uint64 from two 32-bit halves */
const WORDS = new DataView(new ArrayBuffer(8));

class Reader {
  pos: number;
  constructor(
    readonly buf: Uint8Array,
    start: number,
    readonly end: number,
  ) {
    this.pos = start;
  }

  /** a varint of up to 32 significant bits (tags, lengths, bools, enums, int32: the low 32 bits, signed) */
  varint32(): number {
    let v = 0;
    for (let shift = 0; shift < 70; shift += 7) {
      if (this.pos >= this.end) throw UNEXPECTED;
      const b = this.buf[this.pos++];
      if (shift < 32) v |= (b & 0x7f) << shift;
      if (b < 0x80) return v;
    }
    throw UNEXPECTED;
  }

  /** a bool: true when any bit of its varint is set (fromBinary reads it as a uint64) */
  bool(): boolean {
    let any = 0;
    for (let i = 0; i < 10; i++) {
      if (this.pos >= this.end) throw UNEXPECTED;
      const b = this.buf[this.pos++];
      any |= b & 0x7f;
      if (b < 0x80) return any !== 0;
    }
    throw UNEXPECTED;
  }

  /** a uint64 varint */
  varint64(): bigint {
    let lo = 0;
    let hi = 0;
    for (let shift = 0; shift < 70; shift += 7) {
      if (this.pos >= this.end) throw UNEXPECTED;
      const b = this.buf[this.pos++];
      if (shift < 28) lo |= (b & 0x7f) << shift;
      else if (shift === 28) {
        lo |= (b & 0x0f) << 28;
        hi |= (b & 0x7f) >>> 4;
      } else hi |= (b & 0x7f) << (shift - 32);
      if (b < 0x80) {
        // one BigInt made, not four (shift and or make one each)
        WORDS.setUint32(0, lo >>> 0, true);
        WORDS.setUint32(4, hi >>> 0, true);
        return WORDS.getBigUint64(0, true);
      }
    }
    throw UNEXPECTED;
  }

  /** the end of a length-delimited field that starts here */
  sub(): number {
    const len = this.varint32() >>> 0;
    const end = this.pos + len;
    if (end > this.end) throw UNEXPECTED;
    return end;
  }

  string(): string {
    const end = this.sub();
    const s = this.buf;
    // ASCII (names, addresses) without a TextDecoder call
    let ascii = end - this.pos <= 64;
    for (let i = this.pos; ascii && i < end; i++) if (s[i] >= 0x80) ascii = false;
    // (Buffer's latin1Slice reads any Uint8Array: no view object per string)
    const out = ascii ? latin1Slice.call(s, this.pos, end) : utf8.decode(s.subarray(this.pos, end));
    this.pos = end;
    return out;
  }
}

// (a tag is read as one number where it is used: a [field, wire] pair
// returned would be an array allocated per field)

const VARINT = 0;
const LEN = 2;

function expect(wire: number, want: number) {
  if (wire !== want) throw UNEXPECTED;
}

// Every endpoint's conditions and scopes are one of eight, its hints mostly
// none, one of its address families mostly empty: shared frozen messages and
// lists (a view decodes every endpoint of its Service, a packed proxier each
// endpoint it computes again, and nothing changes a stored message) instead
// of one to four objects each.
const CONDITIONS: readonly EndpointConditions[] = Array.from({ length: 8 }, (_, i) =>
  Object.freeze({ $typeName: 'globalv1.EndpointConditions', Ready: (i & 4) !== 0, Serving: (i & 2) !== 0, Terminating: (i & 1) !== 0 }),
);
const SCOPES: readonly EndpointScopes[] = Array.from({ length: 8 }, (_, i) =>
  Object.freeze({ $typeName: 'localv1.EndpointScopes', Internal: (i & 4) !== 0, External: (i & 2) !== 0, Cluster: (i & 1) !== 0 }),
);
const NO_IPS = Object.freeze([]) as unknown as string[];
const NO_HINTS: TopologyHints = Object.freeze({ $typeName: 'globalv1.TopologyHints', Zones: Object.freeze([]) as unknown as string[], Nodes: Object.freeze([]) as unknown as string[] });

function add<T>(list: T[] | undefined, x: T): T[] {
  if (!list) return [x];
  list.push(x);
  return list;
}

function ipSet(r: Reader, end: number): IPSet {
  let V4: string[] | undefined;
  let V6: string[] | undefined;
  while (r.pos < end) {
    const t = r.varint32() >>> 0, f = t >>> 3, w = t & 7;
    expect(w, LEN);
    // (a list made by its first item has room for it alone; one made empty
    // and pushed to keeps room for 16 more: 128 bytes an endpoint)
    if (f === 1) V4 = add(V4, r.string());
    else if (f === 2) V6 = add(V6, r.string());
    else throw UNEXPECTED;
  }
  // (a single-stack endpoint's other family: the shared empty list)
  return { $typeName: 'localv1.IPSet', V4: V4 ?? NO_IPS, V6: V6 ?? NO_IPS };
}

function portName(r: Reader, end: number): PortName {
  let Name = '';
  let Port = 0;
  let Protocol = 0;
  while (r.pos < end) {
    const t = r.varint32() >>> 0, f = t >>> 3, w = t & 7;
    if (f === 1) (expect(w, LEN), (Name = r.string()));
    else if (f === 2) (expect(w, VARINT), (Port = r.varint32()));
    else if (f === 3) (expect(w, VARINT), (Protocol = r.varint32()));
    else throw UNEXPECTED;
  }
  return { $typeName: 'localv1.PortName', Name, Port, Protocol };
}

function scopes(r: Reader, end: number): EndpointScopes {
  let Internal = false;
  let External = false;
  let Cluster = false;
  while (r.pos < end) {
    const t = r.varint32() >>> 0, f = t >>> 3, w = t & 7;
    expect(w, VARINT);
    const v = r.bool();
    if (f === 1) Internal = v;
    else if (f === 2) External = v;
    else if (f === 3) Cluster = v;
    else throw UNEXPECTED;
  }
  return SCOPES[(Internal ? 4 : 0) | (External ? 2 : 0) | (Cluster ? 1 : 0)];
}

function endpoint(r: Reader, end: number): Endpoint {
  let Hostname = '';
  let IPs: IPSet | undefined;
  let Local = false;
  let PortOverrides: PortName[] | undefined;
  let Scopes: EndpointScopes | undefined;
  let Terminating = false;
  let NodeName = '';
  while (r.pos < end) {
    const t = r.varint32() >>> 0, f = t >>> 3, w = t & 7;
    switch (f) {
      case 1: expect(w, LEN); Hostname = r.string(); break;
      case 2: expect(w, LEN); if (IPs) throw UNEXPECTED; IPs = ipSet(r, r.sub()); break;
      case 3: expect(w, VARINT); Local = r.bool(); break;
      case 4: expect(w, LEN); PortOverrides = add(PortOverrides, portName(r, r.sub())); break;
      case 5: expect(w, LEN); if (Scopes) throw UNEXPECTED; Scopes = scopes(r, r.sub()); break;
      case 6: expect(w, VARINT); Terminating = r.bool(); break;
      case 7: expect(w, LEN); NodeName = pooled(r.string()); break;
      default: throw UNEXPECTED;
    }
  }
  return { $typeName: 'localv1.Endpoint', Hostname, IPs, Local, PortOverrides: PortOverrides ?? [], Scopes, Terminating, NodeName };
}

function conditions(r: Reader, end: number): EndpointConditions {
  let Ready = false;
  let Serving = false;
  let Terminating = false;
  while (r.pos < end) {
    const t = r.varint32() >>> 0, f = t >>> 3, w = t & 7;
    expect(w, VARINT);
    const v = r.bool();
    if (f === 1) Ready = v;
    else if (f === 2) Serving = v;
    else if (f === 3) Terminating = v;
    else throw UNEXPECTED;
  }
  return CONDITIONS[(Ready ? 4 : 0) | (Serving ? 2 : 0) | (Terminating ? 1 : 0)];
}

function topology(r: Reader, end: number): TopologyInfo {
  let Node = '';
  let Zone = '';
  while (r.pos < end) {
    const t = r.varint32() >>> 0, f = t >>> 3, w = t & 7;
    expect(w, LEN);
    if (f === 1) Node = pooled(r.string());
    else if (f === 2) Zone = pooled(r.string());
    else throw UNEXPECTED;
  }
  return { $typeName: 'globalv1.TopologyInfo', Node, Zone };
}

function hints(r: Reader, end: number): TopologyHints {
  if (r.pos === end) return NO_HINTS;
  let Zones: string[] | undefined;
  let Nodes: string[] | undefined;
  while (r.pos < end) {
    const t = r.varint32() >>> 0, f = t >>> 3, w = t & 7;
    expect(w, LEN);
    if (f === 1) Zones = add(Zones, pooled(r.string()));
    else if (f === 2) Nodes = add(Nodes, pooled(r.string()));
    else throw UNEXPECTED;
  }
  return { $typeName: 'globalv1.TopologyHints', Zones: Zones ?? [], Nodes: Nodes ?? [] };
}

function endpointInfo(r: Reader): EndpointInfo {
  let Hash = 0n;
  let Namespace = '';
  let SourceName = '';
  let ServiceName = '';
  let PodName = '';
  let Endpoint: Endpoint | undefined;
  let Conditions: EndpointConditions | undefined;
  let Topology: TopologyInfo | undefined;
  let Hints: TopologyHints | undefined;
  while (r.pos < r.end) {
    const t = r.varint32() >>> 0, f = t >>> 3, w = t & 7;
    switch (f) {
      case 1: expect(w, VARINT); Hash = r.varint64(); break;
      case 2: expect(w, LEN); Namespace = r.string(); break;
      case 3: expect(w, LEN); SourceName = r.string(); break;
      case 4: expect(w, LEN); ServiceName = r.string(); break;
      case 8: expect(w, LEN); PodName = r.string(); break;
      case 6: expect(w, LEN); if (Endpoint) throw UNEXPECTED; Endpoint = endpoint(r, r.sub()); break;
      case 7: expect(w, LEN); if (Conditions) throw UNEXPECTED; Conditions = conditions(r, r.sub()); break;
      case 9: expect(w, LEN); if (Topology) throw UNEXPECTED; Topology = topology(r, r.sub()); break;
      case 10: expect(w, LEN); if (Hints) throw UNEXPECTED; Hints = hints(r, r.sub()); break;
      default: throw UNEXPECTED;
    }
  }
  return { $typeName: 'globalv1.EndpointInfo', Hash, Namespace, SourceName, ServiceName, PodName, Endpoint, Conditions, Topology, Hints };
}

/** fromBinary(EndpointSchema) of buf[start, end), faster, without the compact copy decodeEndpoint makes (a proxier's packed endpoints, decoded on each use) */
export function decodeEndpointFast(buf: Uint8Array, start: number, end: number): Endpoint {
  return decodeEndpointFastOnly(buf, start, end) ?? fromBinary(EndpointSchema, buf.subarray(start, end));
}

/** decodeEndpointFast, or undefined for what only fromBinary takes (an unknown field, a field twice, a wire type that does not match) */
export function decodeEndpointFastOnly(buf: Uint8Array, start: number, end: number): Endpoint | undefined {
  try {
    return endpoint(new Reader(buf, start, end), end);
  } catch (e) {
    if (e !== UNEXPECTED) throw e;
    return undefined;
  }
}

/** fromBinary(EndpointInfoSchema, bytes), faster */
export function decodeEndpointInfoFast(bytes: Uint8Array): EndpointInfo {
  return decodeEndpointInfoAt(bytes, 0, bytes.length);
}

/** decodeEndpointInfoFast of bytes[start, end): no view object to make */
export function decodeEndpointInfoAt(bytes: Uint8Array, start: number, end: number): EndpointInfo {
  try {
    return endpointInfo(new Reader(bytes, start, end));
  } catch (e) {
    if (e !== UNEXPECTED) throw e;
    return fromBinary(EndpointInfoSchema, bytes.subarray(start, end));
  }
}

// --- what a view reads of an endpoint, straight from its bytes

/**
 * What a node's view reads of an endpoint with one IPv4 address and one
 * port (most endpoints): its EndpointInfo's fields a view uses, one object
 * (the decoded message is nine, and a BigInt). Topology is a shared frozen
 * object per node and zone.
 */
export interface ScannedEndpoint {
  readonly PodName: string;
  readonly Conditions: EndpointConditions | undefined;
  readonly Hints: TopologyHints | undefined;
  readonly Topology: TopologyInfo | undefined;
  readonly Endpoint: { readonly Hostname: string };
  /** its one IPv4 address */
  readonly ip: string;
  /** its one port */
  readonly portName: string;
  readonly port: number;
  readonly protocol: number;
}

const NO_HOSTNAME = Object.freeze({ Hostname: '' });
// node -> zone -> the shared TopologyInfo; bounded like the string pool (when full it starts over)
const TOPOLOGY_MAX = 1 << 12;
let topologies = new Map<string, Map<string, TopologyInfo>>();
let topologyCount = 0;

function pooledTopology(Node: string, Zone: string): TopologyInfo {
  let zones = topologies.get(Node);
  const t = zones?.get(Zone);
  if (t) return t;
  if (topologyCount >= TOPOLOGY_MAX) (topologies = new Map()), (topologyCount = 0), (zones = undefined);
  if (!zones) topologies.set(Node, (zones = new Map()));
  const made: TopologyInfo = Object.freeze({ $typeName: 'globalv1.TopologyInfo', Node: pooled(Node), Zone: pooled(Zone) });
  zones.set(Zone, made);
  topologyCount++;
  return made;
}

/** a field of this wire type passed over */
function skip(r: Reader, wire: number): void {
  if (wire === VARINT) r.varint32();
  else if (wire === LEN) r.pos = r.sub();
  else throw UNEXPECTED;
}

/**
 * The endpoint EndpointInfo bytes[start, end) hold, as a view reads it; or
 * undefined when it is not one the scan takes (not exactly one IPv4
 * address and no IPv6, not exactly one port, no endpoint, a field twice or
 * unknown): its slice is then decoded whole. A field the scan returns
 * equals the decoded message's (test/core/fast-decode.test.ts).
 */
export function scanEndpointAt(bytes: Uint8Array, start: number, end: number): ScannedEndpoint | undefined {
  try {
    return scanEndpointInfo(new Reader(bytes, start, end));
  } catch (e) {
    if (e !== UNEXPECTED) throw e;
    return undefined;
  }
}

function scanEndpointInfo(r: Reader): ScannedEndpoint | undefined {
  let PodName = '';
  let Conditions: EndpointConditions | undefined;
  let Topology: TopologyInfo | undefined;
  let Hints: TopologyHints | undefined;
  let seen = 0;
  let Hostname = '';
  let ip = '';
  let ips = 0;
  let ports = 0;
  let portName = '';
  let port = 0;
  let protocol = 0;
  while (r.pos < r.end) {
    const t = r.varint32() >>> 0, f = t >>> 3, w = t & 7;
    // (each field once, as a canonical encoding has it: fromBinary would merge a second)
    if (f < 32) {
      if (seen & (1 << f)) return undefined;
      seen |= 1 << f;
    }
    switch (f) {
      case 1: case 2: case 3: case 4: expect(w, f === 1 ? VARINT : LEN); skip(r, w); break;
      case 8: expect(w, LEN); PodName = r.string(); break;
      case 7: expect(w, LEN); Conditions = conditions(r, r.sub()); break;
      case 9: {
        expect(w, LEN);
        const end = r.sub();
        let node = '';
        let zone = '';
        let fields = 0;
        while (r.pos < end) {
          const t2 = r.varint32() >>> 0, f2 = t2 >>> 3;
          expect(t2 & 7, LEN);
          if (f2 === 1) node = r.string();
          else if (f2 === 2) zone = r.string();
          else throw UNEXPECTED;
          if (fields & f2) throw UNEXPECTED;
          fields |= f2;
        }
        Topology = pooledTopology(node, zone);
        break;
      }
      case 10: expect(w, LEN); Hints = hints(r, r.sub()); break;
      case 6: {
        expect(w, LEN);
        const end = r.sub();
        let fields = 0;
        while (r.pos < end) {
          const t2 = r.varint32() >>> 0, f2 = t2 >>> 3, w2 = t2 & 7;
          if (f2 !== 4) {
            if (f2 >= 8 || fields & (1 << f2)) throw UNEXPECTED;
            fields |= 1 << f2;
          }
          switch (f2) {
            case 1: expect(w2, LEN); Hostname = r.string(); break;
            case 2: {
              expect(w2, LEN);
              const e2 = r.sub();
              while (r.pos < e2) {
                const t3 = r.varint32() >>> 0;
                expect(t3 & 7, LEN);
                if (t3 >>> 3 === 1) (ip = r.string()), ips++;
                else throw UNEXPECTED; // an IPv6 address (or an unknown field)
              }
              break;
            }
            case 4: {
              expect(w2, LEN);
              if (++ports > 1) throw UNEXPECTED;
              const p = onePort(r, r.sub());
              portName = p.name;
              port = p.port;
              protocol = p.protocol;
              break;
            }
            case 3: case 5: case 6: case 7: expect(w2, f2 === 5 || f2 === 7 ? LEN : VARINT); skip(r, w2); break;
            default: throw UNEXPECTED;
          }
        }
        break;
      }
      default: throw UNEXPECTED;
    }
  }
  if (ips !== 1 || ip === '' || ports !== 1) return undefined;
  return { PodName, Conditions, Hints, Topology, Endpoint: Hostname === '' ? NO_HOSTNAME : { Hostname }, ip, portName, port, protocol };
}

/** a PortName's fields without the message */
const portScratch = { name: '', port: 0, protocol: 0 };
function onePort(r: Reader, end: number): typeof portScratch {
  let name = '';
  let port = 0;
  let protocol = 0;
  let fields = 0;
  while (r.pos < end) {
    const t = r.varint32() >>> 0, f = t >>> 3, w = t & 7;
    if (f < 1 || f > 3 || fields & (1 << f)) throw UNEXPECTED;
    fields |= 1 << f;
    if (f === 1) (expect(w, LEN), (name = pooled(r.string())));
    else if (f === 2) (expect(w, VARINT), (port = r.varint32()));
    else (expect(w, VARINT), (protocol = r.varint32()));
  }
  portScratch.name = name;
  portScratch.port = port;
  portScratch.protocol = protocol;
  return portScratch;
}

// --- localv1.Service (a node agent in split mode decodes one per Service a brain sends)

function serviceIPs(r: Reader, end: number): ServiceIPs {
  let ClusterIPs: IPSet | undefined;
  let ExternalIPs: IPSet | undefined;
  let Headless = false;
  let LoadBalancerIPs: IPSet | undefined;
  let ProxyLoadBalancerIPs: IPSet | undefined;
  while (r.pos < end) {
    const t = r.varint32() >>> 0, f = t >>> 3, w = t & 7;
    switch (f) {
      case 1: expect(w, LEN); if (ClusterIPs) throw UNEXPECTED; ClusterIPs = ipSet(r, r.sub()); break;
      case 2: expect(w, LEN); if (ExternalIPs) throw UNEXPECTED; ExternalIPs = ipSet(r, r.sub()); break;
      case 3: expect(w, VARINT); Headless = r.bool(); break;
      case 4: expect(w, LEN); if (LoadBalancerIPs) throw UNEXPECTED; LoadBalancerIPs = ipSet(r, r.sub()); break;
      case 5: expect(w, LEN); if (ProxyLoadBalancerIPs) throw UNEXPECTED; ProxyLoadBalancerIPs = ipSet(r, r.sub()); break;
      default: throw UNEXPECTED;
    }
  }
  return { $typeName: 'localv1.ServiceIPs', ClusterIPs, ExternalIPs, Headless, LoadBalancerIPs, ProxyLoadBalancerIPs };
}

function portMapping(r: Reader, end: number): PortMapping {
  let Name = '';
  let Protocol = 0;
  let Port = 0;
  let NodePort = 0;
  let TargetPort = 0;
  let TargetPortName = '';
  let HasEndpointsV4 = false;
  let HasEndpointsV6 = false;
  while (r.pos < end) {
    const t = r.varint32() >>> 0, f = t >>> 3, w = t & 7;
    switch (f) {
      case 1: expect(w, LEN); Name = r.string(); break;
      case 2: expect(w, VARINT); Protocol = r.varint32(); break;
      case 3: expect(w, VARINT); Port = r.varint32(); break;
      case 4: expect(w, VARINT); NodePort = r.varint32(); break;
      case 5: expect(w, VARINT); TargetPort = r.varint32(); break;
      case 6: expect(w, LEN); TargetPortName = r.string(); break;
      case 7: expect(w, VARINT); HasEndpointsV4 = r.bool(); break;
      case 8: expect(w, VARINT); HasEndpointsV6 = r.bool(); break;
      default: throw UNEXPECTED;
    }
  }
  return { $typeName: 'localv1.PortMapping', Name, Protocol, Port, NodePort, TargetPort, TargetPortName, HasEndpointsV4, HasEndpointsV6 };
}

/** one map<string, string> entry into m (a key seen again: the later value, as fromBinary does) */
function mapEntry(r: Reader, end: number, m: { [key: string]: string }): void {
  let key = '';
  let value = '';
  while (r.pos < end) {
    const t = r.varint32() >>> 0, f = t >>> 3, w = t & 7;
    expect(w, LEN);
    if (f === 1) key = r.string();
    else if (f === 2) value = r.string();
    else throw UNEXPECTED;
  }
  // (fromBinary makes "__proto__" an own property: its way)
  if (key === '__proto__') throw UNEXPECTED;
  m[key] = value;
}

function ipFilter(r: Reader, end: number): IPFilter {
  let TargetIPs: IPSet | undefined;
  const SourceRanges: string[] = [];
  while (r.pos < end) {
    const t = r.varint32() >>> 0, f = t >>> 3, w = t & 7;
    expect(w, LEN);
    if (f === 1) {
      if (TargetIPs) throw UNEXPECTED;
      TargetIPs = ipSet(r, r.sub());
    } else if (f === 2) SourceRanges.push(r.string());
    else throw UNEXPECTED;
  }
  return { $typeName: 'localv1.IPFilter', TargetIPs, SourceRanges };
}

function clientIPAffinity(r: Reader, end: number): ClientIPAffinity {
  let TimeoutSeconds = 0;
  while (r.pos < end) {
    const t = r.varint32() >>> 0, f = t >>> 3, w = t & 7;
    if (f !== 1) throw UNEXPECTED;
    expect(w, VARINT);
    TimeoutSeconds = r.varint32();
  }
  return { $typeName: 'localv1.ClientIPAffinity', TimeoutSeconds };
}

function service(r: Reader): Service {
  let Namespace = '';
  let Name = '';
  let Type = '';
  const Labels: { [key: string]: string } = {};
  const Annotations: { [key: string]: string } = {};
  let IPs: ServiceIPs | undefined;
  const IPFilters: IPFilter[] = [];
  let MapIP = false;
  const Ports: PortMapping[] = [];
  let ExternalTrafficToLocal = false;
  let SessionAffinity: Service['SessionAffinity'] = { case: undefined };
  let InternalTrafficToLocal = false;
  let HealthCheckNodePort = 0;
  let TrafficDistribution = '';
  while (r.pos < r.end) {
    const t = r.varint32() >>> 0, f = t >>> 3, w = t & 7;
    switch (f) {
      case 1: expect(w, LEN); Namespace = r.string(); break;
      case 2: expect(w, LEN); Name = r.string(); break;
      case 3: expect(w, LEN); Type = r.string(); break;
      case 4: expect(w, LEN); if (IPs) throw UNEXPECTED; IPs = serviceIPs(r, r.sub()); break;
      case 5: expect(w, VARINT); MapIP = r.bool(); break;
      case 6: expect(w, LEN); Ports.push(portMapping(r, r.sub())); break;
      case 7: expect(w, VARINT); ExternalTrafficToLocal = r.bool(); break;
      case 8: expect(w, LEN); mapEntry(r, r.sub(), Labels); break;
      case 9: expect(w, LEN); mapEntry(r, r.sub(), Annotations); break;
      case 10: expect(w, LEN); IPFilters.push(ipFilter(r, r.sub())); break;
      case 11: expect(w, LEN); if (SessionAffinity.case) throw UNEXPECTED; SessionAffinity = { case: 'ClientIP', value: clientIPAffinity(r, r.sub()) }; break;
      case 12: expect(w, VARINT); InternalTrafficToLocal = r.bool(); break;
      case 13: expect(w, VARINT); HealthCheckNodePort = r.varint32(); break;
      case 14: expect(w, LEN); TrafficDistribution = r.string(); break;
      default: throw UNEXPECTED;
    }
  }
  return {
    $typeName: 'localv1.Service',
    Namespace,
    Name,
    Type,
    Labels,
    Annotations,
    IPs,
    IPFilters,
    MapIP,
    Ports,
    ExternalTrafficToLocal,
    SessionAffinity,
    InternalTrafficToLocal,
    HealthCheckNodePort,
    TrafficDistribution,
  };
}

/** fromBinary(ServiceSchema, bytes), or undefined for what only fromBinary takes (an unknown field, a message field twice, a wire type that does not match) */
export function decodeServiceFastOnly(bytes: Uint8Array): Service | undefined {
  try {
    return service(new Reader(bytes, 0, bytes.length));
  } catch (e) {
    if (e !== UNEXPECTED) throw e;
    return undefined;
  }
}
