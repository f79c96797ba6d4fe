// Writing pre-encoded OpItems to a Watch stream without unbounded buffering.
//
// Messages are gathered and written as one buffer (a diff of a few messages
// is one HTTP/2 write; a full state goes in chunks of CHUNK_BYTES), with a
// bounded window of bytes in flight: the completion callbacks come when
// HTTP/2 has sent the bytes, so a client that stops reading stops the stream
// once the window is full (HTTP/2 flow control).
import { grpcFrames, type ServerCall } from './h2-server.js';

/** messages are written in buffers of about this size */
const CHUNK_BYTES = 16 * 1024;

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
  private wake?: () => void;
  private closed = false;
  private batch: Uint8Array[] = [];
  private batchBytes = 0;

  constructor(
    private readonly call: ServerCall,
    opts: StreamWriterOptions = {},
  ) {
    this.window = opts.windowBytes ?? 64 * 1024;
  }

  /** Stops waiting for a stream that is gone (its callbacks never come). */
  close(): void {
    this.closed = true;
    this.batch = [];
    this.wakeUp();
  }

  get isClosed(): boolean {
    return this.closed;
  }

  /** Queues one message; returns a promise only when the caller must wait for the peer. */
  write(message: Uint8Array): void | Promise<void> {
    if (this.closed) return;
    const n = message.length + 5;
    this.bytes += n;
    this.messages++;
    this.batch.push(message);
    this.batchBytes += n;
    if (this.batchBytes >= CHUNK_BYTES) return this.flush();
  }

  /** Writes the queued messages; returns a promise only when the caller must wait for the peer. */
  flush(): void | Promise<void> {
    this.writeBatch();
    return this.backpressure();
  }

  /** Writes messages already framed (grpcFrames), after those queued; returns a promise only when the caller must wait. */
  writeFramed(frames: Buffer, messages: number): void | Promise<void> {
    if (this.closed) return;
    this.bytes += frames.length;
    this.messages += messages;
    this.writeBatch();
    if (frames.length <= CHUNK_BYTES) {
      this.writeOut(frames);
      return this.backpressure();
    }
    return this.writeChunks(frames);
  }

  /** a big buffer in chunks, each within the window (HTTP/2 frames need not end with a message) */
  private async writeChunks(frames: Buffer): Promise<void> {
    for (let o = 0; o < frames.length && !this.closed; o += CHUNK_BYTES) {
      this.writeOut(frames.subarray(o, o + CHUNK_BYTES));
      await this.backpressure();
    }
  }

  private writeBatch(): void {
    if (this.closed || this.batch.length === 0) return;
    const frames = grpcFrames(this.batch, this.batchBytes);
    this.batch = [];
    this.batchBytes = 0;
    this.writeOut(frames);
  }

  private writeOut(frames: Buffer): void {
    const n = frames.length;
    this.inflight += n;
    this.call.write(frames, () => {
      this.inflight -= n;
      if (this.inflight <= this.window / 2) this.wakeUp();
    });
  }

  private backpressure(): void | Promise<void> {
    if (this.closed || this.inflight < this.window) return;
    return new Promise<void>((resolve) => (this.wake = resolve));
  }

  private wakeUp() {
    const w = this.wake;
    this.wake = undefined;
    w?.();
  }
}
