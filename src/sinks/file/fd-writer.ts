// Text to a file descriptor through one reused buffer: strings written as
// they come are garbage at once (joined into large writes, they would
// outlive V8's young generation and grow its old one with the state).
import { writeSync } from 'node:fs';

/** bytes per write */
const SIZE = 1 << 20;

export class FdWriter {
  private readonly buf = Buffer.allocUnsafe(SIZE);
  private used = 0;

  constructor(private readonly fd: number) {}

  write(s: string): void {
    // UTF-8 takes at most 3 bytes per UTF-16 unit
    if (this.used + 3 * s.length > SIZE) this.flush();
    if (3 * s.length > SIZE) writeAll(this.fd, Buffer.from(s, 'utf8'));
    else this.used += this.buf.write(s, this.used, 'utf8');
  }

  flush(): void {
    writeAll(this.fd, this.buf.subarray(0, this.used));
    this.used = 0;
  }
}

function writeAll(fd: number, b: Uint8Array) {
  for (let off = 0; off < b.length; ) off += writeSync(fd, b, off, b.length - off);
}
