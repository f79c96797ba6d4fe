// The Watch streams on the wire: the paths of /localv1.Sets/Watch and
// /globalv1.Sets/Watch from the generated descriptors, the clients' request
// encoding, and OpItem encoding by hand (src/api/opitem.ts).
//
// The server sends pre-encoded OpItems: a view's values carry the OpItem that
// sends them (made once for every node sharing it); other values (a node, a
// ServiceCIDR, views kept for in-process use) get theirs cached per value,
// keyed by its bytes object. Fanning one change out to N nodes encodes it
// once, not N times.
import { fromBinary, toBinary } from '@bufbuild/protobuf';
import * as L from '../gen/api/localv1/api_pb.js';
import * as G from '../gen/api/globalv1/api_pb.js';
import { encodeSetOp } from '../opitem.js';

function methodPath(svc: { typeName: string; method: { watch: { name: string } } }): string {
  return `/${svc.typeName}/${svc.method.watch.name}`;
}

export const LOCAL_WATCH_PATH = methodPath(L.Sets); // /localv1.Sets/Watch
export const GLOBAL_WATCH_PATH = methodPath(G.Sets); // /globalv1.Sets/Watch

const decodeOpItem = (b: Buffer): L.OpItem => fromBinary(L.OpItemSchema, b);

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

// --- OpItem encoding (src/api/opitem.ts), and a frame cache for values without their own

export { RESET_FRAME, SYNC_FRAME, encodeSetOp, encodeDeleteOp, encodeResumeOp } from '../opitem.js';

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
