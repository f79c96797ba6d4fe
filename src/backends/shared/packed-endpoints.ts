// A Service's endpoints as one buffer of their encodings, for a proxier in
// `kpng local`: nothing else there keeps the node's endpoints decoded (the
// reset filter holds their bytes), and a decoded Endpoint costs about 300
// bytes of heap against about 45 encoded. They are decoded on each use: a
// backend reads a Service's endpoints only when it computes it again.
// Immutable: a change makes a new one, so a copy held back stays right.
// The bytes are kept as a one-byte string: 16 bytes of V8 heap besides them,
// where a Uint8Array of its own costs about 250 (its wrapper, ArrayBuffer
// and native backing store).
import type { Endpoint } from '../../api/model.js';
import { decodeEndpointFast } from '../../api/fast-decode.js';
import { encodeEndpointFast } from '../../api/fast-encode.js';

export class PackedEndpoints {
  static readonly EMPTY = new PackedEndpoints([], '');

  /** packed: per endpoint, in the order of keys, its length (u32, little-endian) then its encoding; latin1 */
  private constructor(
    readonly keys: readonly string[],
    private readonly packed: string,
  ) {}

  private get buf(): Buffer {
    return Buffer.from(this.packed, 'latin1');
  }

  get size(): number {
    return this.keys.length;
  }

  /** with the endpoint of this key set (its encoding when the caller has it) */
  with(key: string, ep: Endpoint, bytes?: Uint8Array): PackedEndpoints {
    const enc = bytes ?? encodeEndpointFast(ep);
    const i = this.keys.indexOf(key);
    const parts = this.parts();
    const keys = this.keys.slice();
    if (i >= 0) parts[i] = enc;
    else (keys.push(key), parts.push(enc));
    return new PackedEndpoints(keys, pack(parts));
  }

  /** without the endpoint of this key */
  without(key: string): PackedEndpoints {
    const i = this.keys.indexOf(key);
    if (i < 0) return this;
    const parts = this.parts();
    parts.splice(i, 1);
    return new PackedEndpoints(
      this.keys.filter((_, j) => j !== i),
      pack(parts),
    );
  }

  /** the endpoints, decoded now */
  *values(): Generator<Endpoint> {
    const b = this.buf;
    for (let at = 0; at < b.length; ) {
      const len = b[at] | (b[at + 1] << 8) | (b[at + 2] << 16) | (b[at + 3] << 24);
      yield decodeEndpointFast(b, at + 4, at + 4 + len);
      at += 4 + len;
    }
  }

  /** key, endpoint pairs */
  *entries(): Generator<[string, Endpoint]> {
    let i = 0;
    for (const ep of this.values()) yield [this.keys[i++], ep];
  }

  private parts(): Uint8Array[] {
    const out: Uint8Array[] = [];
    const b = this.buf;
    for (let at = 0; at < b.length; ) {
      const len = b[at] | (b[at + 1] << 8) | (b[at + 2] << 16) | (b[at + 3] << 24);
      out.push(b.subarray(at + 4, at + 4 + len));
      at += 4 + len;
    }
    return out;
  }
}

function pack(parts: readonly Uint8Array[]): string {
  let n = 0;
  for (const p of parts) n += 4 + p.length;
  const out = Buffer.allocUnsafe(n);
  let at = 0;
  for (const p of parts) {
    out[at] = p.length & 0xff;
    out[at + 1] = (p.length >> 8) & 0xff;
    out[at + 2] = (p.length >> 16) & 0xff;
    out[at + 3] = (p.length >>> 24) & 0xff;
    out.set(p, at + 4);
    at += 4 + p.length;
  }
  return out.toString('latin1');
}
