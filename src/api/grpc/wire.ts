// The Watch streams on the wire: grpc-js service definitions for
// /localv1.Sets/Watch and /globalv1.Sets/Watch built from the generated
// descriptors, and OpItem encoding by hand.
//
// The server sends pre-encoded OpItems: a Set op's Value.Bytes is the value's
// encoding that the views already made once for every node sharing it, and
// the whole OpItem is cached per value (keyed by its bytes object), so
// fanning one change out to N nodes encodes it once, not N times.
import { fromBinary, toBinary } from '@bufbuild/protobuf';
import type * as grpc from '@grpc/grpc-js';
import * as L from '../gen/api/localv1/api_pb.js';
import * as G from '../gen/api/globalv1/api_pb.js';

function methodPath(svc: { typeName: string; method: { watch: { name: string } } }): string {
  return `/${svc.typeName}/${svc.method.watch.name}`;
}

export const LOCAL_WATCH_PATH = methodPath(L.Sets); // /localv1.Sets/Watch
export const GLOBAL_WATCH_PATH = methodPath(G.Sets); // /globalv1.Sets/Watch

const identity = (b: Buffer) => b;
const decodeOpItem = (b: Buffer): L.OpItem => fromBinary(L.OpItemSchema, b);

/** server side: requests decoded, responses are already-encoded OpItems */
export const localServerDefinition: grpc.ServiceDefinition = {
  Watch: {
    path: LOCAL_WATCH_PATH,
    requestStream: true,
    responseStream: true,
    requestSerialize: (m: L.WatchReq) => Buffer.from(toBinary(L.WatchReqSchema, m)),
    requestDeserialize: (b: Buffer) => fromBinary(L.WatchReqSchema, b),
    responseSerialize: identity,
    responseDeserialize: decodeOpItem,
  },
};

export const globalServerDefinition: grpc.ServiceDefinition = {
  Watch: {
    path: GLOBAL_WATCH_PATH,
    requestStream: true,
    responseStream: true,
    requestSerialize: (m: G.GlobalWatchReq) => Buffer.from(toBinary(G.GlobalWatchReqSchema, m)),
    requestDeserialize: (b: Buffer) => fromBinary(G.GlobalWatchReqSchema, b),
    responseSerialize: identity,
    responseDeserialize: decodeOpItem,
  },
};

export interface WatchMethod<Req> {
  readonly path: string;
  readonly serialize: (req: Req) => Buffer;
}

export const localWatchMethod: WatchMethod<L.WatchReq> = {
  path: LOCAL_WATCH_PATH,
  serialize: (m) => Buffer.from(toBinary(L.WatchReqSchema, m)),
};

export const globalWatchMethod: WatchMethod<G.GlobalWatchReq> = {
  path: GLOBAL_WATCH_PATH,
  serialize: (m) => Buffer.from(toBinary(G.GlobalWatchReqSchema, m)),
};

export { decodeOpItem };

/**
 * kpng-ts: request metadata by which a global watcher asks for extra global
 * sets (comma-separated Set names, e.g. GlobalServiceCIDRInfos), since
 * GlobalWatchReq has no field for it. Without it, only kpng's sets are sent.
 */
export const GLOBAL_SETS_HEADER = 'kpng-global-sets';

// --- OpItem encoding (identical to toBinary(OpItemSchema, ...); tested)

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

/**
 * OpItem{Set: Value{Ref{set, path}, Bytes: bytes}}. With `own`, the frame
 * gets its own memory instead of a slice of Node's shared 8 KiB Buffer pool:
 * a long-lived slice would pin a whole pool slab that otherwise only holds
 * short-lived buffers (grpc-js allocates every message it sends there).
 */
export function encodeSetOp(set: number, path: string, bytes: Uint8Array, own = false): Buffer {
  const pb = Buffer.byteLength(path, 'utf8');
  const rl = refLen(set, pb);
  const vl = 1 + varintLen(rl) + rl + (bytes.length > 0 ? 1 + varintLen(bytes.length) + bytes.length : 0);
  const size = 1 + varintLen(vl) + vl;
  const buf = own ? Buffer.allocUnsafeSlow(size) : Buffer.allocUnsafe(size);
  let off = 0;
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

interface CachedFrame {
  readonly set: number;
  readonly path: string;
  readonly frame: Buffer;
}

// Values are immutable and each bytes object belongs to one value, so the
// frame lives exactly as long as the value does.
const frames = new WeakMap<Uint8Array, CachedFrame>();

/** encodeSetOp, cached per value: N nodes receiving one value share one frame */
export function setOpFrame(set: number, path: string, bytes: Uint8Array): Buffer {
  const c = frames.get(bytes);
  if (c && c.set === set && c.path === path) return c.frame;
  const frame = encodeSetOp(set, path, bytes, true);
  frames.set(bytes, { set, path, frame });
  return frame;
}
