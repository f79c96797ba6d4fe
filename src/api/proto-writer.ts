// A protobuf writer for kpng's hand-written encoders (fast-encode.ts,
// store/encode-slice.ts): proto3 rules as protobuf-es's toBinary applies
// them, so that their bytes are toBinary's (their tests compare). A nested
// message is written in place: begin() leaves one byte for its length and
// end() makes room when it takes more.
const utf8 = new TextEncoder();

export class ProtoWriter {
  buf: Uint8Array;
  pos = 0;

  constructor(size = 1024) {
    this.buf = new Uint8Array(size);
  }

  ensure(n: number): void {
    if (this.pos + n <= this.buf.length) return;
    const b = new Uint8Array(Math.max(this.buf.length * 2, this.pos + n));
    b.set(this.buf.subarray(0, this.pos));
    this.buf = b;
  }

  /** a varint; an int32 negative is 10 bytes (two's complement over 64 bits) */
  varint(v: number): void {
    this.ensure(10);
    if (v < 0) {
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

  /** a string field (tag, length, UTF-8), even when empty: repeated fields write every element */
  string(field: number, s: string): void {
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
    this.bytes(b);
  }

  /** a singular string: left out when empty */
  str(field: number, s: string): void {
    if (s !== '') this.string(field, s);
  }

  /** a singular bool: left out when false */
  bool(field: number, v: boolean): void {
    if (!v) return;
    this.varint(field << 3);
    this.varint(1);
  }

  /** a singular int32 or enum: left out when 0 */
  int(field: number, v: number): void {
    if (v === 0) return;
    this.varint(field << 3);
    this.varint(v);
  }

  /** raw bytes */
  bytes(b: Uint8Array): void {
    this.ensure(b.length);
    this.buf.set(b, this.pos);
    this.pos += b.length;
  }

  /** starts a message field: its tag and one byte for its length; returns where that byte is, for end() */
  begin(field: number): number {
    this.varint((field << 3) | 2);
    this.ensure(1);
    return this.pos++;
  }

  end(at: number): void {
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
