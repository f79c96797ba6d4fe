// A Watch client that keeps watching: it opens the stream, sends a request,
// hands every OpItem to the consumer (awaiting it: the consumer's pace is
// the stream's pace), asks for the next diff only after a Sync was handled
// (kpng's flow control), and after any failure reopens the stream with
// exponential backoff and jitter. Every new stream starts with Reset and the
// full state; the consumer makes that invisible (FilterResetSink, or the api
// source's own diff).
import * as grpc from '@grpc/grpc-js';
import type { Logger } from '../../log.js';
import type { OpItem } from '../gen/api/localv1/api_pb.js';
import { grpcTarget, isLoopback, parseAddress, type ApiAddress } from './address.js';
import { channelCredentials, type ClientTLS } from './tls.js';
import { decodeOpItem, type WatchMethod } from './wire.js';
import { backoffDelay, sleep } from '../../backoff.js';

export interface WatchClientOptions {
  /** unix:///path, tcp://host:port or host:port */
  readonly address: string;
  readonly tls?: ClientTLS;
  readonly log: Logger;
  readonly signal: AbortSignal;
  /** first retry delay; doubles up to maxBackoffMs (each with +-50% jitter) */
  readonly minBackoffMs?: number;
  readonly maxBackoffMs?: number;
  /** extra request metadata */
  readonly metadata?: Record<string, string>;
}

export interface WatchHandler<Req> {
  /** the request to send (first, and after each Sync) */
  request(): Req;
  /** a new stream starts: what a broken one left half-done is void */
  streamStart?(): void;
  op(op: OpItem): void | Promise<void>;
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
  return new grpc.Client(grpcTarget(address), channelCredentials(tls), options);
}

/** Watches until the signal aborts; never throws for connection problems. */
export async function runWatch<Req>(opts: WatchClientOptions, method: WatchMethod<Req>, handler: WatchHandler<Req>): Promise<void> {
  const address = parseAddress(opts.address);
  if (!opts.tls && !isLoopback(address)) {
    opts.log.warn({ api: opts.address }, 'api: connecting without TLS to a non-loopback address');
  }
  const client = newClient(address, opts.tls);
  const min = opts.minBackoffMs ?? 200;
  const max = opts.maxBackoffMs ?? 10_000;
  let failures = 0;
  try {
    while (!opts.signal.aborted) {
      let synced = false;
      try {
        await watchOnce(client, opts, method, handler, () => {
          synced = true;
          failures = 0;
        });
      } catch (e) {
        if (opts.signal.aborted) break;
        const err = e as grpc.ServiceError;
        const delay = backoffDelay(failures, min, max);
        // log the first failure of a streak, then quietly retry
        if (failures === 0 || synced) opts.log.warn({ api: opts.address, code: err.code, err: err.details ?? err.message, retryMs: delay }, 'api: watch failed; reconnecting');
        else opts.log.debug({ api: opts.address, code: err.code, err: err.details ?? err.message, retryMs: delay }, 'api: still failing');
        failures++;
        await sleep(delay, opts.signal);
      }
    }
  } finally {
    client.close();
  }
}

async function watchOnce<Req>(
  client: grpc.Client,
  opts: WatchClientOptions,
  method: WatchMethod<Req>,
  handler: WatchHandler<Req>,
  onSync: () => void,
): Promise<void> {
  const md = new grpc.Metadata();
  for (const [k, v] of Object.entries(opts.metadata ?? {})) md.set(k, v);
  const call = client.makeBidiStreamRequest<Req, OpItem>(method.path, method.serialize, decodeOpItem, md, {});
  const onAbort = () => call.cancel();
  opts.signal.addEventListener('abort', onAbort, { once: true });
  try {
    handler.streamStart?.();
    call.write(handler.request());
    for await (const op of call as AsyncIterable<OpItem>) {
      await handler.op(op);
      if (op.Op.case === 'Sync') {
        onSync();
        if (opts.signal.aborted) break;
        call.write(handler.request());
      }
    }
    if (!opts.signal.aborted) throw Object.assign(new Error('server ended the watch'), { code: grpc.status.UNAVAILABLE });
  } finally {
    opts.signal.removeEventListener('abort', onAbort);
    call.cancel();
  }
}
