// A hand-written protobuf encoder for localv1.Endpoint, the most frequent
// message (one per endpoint per node view). Byte-identical to
// toBinary(EndpointSchema) (test/core/fast-encode.test.ts checks it), and
// several times faster: a cold sync encodes every endpoint once. One scratch
// writer is reused, so encoding allocates only its result. The store's slice
// encoder writes its endpoints with writeEndpoint too.
import type { Endpoint } from './gen/api/localv1/api_pb.js';
import { ProtoWriter } from './proto-writer.js';

const main = new ProtoWriter();

export function encodeEndpointFast(e: Endpoint): Uint8Array {
  main.pos = 0;
  writeEndpoint(main, e);
  return main.buf.slice(0, main.pos);
}

/**
 * Encodes endpoints one after the other into one buffer: endpoint i is
 * buf[starts[i], starts[i + 1]), and `tail` (if given) follows from
 * starts[list.length]. One allocation for all of a service's encodings
 * instead of one ArrayBuffer each (most of their memory).
 */
export function encodeEndpointsFast(list: readonly Endpoint[], tail?: Uint8Array): { buf: Uint8Array; starts: number[] } {
  main.pos = 0;
  const starts: number[] = [];
  for (const e of list) {
    starts.push(main.pos);
    writeEndpoint(main, e);
  }
  starts.push(main.pos);
  if (tail) main.bytes(tail);
  return { buf: main.buf.slice(0, main.pos), starts };
}

/** localv1.Endpoint's fields, as toBinary writes them */
export function writeEndpoint(w: ProtoWriter, e: Endpoint): void {
  w.str(1, e.Hostname);
  if (e.IPs) {
    const at = w.begin(2);
    for (const ip of e.IPs.V4) w.string(1, ip);
    for (const ip of e.IPs.V6) w.string(2, ip);
    w.end(at);
  }
  w.bool(3, e.Local);
  for (const p of e.PortOverrides) {
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
