// A slice's bytes as its slab keeps them. Every endpoint's encoding repeats
// the slice's namespace, name and service name (fields 2, 3 and 4, first
// in it as toBinary writes them): a quarter of a slice's bytes in the
// bench's cluster, more with real names. They are left out of an endpoint
// that starts with exactly them, and put back when read.
//
// Packed: a marker byte PACKED, the header as it came (the service name,
// a NUL), then each endpoint after a 4-byte big-endian word, its length,
// with the top bit set when the names were left out. Bytes not framed as
// encodeSlice frames them are kept as they came, after a marker byte RAW.
// Packing with the same names is one-to-one: packed bytes compare as the
// bytes they came from.
import { ProtoWriter } from '../api/proto-writer.js';

const RAW = 0;
const PACKED = 1;
const STRIPPED = 0x80000000;

const out = new ProtoWriter(4096);
const names = new ProtoWriter(256);

const u32 = (b: Uint8Array, at: number) => ((b[at] << 24) | (b[at + 1] << 16) | (b[at + 2] << 8) | b[at + 3]) >>> 0;

function putU32(b: Uint8Array, at: number, v: number) {
  b[at] = v >>> 24;
  b[at + 1] = (v >>> 16) & 0xff;
  b[at + 2] = (v >>> 8) & 0xff;
  b[at + 3] = v & 0xff;
}

/** the names' fields as an endpoint's encoding starts with them; good until the next call */
export function namesPrefix(namespace: string, name: string, serviceName: string): Uint8Array {
  names.pos = 0;
  names.str(2, namespace);
  names.str(3, name);
  names.str(4, serviceName);
  return names.buf.subarray(0, names.pos);
}

function startsWith(b: Uint8Array, at: number, prefix: Uint8Array): boolean {
  for (let i = 0; i < prefix.length; i++) if (b[at + i] !== prefix[i]) return false;
  return true;
}

/** where the endpoints start: after the header's NUL (at 0 without one, as decodeSliceEndpoints reads it) */
const bodyStart = (bytes: Uint8Array) => bytes.indexOf(0) + 1;

/** A slice's canonical bytes packed; good until the next call (the store copies them into a slab). */
export function packSlice(bytes: Uint8Array, prefix: Uint8Array): Uint8Array {
  const start = bodyStart(bytes);
  for (let off = start; off < bytes.length; ) {
    const len = off + 4 <= bytes.length ? u32(bytes, off) : -1;
    if (len < 0 || len > bytes.length - off - 4) return raw(bytes);
    off += 4 + len;
  }
  out.pos = 0;
  out.ensure(bytes.length + 1);
  const b = out.buf;
  b[0] = PACKED;
  b.set(bytes.subarray(0, start), 1);
  let p = 1 + start;
  for (let off = start; off < bytes.length; ) {
    const len = u32(bytes, off);
    const body = off + 4;
    const cut = len >= prefix.length && startsWith(bytes, body, prefix) ? prefix.length : 0;
    putU32(b, p, cut ? (len - cut) | STRIPPED : len);
    b.set(bytes.subarray(body + cut, body + len), p + 4);
    p += 4 + len - cut;
    off = body + len;
  }
  return b.subarray(0, p);
}

function raw(bytes: Uint8Array): Uint8Array {
  out.pos = 0;
  out.ensure(bytes.length + 1);
  out.buf[0] = RAW;
  out.buf.set(bytes, 1);
  return out.buf.subarray(0, bytes.length + 1);
}

/** Calls fn with each endpoint's bytes as packed, and whether the names were left out of them. */
export function forEachPacked(packed: Uint8Array, fn: (bytes: Uint8Array, stripped: boolean) => void): void {
  forEachPackedAt(packed, (buf, start, end, stripped) => fn(buf.subarray(start, end), stripped));
}

/** forEachPacked, each endpoint's bytes as packed[start, end): no view object each (a view decodes every endpoint of its Service) */
export function forEachPackedAt(packed: Uint8Array, fn: (packed: Uint8Array, start: number, end: number, stripped: boolean) => void): void {
  let off = 1 + bodyStart(packed.subarray(1));
  while (off < packed.length) {
    const word = u32(packed, off);
    const len = word & ~STRIPPED;
    fn(packed, off + 4, off + 4 + len, word !== len);
    off += 4 + len;
  }
}

/** whether the slice was kept as it came (not framed as encodeSlice frames it) */
export const isRaw = (packed: Uint8Array) => packed[0] === RAW;

/** The canonical bytes back: a view of packed when kept as they came, else a buffer of their own. */
export function unpackSlice(packed: Uint8Array, prefix: Uint8Array): Uint8Array {
  if (isRaw(packed)) return packed.subarray(1);
  let size = packed.length - 1;
  forEachPacked(packed, (_, stripped) => {
    if (stripped) size += prefix.length;
  });
  const b = new Uint8Array(size);
  const start = bodyStart(packed.subarray(1));
  b.set(packed.subarray(1, 1 + start), 0);
  let p = start;
  forEachPacked(packed, (bytes, stripped) => {
    const len = bytes.length + (stripped ? prefix.length : 0);
    putU32(b, p, len);
    if (stripped) b.set(prefix, p + 4);
    b.set(bytes, p + 4 + len - bytes.length);
    p += 4 + len;
  });
  return b;
}
