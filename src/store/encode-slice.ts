// The store's canonical bytes of a slice, encoded by hand: the same bytes
// as protobuf-es's toBinary of each EndpointInfo (fields by number,
// proto3 defaults left out, a message field that is set written even when
// empty), checked by test/core/encode-slice.test.ts. Sources encode every
// slice they read, and toBinary would be most of a file source's parse
// (docs/design/slabs.md). An endpoint with anything this does not write (a
// Hash, a negative number, unknown fields) goes through toBinary.
import { toBinary } from '@bufbuild/protobuf';
import { EndpointInfoSchema, type EndpointInfo } from '../api/gen/api/globalv1/api_pb.js';
import { ProtoWriter } from '../api/proto-writer.js';
import { writeEndpoint } from '../api/fast-encode.js';

const utf8 = new TextEncoder();
const w = new ProtoWriter(4096);

const okInt = (v: number) => Number.isInteger(v) && v >= 0 && v <= 0xffffffff;

/** whether e or a message in it has unknown fields */
export function hasUnknownFields(e: EndpointInfo): boolean {
  if (e.$unknown?.length) return true;
  const ep = e.Endpoint;
  if (ep) {
    if (ep.$unknown?.length || ep.IPs?.$unknown?.length || ep.Scopes?.$unknown?.length) return true;
    for (const p of ep.PortOverrides) if (p.$unknown?.length) return true;
  }
  return !!(e.Conditions?.$unknown?.length || e.Topology?.$unknown?.length || e.Hints?.$unknown?.length);
}

/** whether writeInfo writes e exactly as toBinary would */
function writable(e: EndpointInfo): boolean {
  if (e.Hash !== 0n || hasUnknownFields(e)) return false;
  for (const p of e.Endpoint?.PortOverrides ?? []) if (!okInt(p.Port) || !okInt(p.Protocol)) return false;
  return true;
}

function writeInfo(e: EndpointInfo) {
  w.str(2, e.Namespace);
  w.str(3, e.SourceName);
  w.str(4, e.ServiceName);
  if (e.Endpoint) {
    const at = w.begin(6);
    writeEndpoint(w, e.Endpoint);
    w.end(at);
  }
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
  // a buffer of its own, of its size
  return encodeSliceTransient(serviceName, endpoints).slice();
}

/** encodeSlice's bytes in the encoder's own buffer: good until the next encoding (the store copies them into a slab) */
export function encodeSliceTransient(serviceName: string, endpoints: readonly EndpointInfo[]): Uint8Array {
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
  return w.buf.subarray(0, w.pos);
}
