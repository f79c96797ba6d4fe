// A hand-written protobuf encoder for localv1.Endpoint, the most frequent
// message (one per endpoint per node view). Byte-identical to
// toBinary(EndpointSchema) (test/core/fast-encode.test.ts checks it), and
// several times faster: a cold sync encodes every endpoint once. Two scratch
// writers are reused (Endpoint's submessages do not nest), so encoding
// allocates only its result.
import type { Endpoint } from './gen/api/localv1/api_pb.js';

const utf8 = new TextEncoder();

class Writer {
  buf = new Uint8Array(1024);
  pos = 0;

  private ensure(n: number) {
    if (this.pos + n <= this.buf.length) return;
    const b = new Uint8Array(Math.max(this.buf.length * 2, this.pos + n));
    b.set(this.buf.subarray(0, this.pos));
    this.buf = b;
  }

  varint(v: number) {
    this.ensure(10);
    if (v < 0) {
      // int32 negatives are 10-byte varints (two's complement over 64 bits)
      let lo = v >>> 0;
      let hi = 0xffffffff;
      for (let i = 0; i < 9; i++) {
        this.buf[this.pos++] = (lo & 0x7f) | 0x80;
        lo = (lo >>> 7) | ((hi & 0x7f) << 25);
        hi >>>= 7;
      }
      this.buf[this.pos++] = 1;
      return;
    }
    while (v > 0x7f) {
      this.buf[this.pos++] = (v & 0x7f) | 0x80;
      v >>>= 7;
    }
    this.buf[this.pos++] = v;
  }

  tag(field: number, wire: number) {
    this.varint((field << 3) | wire);
  }

  string(field: number, s: string) {
    this.tag(field, 2);
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

  bool(field: number, v: boolean) {
    this.tag(field, 0);
    this.varint(v ? 1 : 0);
  }

  /** appends a finished submessage from `sub` (which is then reset) */
  message(field: number, sub: Writer) {
    this.tag(field, 2);
    this.varint(sub.pos);
    this.ensure(sub.pos);
    // a byte loop: submessages are short, and subarray() would allocate
    const from = sub.buf;
    for (let i = 0; i < sub.pos; i++) this.buf[this.pos++] = from[i];
    sub.pos = 0;
  }

  /** appends raw bytes */
  bytes(b: Uint8Array) {
    this.ensure(b.length);
    this.buf.set(b, this.pos);
    this.pos += b.length;
  }
}

const main = new Writer();
const sub = new Writer();

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

function writeEndpoint(w: Writer, e: Endpoint): void {
  sub.pos = 0;
  if (e.Hostname) w.string(1, e.Hostname);
  if (e.IPs) {
    for (const ip of e.IPs.V4) sub.string(1, ip);
    for (const ip of e.IPs.V6) sub.string(2, ip);
    w.message(2, sub);
  }
  if (e.Local) w.bool(3, true);
  for (const p of e.PortOverrides) {
    if (p.Name) sub.string(1, p.Name);
    if (p.Port) (sub.tag(2, 0), sub.varint(p.Port));
    if (p.Protocol) (sub.tag(3, 0), sub.varint(p.Protocol));
    w.message(4, sub);
  }
  if (e.Scopes) {
    const s = e.Scopes;
    if (s.Internal) sub.bool(1, true);
    if (s.External) sub.bool(2, true);
    if (s.Cluster) sub.bool(3, true);
    w.message(5, sub);
  }
  if (e.Terminating) w.bool(6, true);
  if (e.NodeName) w.string(7, e.NodeName);
}
