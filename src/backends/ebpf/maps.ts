// The two maps kpng programs (services, endpoints) behind one interface: the
// kernel's (BpfMaps, through libbpf) or an in-memory one for tests
// (MemoryMaps). A write is a list of changes in a safe order: new endpoints
// first, then service values (their counts), then what went away, so a
// socket never picks an index that is not there yet.
import { BpfError, E2BIG, ENOSPC, mapOps, possibleCpus } from './libbpf.js';
import { COUNTERS, decode, encode, svcKeyString, type EpValue, type SvcKey, type SvcValue } from './layout.js';

export interface MapWrite {
  readonly setEndpoints: readonly { id: number; index: number; ep: EpValue }[];
  readonly setServices: readonly { key: SvcKey; value: SvcValue }[];
  readonly deleteServices: readonly SvcKey[];
  readonly deleteEndpoints: readonly { id: number; index: number }[];
}

export interface MapContents {
  readonly services: Map<string, { key: SvcKey; value: SvcValue }>;
  /** id -> endpoints by index (holes: undefined) */
  readonly endpoints: Map<number, (EpValue | undefined)[]>;
}

export type Counters = Record<(typeof COUNTERS)[number], number>;

export interface LbMaps {
  readonly capacity: { readonly services: number; readonly endpoints: number };
  /** everything in the two maps (a full sync, adoption) */
  read(): MapContents;
  write(w: MapWrite): void;
  /** the programs' counters, summed over CPUs */
  counters(): Counters;
}

/** A map that refused an entry because it is full: says which and how big. */
export class MapFullError extends Error {
  constructor(
    readonly map: 'services' | 'endpoints',
    readonly capacity: number,
  ) {
    super(`eBPF map kpng_${map} is full (${capacity} entries): raise --max-${map === 'services' ? 'service-ports' : 'endpoints'}`);
  }
}

/** The kernel's maps, by fd (kpng's object loaded, or the pinned maps adopted). */
export class BpfMaps implements LbMaps {
  private readonly k20 = Buffer.alloc(20);
  private readonly v16 = Buffer.alloc(16);
  private readonly k8 = Buffer.alloc(8);
  private readonly v20 = Buffer.alloc(20);
  private readonly cpus = possibleCpus();

  constructor(
    private readonly fds: { services: number; endpoints: number; counters: number },
    readonly capacity: { services: number; endpoints: number },
  ) {}

  read(): MapContents {
    const services = new Map<string, { key: SvcKey; value: SvcValue }>();
    const endpoints = new Map<number, (EpValue | undefined)[]>();
    // bounded: a map never holds more than its capacity
    let prev: Buffer | null = null;
    for (let i = 0; i <= this.capacity.services; i++) {
      const next = Buffer.alloc(20);
      if (!mapOps.nextKey(this.fds.services, prev, next)) break;
      prev = next;
      if (!mapOps.lookup(this.fds.services, next, this.v16)) continue;
      const key = decode.svcKey(next);
      if (key) services.set(svcKeyString(key), { key, value: decode.svcValue(this.v16) });
      else mapOps.delete(this.fds.services, next); // not kpng's writing: a program would act on it
    }
    prev = null;
    for (let i = 0; i <= this.capacity.endpoints; i++) {
      const next = Buffer.alloc(8);
      if (!mapOps.nextKey(this.fds.endpoints, prev, next)) break;
      prev = next;
      if (!mapOps.lookup(this.fds.endpoints, next, this.v20)) continue;
      const { id, index } = decode.epKey(next);
      const ep = decode.epValue(this.v20);
      let list = endpoints.get(id);
      if (!list) endpoints.set(id, (list = []));
      if (index < this.capacity.endpoints) list[index] = ep;
    }
    return { services, endpoints };
  }

  write(w: MapWrite): void {
    const full = (map: 'services' | 'endpoints', e: unknown) => (e instanceof BpfError && (e.errno === E2BIG || e.errno === ENOSPC) ? new MapFullError(map, this.capacity[map]) : e);
    try {
      this.batch(this.fds.endpoints, 8, 20, w.setEndpoints, (x, k, v) => (encode.epKey(x.id, x.index, k), encode.epValue(x.ep, v)));
    } catch (e) {
      throw full('endpoints', e);
    }
    try {
      this.batch(this.fds.services, 20, 16, w.setServices, (x, k, v) => (encode.svcKey(x.key, k), encode.svcValue(x.value, v)));
    } catch (e) {
      throw full('services', e);
    }
    for (const k of w.deleteServices) mapOps.delete(this.fds.services, encode.svcKey(k, this.k20));
    for (const x of w.deleteEndpoints) mapOps.delete(this.fds.endpoints, encode.epKey(x.id, x.index, this.k8));
  }

  /** one update for a few, batches of up to 4096 for more (one syscall each) */
  private batch<T>(fd: number, ks: number, vs: number, items: readonly T[], fill: (x: T, k: Buffer, v: Buffer) => void): void {
    if (items.length < 8) {
      const k = Buffer.alloc(ks);
      const v = Buffer.alloc(vs);
      for (const x of items) {
        fill(x, k, v);
        mapOps.update(fd, k, v);
      }
      return;
    }
    const CHUNK = 4096;
    for (let at = 0; at < items.length; at += CHUNK) {
      const part = items.slice(at, at + CHUNK);
      const keys = Buffer.alloc(ks * part.length);
      const values = Buffer.alloc(vs * part.length);
      part.forEach((x, i) => fill(x, keys.subarray(i * ks, (i + 1) * ks), values.subarray(i * vs, (i + 1) * vs)));
      mapOps.updateBatch(fd, keys, values, part.length);
    }
  }

  counters(): Counters {
    return readCounters(this.fds.counters, this.cpus);
  }
}

/** The programs' counters map (per CPU), summed. */
export function readCounters(fd: number, cpus = possibleCpus()): Counters {
  const out = Object.fromEntries(COUNTERS.map((c) => [c, 0])) as Counters;
  const key = Buffer.alloc(4);
  const values = Buffer.alloc(8 * cpus);
  COUNTERS.forEach((name, i) => {
    key.writeUInt32LE(i);
    if (!mapOps.lookup(fd, key, values)) return;
    let sum = 0n;
    for (let c = 0; c < cpus; c++) sum += values.readBigUInt64LE(c * 8);
    out[name] = Number(sum);
  });
  return out;
}

/** In memory, with the same capacity checks (tests). */
export class MemoryMaps implements LbMaps {
  readonly services = new Map<string, { key: SvcKey; value: SvcValue }>();
  readonly endpoints = new Map<string, EpValue>();
  writes = 0;
  ops = 0;
  constructor(readonly capacity = { services: 65536, endpoints: 262144 }) {}

  read(): MapContents {
    const endpoints = new Map<number, (EpValue | undefined)[]>();
    for (const [k, ep] of this.endpoints) {
      const [id, index] = k.split('/').map(Number);
      let list = endpoints.get(id);
      if (!list) endpoints.set(id, (list = []));
      list[index] = ep;
    }
    return { services: new Map([...this.services].map(([k, v]) => [k, { key: v.key, value: { ...v.value } }])), endpoints };
  }

  write(w: MapWrite): void {
    this.writes++;
    for (const x of w.setEndpoints) {
      const k = `${x.id}/${x.index}`;
      if (!this.endpoints.has(k) && this.endpoints.size >= this.capacity.endpoints) throw new MapFullError('endpoints', this.capacity.endpoints);
      this.endpoints.set(k, x.ep);
    }
    for (const x of w.setServices) {
      const k = svcKeyString(x.key);
      if (!this.services.has(k) && this.services.size >= this.capacity.services) throw new MapFullError('services', this.capacity.services);
      this.services.set(k, { key: x.key, value: x.value });
    }
    for (const k of w.deleteServices) this.services.delete(svcKeyString(k));
    for (const x of w.deleteEndpoints) this.endpoints.delete(`${x.id}/${x.index}`);
    this.ops += w.setEndpoints.length + w.setServices.length + w.deleteServices.length + w.deleteEndpoints.length;
  }

  counters(): Counters {
    return { translated: 0, refused: 0, missed: 0, reversed: 0 };
  }

  /** what a Service address resolves to: the endpoints (ip:port) of its list */
  resolve(key: SvcKey): { refuse: boolean; endpoints: string[]; affinitySecs: number } | undefined {
    const s = this.services.get(svcKeyString(key));
    if (!s) return undefined;
    const eps: string[] = [];
    for (let i = 0; i < s.value.count; i++) {
      const ep = this.endpoints.get(`${s.value.id}/${i}`);
      eps.push(ep ? `${ep.ip}:${ep.port}` : 'MISSING');
    }
    return { refuse: (s.value.flags & 1) !== 0, endpoints: eps, affinitySecs: s.value.affinitySecs };
  }
}
