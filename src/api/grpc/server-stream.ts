// Writing pre-encoded OpItems to a server stream without unbounded buffering.
//
// grpc-js's ServerDuplexStream is an objectMode Writable that hands one
// message at a time to HTTP/2 and waits for it to reach the socket, so a
// stream moves one message per event-loop turn (about 50-80k msg/s over
// 1,000 streams here). The Watch streams instead pass messages to the call
// below the Writable (grpc-js's public server-interceptor API) with a bounded
// window of bytes in flight: the completion callbacks are the same HTTP/2
// write completions the Writable waits for, so a client that stops reading
// stops the stream once the window is full (HTTP/2 flow control), exactly
// like write() returning false. Without the interceptor (or for other
// callers) it falls back to write() / 'drain'.
import * as grpc from '@grpc/grpc-js';

const rawCalls = new WeakMap<grpc.Metadata, grpc.ServerInterceptingCallInterface>();

/** Remembers each call's lower layer by its metadata object, which the handler's stream keeps. */
export const rawCallInterceptor: grpc.ServerInterceptor = (_method, call) => {
  const listener = new grpc.ServerListenerBuilder()
    .withOnReceiveMetadata((md, next) => {
      rawCalls.set(md, call);
      next(md);
    })
    .build();
  return new grpc.ServerInterceptingCall(call, { start: (next) => next(listener) });
};

export interface StreamWriterOptions {
  /** bytes allowed in flight per stream before waiting (default 64 KiB) */
  windowBytes?: number;
}

export class StreamWriter {
  /** message bytes written, including gRPC's 5-byte prefix */
  bytes = 0;
  messages = 0;
  private inflight = 0;
  private readonly window: number;
  private readonly raw?: grpc.ServerInterceptingCallInterface;
  private wake?: () => void;
  private closed = false;

  constructor(
    private readonly call: grpc.ServerDuplexStream<unknown, Buffer>,
    opts: StreamWriterOptions = {},
  ) {
    this.window = opts.windowBytes ?? 64 * 1024;
    this.raw = rawCalls.get(call.metadata);
  }

  /** Stops waiting for a stream that is gone (its callbacks never come). */
  close(): void {
    this.closed = true;
    this.wakeUp();
  }

  get isClosed(): boolean {
    return this.closed;
  }

  /** Returns a promise only when the caller must wait for the peer. */
  write(frame: Buffer): void | Promise<void> {
    if (this.closed) return;
    const n = frame.length + 5;
    this.bytes += n;
    this.messages++;
    if (this.raw) {
      this.inflight += n;
      this.raw.sendMessage(frame, () => {
        this.inflight -= n;
        if (this.inflight <= this.window / 2) this.wakeUp();
      });
      if (this.inflight < this.window) return;
    } else if (this.call.write(frame)) {
      return;
    }
    return new Promise<void>((resolve) => {
      this.wake = resolve;
      if (!this.raw) this.call.once('drain', () => this.wakeUp());
    });
  }

  private wakeUp() {
    const w = this.wake;
    this.wake = undefined;
    w?.();
  }
}
