// kpng's OpItem encoded by hand (identical to toBinary(OpItemSchema, ...);
// test/api/wire.test.ts checks it): the to-api server sends values it
// already holds encoded, so a Set op is only a few bytes around them.
export const SYNC_FRAME = Buffer.from([0x0a, 0x00]); // OpItem{Sync: {}}
export const RESET_FRAME = Buffer.from([0x22, 0x00]); // OpItem{Reset: {}}

function varintLen(n: number): number {
  let len = 1;
  while (n >= 0x80) {
    n = Math.floor(n / 128);
    len++;
  }
  return len;
}

function putVarint(buf: Buffer, off: number, n: number): number {
  while (n >= 0x80) {
    buf[off++] = (n & 0x7f) | 0x80;
    n = Math.floor(n / 128);
  }
  buf[off++] = n;
  return off;
}

function refLen(set: number, pathBytes: number): number {
  return (set !== 0 ? 1 + varintLen(set) : 0) + (pathBytes > 0 ? 1 + varintLen(pathBytes) + pathBytes : 0);
}

function putRef(buf: Buffer, off: number, set: number, path: string, pathBytes: number): number {
  if (set !== 0) {
    buf[off++] = 0x08; // Ref.Set, varint
    off = putVarint(buf, off, set);
  }
  if (pathBytes > 0) {
    buf[off++] = 0x12; // Ref.Path
    off = putVarint(buf, off, pathBytes);
    off += buf.write(path, off, 'utf8');
  }
  return off;
}

/** The size of OpItem{Set: Value{Ref{set, path}, Bytes}} for a value of valueLength bytes. */
export function setOpSize(set: number, path: string, valueLength: number): number {
  const rl = refLen(set, Buffer.byteLength(path, 'utf8'));
  const vl = 1 + varintLen(rl) + rl + (valueLength > 0 ? 1 + varintLen(valueLength) + valueLength : 0);
  return 1 + varintLen(vl) + vl;
}

/** Writes OpItem{Set: Value{Ref{set, path}, Bytes: bytes}} at off; returns where bytes start in buf. */
export function putSetOp(buf: Buffer, off: number, set: number, path: string, bytes: Uint8Array): number {
  const pb = Buffer.byteLength(path, 'utf8');
  const rl = refLen(set, pb);
  const vl = 1 + varintLen(rl) + rl + (bytes.length > 0 ? 1 + varintLen(bytes.length) + bytes.length : 0);
  buf[off++] = 0x12; // OpItem.Set
  off = putVarint(buf, off, vl);
  buf[off++] = 0x0a; // Value.Ref
  off = putVarint(buf, off, rl);
  off = putRef(buf, off, set, path, pb);
  if (bytes.length > 0) {
    buf[off++] = 0x12; // Value.Bytes
    off = putVarint(buf, off, bytes.length);
    buf.set(bytes, off);
  }
  return off;
}

/**
 * OpItem{Set: Value{Ref{set, path}, Bytes: bytes}}. With `own`, the frame
 * gets its own memory instead of a slice of Node's shared 8 KiB Buffer pool:
 * a long-lived slice would pin a whole pool slab that otherwise only holds
 * short-lived buffers (grpc-js allocates every message it sends there).
 */
export function encodeSetOp(set: number, path: string, bytes: Uint8Array, own = false): Buffer {
  const size = setOpSize(set, path, bytes.length);
  const buf = own ? Buffer.allocUnsafeSlow(size) : Buffer.allocUnsafe(size);
  putSetOp(buf, 0, set, path, bytes);
  return buf;
}

/** kpng-ts: OpItem{Resume: ResumeOp{Buckets (packed), BucketCount}} */
export function encodeResumeOp(buckets: readonly number[], bucketCount: number): Buffer {
  let packed = 0;
  for (const b of buckets) packed += varintLen(b);
  const inner = (packed > 0 ? 1 + varintLen(packed) + packed : 0) + (bucketCount > 0 ? 1 + varintLen(bucketCount) : 0);
  const buf = Buffer.allocUnsafe(1 + varintLen(inner) + inner);
  let off = 0;
  buf[off++] = 0x2a; // OpItem.Resume (5, length-delimited)
  off = putVarint(buf, off, inner);
  if (packed > 0) {
    buf[off++] = 0x0a; // ResumeOp.Buckets (1, packed)
    off = putVarint(buf, off, packed);
    for (const b of buckets) off = putVarint(buf, off, b);
  }
  if (bucketCount > 0) {
    buf[off++] = 0x10; // ResumeOp.BucketCount (2, varint)
    off = putVarint(buf, off, bucketCount);
  }
  return buf;
}

/** OpItem{Delete: Ref{set, path}} */
export function encodeDeleteOp(set: number, path: string): Buffer {
  const pb = Buffer.byteLength(path, 'utf8');
  const rl = refLen(set, pb);
  const buf = Buffer.allocUnsafe(1 + varintLen(rl) + rl);
  let off = 0;
  buf[off++] = 0x1a; // OpItem.Delete
  off = putVarint(buf, off, rl);
  putRef(buf, off, set, path, pb);
  return buf;
}

