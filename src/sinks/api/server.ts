// The API server (to-api): /localv1.Sets/Watch serves each node its
// node-local diff stream, /globalv1.Sets/Watch serves the global state.
//
// Flow control is kpng's: a stream gets Reset and the full state for its
// first WatchReq, then one diff (ending with Sync) per further WatchReq, and
// only when its view really changed. While a node has not asked, its
// changes coalesce in its LocalDiff (a set of dirty service keys, bounded by
// the cluster), so a slow node never makes the brain buffer diffs; when it
// asks, it gets one diff covering everything meanwhile. Writes wait for the
// peer (StreamWriter), and at most a few big diffs (first syncs, mass
// changes) are built and sent at once, so their op lists never pile up.
import { setFlagsFromString } from 'node:v8';
import { fromBinary } from '@bufbuild/protobuf';
import type { Logger } from '../../runtime/log.js';
import type { Store } from '../../store/store.js';
import type { ServiceViews } from '../../localstate/views.js';
import { LocalDiff } from '../../diff/local-diff.js';
import type { LocalOp } from '../../diff/ops.js';
import { LocalSet } from '../../api/model.js';
import { WatchReqSchema, type WatchReq } from '../../api/gen/api/localv1/api_pb.js';
import { GlobalWatchReqSchema } from '../../api/gen/api/globalv1/api_pb.js';
import { metrics } from '../../runtime/metrics.js';
import { apiMetrics } from './metrics.js';
import { formatAddress, isLoopback, parseAddress, type ApiAddress } from '../../api/grpc/address.js';
import { serverTLSOptions, type TLSFiles } from '../../api/grpc/tls.js';
import { StreamWriter } from '../../api/grpc/server-stream.js';
import { GrpcStatus, grpcFrames, StreamServer, type ServerCall } from '../../api/grpc/h2-server.js';
import { encodeDeleteOp, encodeResumeOp, encodeSetOp, GLOBAL_SETS_HEADER, GLOBAL_WATCH_PATH, LOCAL_WATCH_PATH, RESET_FRAME, setOpFrame, SYNC_FRAME } from '../../api/grpc/wire.js';
import { answerStatus, STATUS_PATH, type StatusReport } from '../../api/grpc/status.js';
import { GlobalDiff, GlobalEncoder, type GlobalOp } from './global-diff.js';
import { DEFAULT_HEAP_GROWTH_PERCENT } from './defaults.js';
import { ConnectionGate, DEFAULT_HANDSHAKE_TIMEOUT_MS, defaultMaxConnections, openFileLimit, RESERVED_FDS } from './listener.js';
import { bindUnixSocket, type BoundSocket } from '../../api/grpc/unix-socket.js';

/** extra local sets a client may ask for in WatchReq.Sets */
const LOCAL_EXTRA_SETS = new Set([LocalSet.NodesSet, LocalSet.ServiceCIDRsSet]);
const GLOBAL_EXTRA_SETS = new Set([LocalSet.GlobalServiceCIDRInfos]);
/** a diff that may touch more objects than this waits for a big-diff slot */
const BIG_DIFF = 1000;
/** a connection without a call for this long is closed (a node always has its Watch open) */
export const DEFAULT_CONNECTION_IDLE_MS = 5 * 60_000;

export interface ApiServerOptions {
  readonly store: Store;
  readonly views: ServiceViews;
  readonly log: Logger;
  /** unix:///path, tcp://host:port or host:port */
  readonly listen: string;
  readonly tls?: TLSFiles;
  /** allow a non-loopback TCP listener without TLS */
  readonly insecure?: boolean;
  readonly localApi?: boolean;
  readonly globalApi?: boolean;
  /** big diffs built and sent at once (default 2) */
  readonly bigDiffs?: number;
  /** bytes in flight per stream (default 64 KiB) */
  readonly windowBytes?: number;
  /** open connections at most (default: 10,000, less if the open-file limit is low: defaultMaxConnections) */
  readonly maxConnections?: number;
  /** the TLS handshake, then the HTTP/2 preface, must each come within this (default 10 s) */
  readonly handshakeTimeoutMs?: number;
  /** a connection that has no call for this long is closed (default 5 min) */
  readonly connectionIdleMs?: number;
  /** the node a local watch without a node name gets (a node agent's state socket: its own node) */
  readonly defaultNode?: string;
  /** a unix socket's mode (default 0660; a state socket 0600) */
  readonly socketMode?: number;
  /** what its start is logged as (default to-api) */
  readonly logName?: string;
  /** answers kpng status (on a unix socket only) */
  readonly status?: () => StatusReport;
  /** more methods to serve, by path (a node agent's state socket: its tenants' status) */
  readonly routes?: ReadonlyMap<string, (call: ServerCall) => void>;
}

type Api = 'local' | 'global';

export interface ApiServerStats {
  /** open Watch streams */
  streams: number;
  /** diffs sent completely */
  diffs: number;
  /** OpItems written, and their bytes with gRPC framing (5 bytes each) */
  messages: number;
  bytes: number;
}

class Semaphore {
  private waiting: (() => void)[] = [];
  constructor(private free: number) {}
  async acquire(): Promise<() => void> {
    if (this.free > 0) this.free--;
    else await new Promise<void>((r) => this.waiting.push(r));
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const next = this.waiting.shift();
      if (next) next();
      else this.free++;
    };
  }
}

/** Requests of one stream: each permits one diff; extra ones coalesce. */
class Requests<Req> {
  private latest?: Req;
  private count = 0;
  private ended = false;
  private wake?: () => void;

  push(r: Req) {
    this.latest = r;
    this.count = Math.min(this.count + 1, 1000);
    this.wakeUp();
  }

  end() {
    this.ended = true;
    this.wakeUp();
  }

  async next(): Promise<Req | undefined> {
    while (this.count === 0 && !this.ended) await new Promise<void>((r) => (this.wake = r));
    if (this.count === 0) return undefined;
    this.count--;
    return this.latest;
  }

  private wakeUp() {
    const w = this.wake;
    this.wake = undefined;
    w?.();
  }
}

export function localOpFrame(op: LocalOp): Buffer {
  switch (op.kind) {
    case 'reset': return op.resume ? encodeResumeOp(op.resume.resent, op.resume.buckets) : RESET_FRAME;
    case 'sync': return SYNC_FRAME;
    case 'set': return op.frame ?? setOpFrame(op.set, op.path, op.bytes);
    case 'delete': return encodeDeleteOp(op.set, op.path);
  }
}

function globalOpFrame(op: GlobalOp): Buffer {
  switch (op.kind) {
    case 'reset': return RESET_FRAME;
    case 'sync': return SYNC_FRAME;
    // a global value is sent under two paths: no frame cache
    case 'set': return encodeSetOp(op.set, op.path, op.bytes);
    case 'delete': return encodeDeleteOp(op.set, op.path);
  }
}

/** the wire bytes of op lists shared by many nodes (frozen: LocalDiff's transitions) */
const sharedFrames = new WeakMap<readonly unknown[], Buffer>();

export { DEFAULT_HEAP_GROWTH_PERCENT } from './defaults.js';

/**
 * V8 tuning for a process fanning full states out to many nodes (the to-api
 * sink calls it; an embedder may). A GC heuristic only, read at each GC, but
 * process-wide: hence not in the constructor.
 * - Pretenuring off: a node's first state is tens of thousands of messages
 *   whose objects live only until their write completes; V8's allocation-site
 *   pretenuring sees them survive a scavenge and starts allocating them in
 *   the old generation, which then fills with garbage: several times the
 *   full GCs and CPU for an initial sync (docs/design/h2-server.md).
 * - Heap growth: V8 lets the heap grow up to 4x what survived the last full
 *   GC, so a large initial sync peaks at several times the live heap.
 *   heapGrowthPercent (0: V8's own) bounds that in proportion to
 *   the cluster, where a fixed --max-old-space-size would crash a brain whose
 *   cluster outgrew it.
 */
export function tuneHeapForFanOut(heapGrowthPercent = DEFAULT_HEAP_GROWTH_PERCENT): void {
  setFlagsFromString('--no-allocation-site-pretenuring');
  if (heapGrowthPercent > 0) setFlagsFromString(`--heap-growing-percent=${heapGrowthPercent}`);
}

export class ApiServer {
  readonly stats: ApiServerStats = { streams: 0, diffs: 0, messages: 0, bytes: 0 };
  private readonly server: StreamServer;
  private readonly address: ApiAddress;
  private readonly enc = new GlobalEncoder();
  private readonly bigDiffs: Semaphore;
  private readonly active = new Set<(abort?: boolean) => void>();
  private boundAddress?: string;
  private gate?: ConnectionGate;
  private socket?: BoundSocket;

  constructor(private readonly opts: ApiServerOptions) {
    this.address = parseAddress(opts.listen);
    if (this.address.kind === 'tcp' && !isLoopback(this.address) && !opts.tls && !opts.insecure) {
      throw new Error(`refusing to serve the API on ${opts.listen} without TLS: give --tls-cert/--tls-key (and --tls-ca for client certificates), or --insecure`);
    }
    if (opts.localApi === false && opts.globalApi === false) throw new Error('both the local and the global API are disabled');
    this.bigDiffs = new Semaphore(opts.bigDiffs ?? 2);
    const methods = new Map<string, (call: ServerCall) => void>();
    if (opts.localApi !== false) methods.set(LOCAL_WATCH_PATH, (call) => this.serveLocal(call));
    if (opts.globalApi !== false) methods.set(GLOBAL_WATCH_PATH, (call) => this.serveGlobal(call));
    // what the process is: for whoever may open its socket (0600), not for a network listener's clients
    const status = opts.status;
    if (status && this.address.kind === 'unix') methods.set(STATUS_PATH, (call) => answerStatus(call, status));
    for (const [path, serve] of opts.routes ?? []) methods.set(path, serve);
    this.server = new StreamServer(methods, {
      // notice nodes that vanished without closing their connection
      keepaliveMs: 60_000,
      keepaliveTimeoutMs: 20_000,
      // a connection that did the handshake but holds no call (the gate bounds the handshake)
      idleMs: opts.connectionIdleMs ?? DEFAULT_CONNECTION_IDLE_MS,
    });
  }

  /** connections open now (in handshake or served) */
  get connections(): number {
    return this.gate?.open ?? 0;
  }

  /** Listens and serves; returns the address served (tcp port 0 becomes the real port). */
  async start(): Promise<string> {
    const a = this.address;
    const { log } = this.opts;
    const fdLimit = openFileLimit();
    const maxConnections = this.opts.maxConnections ?? defaultMaxConnections(fdLimit);
    if (this.opts.maxConnections !== undefined && fdLimit !== undefined && maxConnections > fdLimit - RESERVED_FDS) {
      log.warn({ maxConnections, fdLimit }, `to-api: --max-connections ${maxConnections} leaves fewer than ${RESERVED_FDS} of the ${fdLimit} file descriptors (ulimit -n) to the rest of kpng`);
    }
    // the gate accepts, caps, does TLS and bounds the handshake; the HTTP/2 server gets the connections it lets in
    const gate = new ConnectionGate({
      maxConnections,
      handshakeTimeoutMs: this.opts.handshakeTimeoutMs ?? DEFAULT_HANDSHAKE_TIMEOUT_MS,
      tls: serverTLSOptions(this.opts.tls),
      log,
      serve: (socket) => this.server.injectConnection(socket),
    });
    this.gate = gate;
    if (a.kind === 'unix') {
      this.socket = await bindUnixSocket(a.path, this.opts.socketMode ?? 0o660, (path) => gate.listen({ ...a, path }));
      this.boundAddress = formatAddress(a);
    } else {
      const port = await gate.listen(a);
      this.boundAddress = formatAddress({ ...a, port });
    }
    log.info(
      {
        listen: this.boundAddress,
        tls: !!this.opts.tls,
        mtls: !!this.opts.tls?.ca,
        local: this.opts.localApi !== false,
        global: this.opts.globalApi !== false,
        maxConnections,
      },
      `${this.opts.logName ?? 'to-api'}: serving`,
    );
    return this.boundAddress;
  }

  /** Ends every stream and stops listening (the unix socket file is removed if it is still this server's). */
  async stop(graceMs = 1000): Promise<void> {
    this.gate?.stopListening();
    for (const finish of [...this.active]) finish();
    await this.server.close(graceMs);
    await this.gate?.destroy();
    this.socket?.remove();
  }

  /** Kills every open stream at once (tests: simulate a dropped connection). */
  dropStreams(): void {
    for (const finish of [...this.active]) finish(true);
  }

  private track<Req>(api: Api, call: ServerCall, decode: (bytes: Buffer) => Req, onClose: () => void) {
    const writer = new StreamWriter(call, { windowBytes: this.opts.windowBytes });
    const requests = new Requests<Req>();
    let done = false;
    const finish = (abort = false) => {
      if (done) return;
      done = true;
      this.active.delete(finish);
      this.stats.streams--;
      apiMetrics.watchers.dec({ api });
      writer.close();
      requests.end();
      onClose();
      if (abort) call.end(GrpcStatus.UNAVAILABLE, 'stream dropped by the server');
      else call.end();
    };
    this.active.add(finish);
    this.stats.streams++;
    apiMetrics.watchers.inc({ api });
    call.listen({
      message: (bytes) => {
        let req: Req;
        try {
          req = decode(bytes);
        } catch (e) {
          this.opts.log.warn({ peer: call.peer, err: (e as Error).message }, `to-api: undecodable ${api} watch request; ending the stream`);
          call.end(GrpcStatus.INVALID_ARGUMENT, `cannot decode the request: ${(e as Error).message}`);
          return finish();
        }
        requests.push(req);
      },
      end: () => requests.end(),
      close: () => finish(),
    });
    return { writer, requests, finish };
  }

  private async send<Op>(api: Api, writer: StreamWriter, ops: readonly Op[], frameOf: (op: Op) => Buffer): Promise<void> {
    if (Object.isFrozen(ops)) {
      // ops shared by many nodes (one change fanned out): their wire bytes are built once
      let framed = sharedFrames.get(ops);
      if (!framed) sharedFrames.set(ops, (framed = grpcFrames(ops.map(frameOf))));
      this.stats.messages += ops.length;
      this.stats.bytes += framed.length;
      apiMetrics.apiMessages.inc({ api }, ops.length);
      apiMetrics.apiBytes.inc({ api }, framed.length);
      const wait = writer.writeFramed(framed, ops.length);
      if (wait) await wait;
      return;
    }
    let bytes = 0;
    for (const op of ops) {
      const f = frameOf(op);
      this.stats.messages++;
      this.stats.bytes += f.length + 5;
      bytes += f.length + 5;
      const wait = writer.write(f);
      if (wait) await wait;
      if (writer.isClosed) break;
    }
    const wait = writer.flush();
    if (wait) await wait;
    apiMetrics.apiMessages.inc({ api }, ops.length);
    apiMetrics.apiBytes.inc({ api }, bytes);
  }

  private serveLocal(call: ServerCall) {
    const log = this.opts.log;
    let diff: LocalDiff | undefined;
    let setsKey = '';
    let announced = false;
    const { writer, requests, finish } = this.track('local', call, (b) => fromBinary(WatchReqSchema, b), () => diff?.close());
    void (async () => {
      try {
        for (let req = await requests.next(); req && !writer.isClosed; req = await requests.next()) {
          const sets = [...new Set(req.Sets.filter((s) => LOCAL_EXTRA_SETS.has(s)))].sort();
          const nodeName = req.NodeName || this.opts.defaultNode || '';
          if (!diff || diff.nodeName !== nodeName || sets.join(',') !== setsKey) {
            // a new node (or new sets) on this stream starts over with Reset
            diff?.close();
            if (nodeName === '') log.warn({ peer: call.peer }, 'to-api: watch without a node name; no endpoint is local to it');
            log.debug({ node: nodeName, peer: call.peer, sets: sets.map((s) => LocalSet[s]) }, 'to-api: node watching');
            // a client that holds a state says so (HeldDigests): it gets a Resume, only what differs
            diff = new LocalDiff(this.opts.store, this.opts.views, nodeName, { sets, held: req.HeldDigests });
            setsKey = sets.join(',');
          }
          if (!announced) announced = await this.announce(call, diff, writer);
          await this.nextDiff('local', diff, writer, () => diff!.next(), localOpFrame);
        }
      } catch (e) {
        log.error({ err: (e as Error).stack ?? String(e) }, 'to-api: local watch failed');
      } finally {
        finish();
      }
    })();
  }

  private serveGlobal(call: ServerCall) {
    const log = this.opts.log;
    const asked = (call.header(GLOBAL_SETS_HEADER) ?? '')
      .split(',')
      .map((s) => LocalSet[s.trim() as keyof typeof LocalSet])
      .filter((s) => GLOBAL_EXTRA_SETS.has(s));
    const diff = new GlobalDiff(this.opts.store, this.enc, { sets: asked });
    const { writer, requests, finish } = this.track('global', call, (b) => fromBinary(GlobalWatchReqSchema, b), () => diff.close());
    log.debug({ peer: call.peer }, 'to-api: global watch');
    void (async () => {
      try {
        let announced = false;
        for (let req = await requests.next(); req && !writer.isClosed; req = await requests.next()) {
          if (!announced) announced = await this.announce(call, diff, writer);
          await this.nextDiff('global', diff, writer, () => diff.next(), globalOpFrame);
        }
      } catch (e) {
        log.error({ err: (e as Error).stack ?? String(e) }, 'to-api: global watch failed');
      } finally {
        finish();
      }
    })();
  }

  /**
   * Sends the response headers once this brain can answer (its source has
   * synced): a client's watchdog then knows the brain is alive and has it
   * queued, however long the first state takes to come (big diffs wait for
   * a slot); a brain that cannot answer sends nothing, and the client goes
   * to another one. Clients that do not look at headers are not affected.
   */
  private async announce(call: ServerCall, diff: LocalDiff | GlobalDiff, writer: StreamWriter): Promise<boolean> {
    await diff.changed();
    if (writer.isClosed) return false;
    call.sendHeaders();
    return true;
  }

  /** Waits for a non-empty diff and sends it (kpng: an empty diff is not answered). */
  private async nextDiff<Op>(api: Api, diff: LocalDiff | GlobalDiff, writer: StreamWriter, build: () => readonly Op[], frameOf: (op: Op) => Buffer): Promise<void> {
    while (!writer.isClosed) {
      await diff.changed();
      if (writer.isClosed) return;
      const release = diff.pendingSize > BIG_DIFF ? await this.bigDiffs.acquire() : undefined;
      try {
        if (writer.isClosed) return;
        const t0 = performance.now();
        const ops = build();
        if (ops.length === 0) continue;
        await this.send(api, writer, ops, frameOf);
        apiMetrics.apiDiffDuration.observe({ api }, (performance.now() - t0) / 1000);
        this.stats.diffs++;
        return;
      } finally {
        release?.();
      }
    }
  }
}
