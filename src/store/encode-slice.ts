// The store's canonical bytes of a slice, encoded by hand: the same bytes
// as protobuf-es's toBinary of each EndpointInfo (fields by number,
// proto3 defaults left out, a message field that is set written even when
// empty), checked by test/core/encode-slice.test.ts. Sources encode every
// slice they read; toBinary was most of a file source's parse (0.6 s of CPU
// at 30k slices). An endpoint with anything this does not write (a Hash, a
// negative number, unknown fields) goes through toBinary.
import { toBinary } from '@bufbuild/protobuf';
import { EndpointInfoSchema, type EndpointInfo } from '../api/gen/api/globalv1/api_pb.js';
import type { Endpoint, IPSet } from '../api/gen/api/localv1/api_pb.js';

const utf8 = new TextEncoder();

class Writer {
  buf = new Uint8Array(4096);
  pos = 0;

  ensure(n: number) {
    if (this.pos + n <= this.buf.length) return;
    const b = new Uint8Array(Math.max(this.buf.length * 2, this.pos + n));
    b.set(this.buf.subarray(0, this.pos));
    this.buf = b;
  }

  /** a non-negative integer below 2^32 */
  varint(v: number) {
    this.ensure(5);
    while (v > 0x7f) {
      this.buf[this.pos++] = (v & 0x7f) | 0x80;
      v >>>= 7;
    }
    this.buf[this.pos++] = v;
  }

  /** a string field (tag, length, UTF-8), even when empty: repeated fields write every element */
  string(field: number, s: string) {
    this.varint((field << 3) | 2);
    let ascii = true;
    for (let i = 0; i < s.length; i++) if (s.charCodeAt(i) > 0x7f) (ascii = false), (i = s.length);
    if (ascii) {
      this.varint(s.length);
      this.ensure(s.length);
      for (let i = 0; i < s.length; i++) this.buf[this.pos++] = s.charCodeAt(i);
      return;
    }
    const b = utf8.encode(s);
    this.varint(b.length);
    this.ensure(b.length);
    this.buf.set(b, this.pos);
    this.pos += b.length;
  }

  /** a singular string: left out when empty */
  str(field: number, s: string) {
    if (s !== '') this.string(field, s);
  }

  bool(field: number, v: boolean) {
    if (!v) return;
    this.varint(field << 3);
    this.varint(1);
  }

  uint(field: number, v: number) {
    if (v === 0) return;
    this.varint(field << 3);
    this.varint(v);
  }

  /** starts a message field: its tag and one byte for its length (end() makes room when it takes more) */
  begin(field: number): number {
    this.varint((field << 3) | 2);
    this.ensure(1);
    return this.pos++;
  }

  end(at: number) {
    const len = this.pos - at - 1;
    if (len < 0x80) {
      this.buf[at] = len;
      return;
    }
    let extra = 0;
    for (let v = len >>> 7; v > 0; v >>>= 7) extra++;
    this.ensure(extra);
    this.buf.copyWithin(at + 1 + extra, at + 1, this.pos);
    this.pos += extra;
    let v = len;
    let p = at;
    while (v > 0x7f) {
      this.buf[p++] = (v & 0x7f) | 0x80;
      v >>>= 7;
    }
    this.buf[p] = v;
  }
}

const w = new Writer();

const okInt = (v: number) => Number.isInteger(v) && v >= 0 && v <= 0xffffffff;

/** whether writeInfo writes e exactly as toBinary would */
function writable(e: EndpointInfo): boolean {
  if (e.Hash !== 0n || e.$unknown?.length) return false;
  const ep = e.Endpoint;
  if (ep) {
    if (ep.$unknown?.length || ep.IPs?.$unknown?.length || ep.Scopes?.$unknown?.length) return false;
    for (const p of ep.PortOverrides) if (p.$unknown?.length || !okInt(p.Port) || !okInt(p.Protocol)) return false;
  }
  return !e.Conditions?.$unknown?.length && !e.Topology?.$unknown?.length && !e.Hints?.$unknown?.length;
}

function writeIPs(field: number, ips: IPSet) {
  const at = w.begin(field);
  for (const s of ips.V4) w.string(1, s);
  for (const s of ips.V6) w.string(2, s);
  w.end(at);
}

function writeEndpoint(ep: Endpoint) {
  const at = w.begin(6);
  w.str(1, ep.Hostname);
  if (ep.IPs) writeIPs(2, ep.IPs);
  w.bool(3, ep.Local);
  for (const p of ep.PortOverrides) {
    const pa = w.begin(4);
    w.str(1, p.Name);
    w.uint(2, p.Port);
    w.uint(3, p.Protocol);
    w.end(pa);
  }
  if (ep.Scopes) {
    const sa = w.begin(5);
    w.bool(1, ep.Scopes.Internal);
    w.bool(2, ep.Scopes.External);
    w.bool(3, ep.Scopes.Cluster);
    w.end(sa);
  }
  w.bool(6, ep.Terminating);
  w.str(7, ep.NodeName);
  w.end(at);
}

function writeInfo(e: EndpointInfo) {
  w.str(2, e.Namespace);
  w.str(3, e.SourceName);
  w.str(4, e.ServiceName);
  if (e.Endpoint) writeEndpoint(e.Endpoint);
  if (e.Conditions) {
    const at = w.begin(7);
    w.bool(1, e.Conditions.Ready);
    w.bool(2, e.Conditions.Serving);
    w.bool(3, e.Conditions.Terminating);
    w.end(at);
  }
  w.str(8, e.PodName);
  if (e.Topology) {
    const at = w.begin(9);
    w.str(1, e.Topology.Node);
    w.str(2, e.Topology.Zone);
    w.end(at);
  }
  if (e.Hints) {
    const at = w.begin(10);
    for (const z of e.Hints.Zones) w.string(1, z);
    for (const n of e.Hints.Nodes) w.string(2, n);
    w.end(at);
  }
}

/** A slice's canonical bytes: the service name, a NUL, then each endpoint's encoding after its length (4 bytes, big-endian). */
export function encodeSlice(serviceName: string, endpoints: readonly EndpointInfo[]): Uint8Array {
  const name = utf8.encode(serviceName + '\0');
  w.pos = 0;
  w.ensure(name.length);
  w.buf.set(name, 0);
  w.pos = name.length;
  for (const e of endpoints) {
    w.ensure(4);
    const lenAt = w.pos;
    w.pos += 4;
    if (writable(e)) writeInfo(e);
    else {
      const b = toBinary(EndpointInfoSchema, e);
      w.ensure(b.length);
      w.buf.set(b, w.pos);
      w.pos += b.length;
    }
    const len = w.pos - lenAt - 4;
    w.buf[lenAt] = len >>> 24;
    w.buf[lenAt + 1] = (len >>> 16) & 0xff;
    w.buf[lenAt + 2] = (len >>> 8) & 0xff;
    w.buf[lenAt + 3] = len & 0xff;
  }
  // a buffer of its own, of its size
  return w.buf.slice(0, w.pos);
}
