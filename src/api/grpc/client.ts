// A Watch client that keeps watching: it opens the stream, sends a request,
// hands every OpItem to the consumer (awaiting it: the consumer's pace is
// the stream's pace), asks for the next diff only after a Sync was handled
// (kpng's flow control), and after any failure reopens the stream with
// exponential backoff and jitter. Given several brains, it follows the
// client's own (rendezvous order of its name), fails over to the next one
// on an error or a silent stream (the watchdog) and goes back when its own
// answers again. Every new stream starts with Reset and the full state, or
// a Resume when the request said what the client holds; the consumer makes
// that invisible (a reset filter: kpng local's HeldState, FilterResetSink;
// or the api source's own diff).
import { createHash } from 'node:crypto';
import type * as grpc from '@grpc/grpc-js';
import { grpcJs } from '../../runtime/lazy.js';
import type { Logger } from '../../runtime/log.js';
import type { OpItem } from '../gen/api/localv1/api_pb.js';
import { grpcTarget, isLoopback, parseAddress, type ApiAddress } from './address.js';
import { channelCredentials, type ClientTLS } from './tls.js';
import { decodeOpItem, type WatchMethod } from './wire.js';
import { backoffDelay, sleep } from '../../runtime/backoff.js';

export interface WatchClientOptions {
  /** a brain (unix:///path, tcp://host:port or host:port), or several, comma-separated */
  readonly address: string;
  readonly tls?: ClientTLS;
  readonly log: Logger;
  readonly signal: AbortSignal;
  /** first retry delay; doubles up to maxBackoffMs (each with +-50% jitter) */
  readonly minBackoffMs?: number;
  readonly maxBackoffMs?: number;
  /** extra request metadata */
  readonly metadata?: Record<string, string>;
  /** with several brains: what orders them for this client (its node name), see brainOrder */
  readonly key?: string;
  /**
   * a stream's first answer (a kpng-ts brain's headers, sent once it can
   * answer, or else its first op) must come within this, and so must each
   * op of a diff after the one before (between diffs a brain is silent,
   * keepalive pings watch the connection); otherwise the brain is given up
   * (default 60 s)
   */
  readonly watchdogMs?: number;
  /** on another brain than its own: how often it checks whether its own answers again (default 30 s) */
  readonly failbackMs?: number;
  /** told of each stream: opened to a brain, that brain's state complete (each Sync), the stream gone */
  readonly onStream?: (brain: string, event: 'open' | 'synced' | 'closed') => void;
}

export const DEFAULT_WATCHDOG_MS = 60_000;
export const DEFAULT_FAILBACK_MS = 30_000;

export interface WatchHandler<Req> {
  /** the request to send: first on a new stream, then after each Sync */
  request(first: boolean): Req;
  /** a new stream starts: what a broken one left half-done is void */
  streamStart?(): void;
  op(op: OpItem): void | Promise<void>;
}

/** The brains of a comma-separated list. */
export function parseBrains(list: string): string[] {
  const brains = [...new Set(list.split(',').map((s) => s.trim()).filter(Boolean))];
  if (brains.length === 0) throw new Error(`${JSON.stringify(list)}: no API address`);
  for (const b of brains) parseAddress(b);
  return brains;
}

const weight = (key: string, brain: string) => createHash('sha256').update(key).update('\0').update(brain).digest().readUInt32BE(0);

/**
 * The order in which a client tries the brains: rendezvous hashing of its
 * key (the node name) with each brain, so nodes spread evenly over the
 * brains, the nodes of a brain that dies spread evenly over the others, and
 * adding or removing a brain moves only the nodes that pick (or picked) it.
 * The first is the client's own brain.
 */
export function brainOrder(brains: readonly string[], key: string): string[] {
  return brains
    .map((b) => ({ b, w: weight(key, b) }))
    .sort((x, y) => y.w - x.w || (x.b < y.b ? -1 : 1))
    .map((x) => x.b);
}

export function newClient(address: ApiAddress, tls: ClientTLS | undefined): grpc.Client {
  const options: grpc.ChannelOptions = {
    // notice a dead server or a half-open connection while idle on Watch
    'grpc.keepalive_time_ms': 30_000,
    'grpc.keepalive_timeout_ms': 10_000,
    'grpc.max_receive_message_length': 64 * 1024 * 1024,
    // reconnection pacing is ours (backoffDelay), not the channel's
    'grpc.initial_reconnect_backoff_ms': 100,
    'grpc.max_reconnect_backoff_ms': 2_000,
  };
  if (tls?.serverName) options['grpc.ssl_target_name_override'] = tls.serverName;
  if (address.kind === 'unix' && tls && !tls.serverName) options['grpc.ssl_target_name_override'] = 'localhost';
  return new (grpcJs().Client)(grpcTarget(address), channelCredentials(tls), options);
}

/**
 * Watches until the signal aborts; never throws for connection problems.
 * With several brains it follows its own (brainOrder) and, when a stream
 * fails or goes silent (the watchdog), the next one at once; a round of
 * failures over all of them backs off. While on another brain it checks its
 * own every failbackMs (a stream up to its first Sync) and goes back when
 * that one answers, between two diffs. Every switch is a new stream, which
 * the handler makes invisible (its reset filter, resume).
 */
export async function runWatch<Req>(opts: WatchClientOptions, method: WatchMethod<Req>, handler: WatchHandler<Req>): Promise<void> {
  const brains = brainOrder(parseBrains(opts.address), opts.key ?? '');
  for (const b of brains) {
    if (!opts.tls && !isLoopback(parseAddress(b))) opts.log.warn({ api: b }, 'api: connecting without TLS to a non-loopback address');
  }
  const clients = new Map<string, grpc.Client>();
  const clientOf = (b: string) => {
    let c = clients.get(b);
    if (!c) clients.set(b, (c = newClient(parseAddress(b), opts.tls)));
    return c;
  };
  const min = opts.minBackoffMs ?? 200;
  const max = opts.maxBackoffMs ?? 10_000;
  const watchdogMs = opts.watchdogMs ?? DEFAULT_WATCHDOG_MS;
  let failures = 0;
  let at = 0;
  try {
    while (!opts.signal.aborted) {
      const brain = brains[at];
      const stream = new StreamControl(opts.signal);
      let synced = false;
      let retryMs: number | undefined;
      // away from its own brain: go back as soon as it answers again
      const probing = at > 0 ? probeOwnBrain(clientOf(brains[0]), opts, method, handler, stream.signal, () => stream.leave()) : undefined;
      opts.onStream?.(brain, 'open');
      try {
        await watchOnce(clientOf(brain), opts, method, handler, stream, watchdogMs, () => {
          synced = true;
          failures = 0;
          opts.onStream?.(brain, 'synced');
        });
      } catch (e) {
        if (opts.signal.aborted) break;
        if (!stream.leaving) {
          const err = e as grpc.ServiceError;
          const next = brains[(at + 1) % brains.length];
          // one try per brain before backing off: a node goes on to its next brain at once (jitter only)
          retryMs = backoffDelay(Math.floor(failures / brains.length), min, max);
          // log the first failure of a streak, then quietly retry
          const fields = { api: brain, code: err.code, err: err.details ?? err.message, retryMs, ...(next !== brain ? { next } : {}) };
          if (failures === 0 || synced) opts.log.warn(fields, 'api: watch failed; reconnecting');
          else opts.log.debug(fields, 'api: still failing');
          failures++;
          at = (at + 1) % brains.length;
        }
      } finally {
        stream.close();
        opts.onStream?.(brain, 'closed');
        await probing;
      }
      if (retryMs !== undefined) {
        await sleep(retryMs, opts.signal);
        continue;
      }
      if (stream.leaving && !opts.signal.aborted) {
        opts.log.info({ api: brains[0], from: brain }, 'api: back on its own brain');
        at = 0;
        failures = 0;
      }
    }
  } finally {
    for (const c of clients.values()) c.close();
  }
}

/** One stream's life: aborted with the client, or to leave it for the client's own brain (between diffs). */
class StreamControl {
  private readonly ac = new AbortController();
  private readonly onAbort = () => this.ac.abort();
  /** no diff under way: a switch now cuts nothing short */
  betweenDiffs = false;
  leaving = false;

  constructor(private readonly outer: AbortSignal) {
    outer.addEventListener('abort', this.onAbort, { once: true });
  }

  get signal(): AbortSignal {
    return this.ac.signal;
  }

  leave(): void {
    this.leaving = true;
    if (this.betweenDiffs) this.ac.abort();
  }

  close(): void {
    this.outer.removeEventListener('abort', this.onAbort);
    this.ac.abort();
  }
}

/** Every failbackMs, a stream to the own brain up to its first Sync (then closed); healthy() on the first that completes. */
async function probeOwnBrain<Req>(client: grpc.Client, opts: WatchClientOptions, method: WatchMethod<Req>, handler: WatchHandler<Req>, signal: AbortSignal, healthy: () => void): Promise<void> {
  const watchdogMs = opts.watchdogMs ?? DEFAULT_WATCHDOG_MS;
  while (await sleep(opts.failbackMs ?? DEFAULT_FAILBACK_MS, signal)) {
    const call = client.makeBidiStreamRequest<Req, OpItem>(method.path, method.serialize, decodeOpItem, md(opts), {});
    const answered = await new Promise<boolean>((resolve) => {
      const t = setTimeout(() => resolve(false), watchdogMs);
      const done = (ok: boolean) => (clearTimeout(t), signal.removeEventListener('abort', onAbort), resolve(ok));
      const onAbort = () => done(false);
      signal.addEventListener('abort', onAbort, { once: true });
      call.on('data', (op: OpItem) => op.Op.case === 'Sync' && done(true));
      call.on('error', () => done(false));
      call.on('end', () => done(false));
      call.write(handler.request(true));
    });
    call.cancel();
    if (answered && !signal.aborted) return healthy();
  }
}

function md(opts: WatchClientOptions): grpc.Metadata {
  const m = new (grpcJs().Metadata)();
  for (const [k, v] of Object.entries(opts.metadata ?? {})) m.set(k, v);
  return m;
}

/** the watchdog's error: the brain is connected but does not answer */
function silence(ms: number): Error {
  return Object.assign(new Error(`no answer within ${ms} ms (watchdog)`), { code: grpcJs().status.DEADLINE_EXCEEDED, details: `no answer within ${ms} ms (watchdog)` });
}

async function watchOnce<Req>(
  client: grpc.Client,
  opts: WatchClientOptions,
  method: WatchMethod<Req>,
  handler: WatchHandler<Req>,
  stream: StreamControl,
  watchdogMs: number,
  onSync: () => void,
): Promise<void> {
  const call = client.makeBidiStreamRequest<Req, OpItem>(method.path, method.serialize, decodeOpItem, md(opts), {});
  const signal = stream.signal;
  const onAbort = () => call.cancel();
  signal.addEventListener('abort', onAbort, { once: true });
  const watchdog = new Watchdog(watchdogMs, () => call.cancel());
  // a kpng-ts brain sends its headers once it can answer: from then on its
  // first state may take as long as its queue of big diffs (keepalive
  // still watches the connection)
  let firstOp = false;
  call.on('metadata', () => {
    if (!firstOp) watchdog.pause();
  });
  try {
    handler.streamStart?.();
    call.write(handler.request(true));
    watchdog.watch(); // the first answer
    try {
      for await (const op of call as AsyncIterable<OpItem>) {
        watchdog.pause(); // the handler's time is not the brain's silence
        firstOp = true;
        stream.betweenDiffs = false;
        await handler.op(op);
        if (op.Op.case === 'Sync') {
          onSync();
          if (signal.aborted) break;
          stream.betweenDiffs = true;
          if (stream.leaving) return stream.leave();
          call.write(handler.request(false));
        } else watchdog.watch(); // the rest of this diff
      }
    } catch (e) {
      throw watchdog.fired ? silence(watchdogMs) : e;
    }
    if (watchdog.fired) throw silence(watchdogMs);
    if (!signal.aborted) throw Object.assign(new Error('server ended the watch'), { code: grpcJs().status.UNAVAILABLE });
  } finally {
    watchdog.stop();
    signal.removeEventListener('abort', onAbort);
    call.cancel();
  }
}

/**
 * Fires when watched for ms without a watch() since. One timer per stream,
 * not one per op (a first state is tens of thousands of ops): it checks the
 * time of the last watch() when it expires.
 */
class Watchdog {
  fired = false;
  private watching = false;
  private since = 0;
  private timer?: NodeJS.Timeout;

  constructor(
    private readonly ms: number,
    private readonly onFire: () => void,
  ) {}

  /** (re)starts the count */
  watch(): void {
    this.watching = true;
    this.since = performance.now();
    this.timer ??= setTimeout(() => this.check(), this.ms);
  }

  pause(): void {
    this.watching = false;
  }

  stop(): void {
    this.watching = false;
    clearTimeout(this.timer);
    this.timer = undefined;
  }

  private check(): void {
    this.timer = undefined;
    if (!this.watching) return;
    const left = this.ms - (performance.now() - this.since);
    if (left > 0) return void (this.timer = setTimeout(() => this.check(), left));
    this.fired = true;
    this.onFire();
  }
}
