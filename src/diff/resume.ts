// Resume (kpng-ts): a reconnecting node says what it holds, as digests of
// buckets of services, and the brain resends only the buckets whose digest
// differs from its own view of the node. Both sides compute the same thing
// from the same bytes, so any brain (another replica, a restarted one) can
// answer, with no brain instance id or revision to agree on.
//
// - A service's bucket: the first 4 bytes of SHA-256(ns/name), big-endian,
//   modulo the bucket count (a power of two). An endpoint is in its service's
//   bucket (its path is ns/svc/key).
// - An entry's digest: the first 8 bytes of SHA-256(set byte, path, 0x00,
//   value bytes); a bucket's digest is the XOR of its entries' digests, so
//   the order entries were received in does not matter.
// - NodesSet and ServiceCIDRsSet are in no bucket: a resume always resends
//   them (one node, a few CIDRs).
import { createHash } from 'node:crypto';
import { LocalSet } from '../api/model.js';
import type { ServiceView } from '../localstate/service-view.js';

export const DIGEST_BYTES = 8;
/** at most this many buckets (512 KiB of digests) */
export const MAX_BUCKETS = 1 << 16;

/** the hash of a service key that picks its bucket (any power-of-two count) */
export function keyHash(serviceKey: string): number {
  return createHash('sha256').update(serviceKey).digest().readUInt32BE(0);
}

export const bucketOf = (hash: number, buckets: number) => hash & (buckets - 1);

/** An entry's digest as two 32-bit words (the first 8 bytes of its SHA-256, little-endian words). */
export function entryDigest(set: LocalSet, path: string, bytes: Uint8Array): [number, number] {
  const d = createHash('sha256').update(Uint8Array.of(set)).update(path).update(Uint8Array.of(0)).update(bytes).digest();
  return [d.readUInt32LE(0), d.readUInt32LE(4)];
}

/** The service key of a ServicesSet or EndpointsSet path (ns/name, ns/svc/key). */
export function serviceKeyOf(set: LocalSet, path: string): string | undefined {
  if (set === LocalSet.ServicesSet) return path;
  if (set === LocalSet.EndpointsSet) {
    const i = path.lastIndexOf('/');
    return i > 0 ? path.slice(0, i) : undefined;
  }
  return undefined;
}

/** How many buckets a client holding this many services asks with: about 8 services a bucket. */
export function bucketCountFor(services: number): number {
  let n = 16;
  while (n < MAX_BUCKETS && n * 8 < services) n *= 2;
  return n;
}

/** The bucket count of HeldDigests, or undefined when they are not a power of two buckets of 8 bytes. */
export function heldBucketCount(held: Uint8Array): number | undefined {
  if (held.length === 0 || held.length % DIGEST_BYTES !== 0) return undefined;
  const n = held.length / DIGEST_BYTES;
  return n <= MAX_BUCKETS && (n & (n - 1)) === 0 ? n : undefined;
}

/** Bucket digests being summed (XOR) into their wire form. */
export class BucketDigests {
  readonly words: Uint32Array;
  constructor(readonly buckets: number) {
    this.words = new Uint32Array(buckets * 2);
  }

  add(bucket: number, d: readonly [number, number]): void {
    this.words[bucket * 2] ^= d[0];
    this.words[bucket * 2 + 1] ^= d[1];
  }

  /** HeldDigests: bucket i at bytes [8i, 8i+8) */
  toBytes(): Uint8Array {
    const out = Buffer.alloc(this.buckets * DIGEST_BYTES);
    for (let i = 0; i < this.words.length; i++) out.writeUInt32LE(this.words[i], i * 4);
    return out;
  }

  /** the buckets whose digest is not the one given (HeldDigests of the same count) */
  differing(held: Uint8Array): number[] {
    const b = Buffer.from(held.buffer, held.byteOffset, held.byteLength);
    const out: number[] = [];
    for (let i = 0; i < this.buckets; i++) {
      if (b.readUInt32LE(i * 8) !== this.words[i * 2] || b.readUInt32LE(i * 8 + 4) !== this.words[i * 2 + 1]) out.push(i);
    }
    return out;
  }
}

// A brain computes a view's digest once, for every node that gets that view
// (views are shared between nodes and immutable).
const viewDigests = new WeakMap<ServiceView, { hash: number; digest: [number, number] }>();

/** A service view's key hash and digest (its service and every endpoint). */
export function viewDigest(view: ServiceView): { hash: number; digest: [number, number] } {
  let v = viewDigests.get(view);
  if (v) return v;
  const digest = entryDigest(LocalSet.ServicesSet, view.key, view.bytes);
  for (const ep of view.endpoints) {
    const d = entryDigest(LocalSet.EndpointsSet, ep.path, ep.bytes);
    digest[0] ^= d[0];
    digest[1] ^= d[1];
  }
  v = { hash: keyHash(view.key), digest };
  viewDigests.set(view, v);
  return v;
}
