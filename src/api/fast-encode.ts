// A hand-written protobuf encoder for localv1.Endpoint, the most frequent
// message (one per endpoint per node view). Byte-identical to
// toBinary(EndpointSchema) (test/core/fast-encode.test.ts checks it), and
// several times faster: a cold sync encodes every endpoint once.
import type { Endpoint } from './gen/api/localv1/api_pb.js';

const utf8 = new TextEncoder();

class Writer {
  buf = new Uint8Array(128);
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
    const b = utf8.encode(s);
    this.tag(field, 2);
    this.varint(b.length);
    this.ensure(b.length);
    this.buf.set(b, this.pos);
    this.pos += b.length;
  }

  bool(field: number, v: boolean) {
    this.tag(field, 0);
    this.varint(v ? 1 : 0);
  }

  /** writes a length-delimited submessage */
  message(field: number, write: (w: Writer) => void) {
    const sub = new Writer();
    write(sub);
    this.tag(field, 2);
    this.varint(sub.pos);
    this.ensure(sub.pos);
    this.buf.set(sub.buf.subarray(0, sub.pos), this.pos);
    this.pos += sub.pos;
  }

  finish(): Uint8Array {
    return this.buf.slice(0, this.pos);
  }
}

export function encodeEndpointFast(e: Endpoint): Uint8Array {
  const w = new Writer();
  if (e.Hostname) w.string(1, e.Hostname);
  if (e.IPs) {
    const ips = e.IPs;
    w.message(2, (m) => {
      for (const ip of ips.V4) m.string(1, ip);
      for (const ip of ips.V6) m.string(2, ip);
    });
  }
  if (e.Local) w.bool(3, true);
  for (const p of e.PortOverrides) {
    w.message(4, (m) => {
      if (p.Name) m.string(1, p.Name);
      if (p.Port) (m.tag(2, 0), m.varint(p.Port));
      if (p.Protocol) (m.tag(3, 0), m.varint(p.Protocol));
    });
  }
  if (e.Scopes) {
    const s = e.Scopes;
    w.message(5, (m) => {
      if (s.Internal) m.bool(1, true);
      if (s.External) m.bool(2, true);
      if (s.Cluster) m.bool(3, true);
    });
  }
  if (e.Terminating) w.bool(6, true);
  if (e.NodeName) w.string(7, e.NodeName);
  return w.finish();
}
