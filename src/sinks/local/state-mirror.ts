// The state socket of `kpng local` (split mode), which has no store: what
// its backend received, as the reset filter holds it (held-state.ts),
// served read-only as /localv1.Sets/Watch on a unix socket of mode 0600,
// for kpng get, and what kpng status asks. Each answer is the whole state (Reset, Sets in kpng's
// order, Sync); the next request is answered when the state changed. A
// watch for another node is refused: this process knows only its own.
import net from 'node:net';
import { create, fromBinary } from '@bufbuild/protobuf';
import type { Logger } from '../../runtime/log.js';
import { LocalSet, encodeLocalNode } from '../../api/model.js';
import { NodeSchema, WatchReqSchema, type WatchReq } from '../../api/gen/api/localv1/api_pb.js';
import type { LocalOp, LocalSink } from '../../diff/ops.js';
import { parseAddress } from '../../api/grpc/address.js';
import { bindUnixSocket, type BoundSocket } from '../../api/grpc/unix-socket.js';
import { encodeSetOp, LOCAL_WATCH_PATH, RESET_FRAME, SYNC_FRAME } from '../../api/grpc/wire.js';
import { GrpcStatus, StreamServer, type ServerCall } from '../../api/grpc/h2-server.js';
import { StreamWriter } from '../../api/grpc/server-stream.js';
import { answerStatus, STATUS_PATH, type StatusReport } from '../../api/grpc/status.js';
import type { HeldState } from './held-state.js';

/** kpng's local op order for a full state: extra sets first, then services, then endpoints */
const ORDER = [LocalSet.NodesSet, LocalSet.ServiceCIDRsSet, LocalSet.ServicesSet, LocalSet.EndpointsSet];
const EXTRA = new Set([LocalSet.NodesSet, LocalSet.ServiceCIDRsSet]);

const newLocalNode = (name: string) => create(NodeSchema, { Name: name });

export class NodeStateMirror {
  private version = 0;
  private waiters: (() => void)[] = [];

  /** answers from what the reset filter holds (and knows the backend took): no copy of its own */
  constructor(private readonly held: HeldState) {}

  /** wraps the backend's sink: its Syncs are the state's versions */
  wrap(inner: LocalSink): LocalSink {
    return { send: (op) => (this.apply(op), inner.send(op)) };
  }

  apply(op: LocalOp): void {
    if (op.kind !== 'sync') return;
    this.version++;
    for (const w of this.waiters.splice(0)) w();
  }

  /** the state as one answer (frames), the extra sets only if asked; the node at least by name */
  frames(sets: readonly LocalSet[], node: string): Buffer[] {
    const out: Buffer[] = [RESET_FRAME];
    for (const set of ORDER) {
      if (EXTRA.has(set) && !sets.includes(set)) continue;
      const entries = [...this.held.entries(set)].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
      // a backend that did not ask for the node set still has a node
      if (set === LocalSet.NodesSet && !entries.length) out.push(encodeSetOp(set, node, encodeLocalNode(newLocalNode(node))));
      for (const [path, bytes] of entries) out.push(encodeSetOp(set, path, bytes));
    }
    out.push(SYNC_FRAME);
    return out;
  }

  /** resolves once the state moved past `seen` (a Sync arrived) */
  async changedSince(seen: number): Promise<number> {
    while (this.version === seen) await new Promise<void>((r) => this.waiters.push(r));
    return this.version;
  }

  get synced(): number {
    return this.version;
  }
}

/** Serves the mirror on a unix socket; undefined (one log line) when it cannot. */
export async function serveMirror(address: string, node: string, mirror: NodeStateMirror, log: Logger, status?: () => StatusReport, routes: ReadonlyMap<string, (call: ServerCall) => void> = new Map()): Promise<{ stop(): Promise<void> } | undefined> {
  if (!address || address === 'none') return undefined;
  let path: string;
  try {
    const a = parseAddress(address);
    if (a.kind !== 'unix') throw new Error('kpng local serves its state on a unix socket only');
    path = a.path;
  } catch (e) {
    log.info({ socket: address, reason: (e as Error).message }, 'state socket: not serving');
    return undefined;
  }
  const calls = new Set<ServerCall>();
  const serve = (call: ServerCall) => {
    calls.add(call);
    const writer = new StreamWriter(call);
    let seen = -1;
    let queue = Promise.resolve();
    call.listen({
      message: (bytes) => {
        let req: WatchReq;
        try {
          req = fromBinary(WatchReqSchema, bytes);
        } catch (e) {
          return call.end(GrpcStatus.INVALID_ARGUMENT, `cannot decode the request: ${(e as Error).message}`);
        }
        if (req.NodeName && req.NodeName !== node) return call.end(GrpcStatus.FAILED_PRECONDITION, `this node agent serves node ${node} only`);
        queue = queue.then(async () => {
          // the first answer once the backend has a state; later ones on change
          seen = seen < 0 && mirror.synced > 0 ? mirror.synced : await mirror.changedSince(Math.max(seen, 0));
          if (!call.isOpen) return;
          call.sendHeaders();
          for (const f of mirror.frames(req.Sets, node)) {
            const wait = writer.write(f);
            if (wait) await wait;
          }
          await writer.flush();
        });
      },
      end: () => call.end(),
      close: () => (calls.delete(call), writer.close()),
    });
  };
  // no keepalive: a local socket, and kpng get's calls are short
  const methods = new Map([[LOCAL_WATCH_PATH, serve], ...routes]);
  if (status) methods.set(STATUS_PATH, (call) => answerStatus(call, status));
  const server = new StreamServer(methods, { keepaliveMs: 0, keepaliveTimeoutMs: 0, idleMs: 5 * 60_000 });
  const listener = net.createServer((socket) => server.injectConnection(socket));
  let socket: BoundSocket;
  try {
    socket = await bindUnixSocket(path, 0o600, (privatePath) => new Promise<void>((resolve, reject) => {
      listener.once('error', reject);
      listener.listen(privatePath, () => (listener.off('error', reject), resolve()));
    }));
  } catch (e) {
    listener.close();
    log.info({ socket: address, reason: (e as Error).message }, 'state socket: not serving');
    return undefined;
  }
  listener.on('error', (e) => log.info({ socket: address, err: e.message }, 'state socket: listener failed'));
  log.info({ socket: address, node }, 'state socket: serving (kpng get)');
  return {
    async stop() {
      for (const c of calls) c.end();
      await server.close(100);
      await new Promise((resolve) => listener.close(resolve));
      socket.remove();
    },
  };
}
