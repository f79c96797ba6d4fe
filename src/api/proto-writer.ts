// A protobuf writer for kpng's hand-written encoders (fast-encode.ts,
// store/encode-slice.ts): proto3 rules as protobuf-es's toBinary applies
// them, so that their bytes are toBinary's (their tests compare). A nested
// message is written in place: begin() leaves one byte for its length and
// end() makes room when it takes more.
const utf8 = new TextEncoder();

const varintSize = (v: number) => (v < 0x80 ? 1 : v < 0x4000 ? 2 : v < 0x200000 ? 3 : v < 0x10000000 ? 4 : 5);

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
    const n = s.length;
    if (n < 0x80) {
      // ASCII (most strings): one byte of length, a byte a character
      this.ensure(n + 1);
      const buf = this.buf;
      let p = this.pos + 1;
      let i = 0;
      for (; i < n; i++) {
        const c = s.charCodeAt(i);
        if (c > 0x7f) break;
        buf[p++] = c;
      }
      if (i === n) {
        buf[this.pos] = n;
        this.pos = p;
        return;
      }
    }
    // UTF-8 (at most 3 bytes a UTF-16 unit) straight into the buffer, after
    // the room its length takes if it is n bytes (it is at least n): moved
    // when its length takes more
    this.ensure(n * 3 + 10);
    const at = this.pos;
    const guess = varintSize(n);
    const { written } = utf8.encodeInto(s, this.buf.subarray(at + guess));
    const size = varintSize(written);
    if (size !== guess) this.buf.copyWithin(at + size, at + guess, at + guess + written);
    this.varint(written);
    this.pos += written;
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
