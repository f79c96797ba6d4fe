// The global store: every Service, EndpointSlice, Node and ServiceCIDR a
// source reported, as kpng's global model. Its revision moves only when an
// update really changed something: writing what is already stored is a no-op
// (compared on canonical protobuf bytes), so resyncs and irrelevant status
// updates never wake anyone.
import { fromBinary, toBinary } from '@bufbuild/protobuf';
import { EndpointInfoSchema, NodeSchema, type EndpointInfo, type Node } from '../api/gen/api/globalv1/api_pb.js';
import { ServiceSchema, ServiceCIDRSchema, type PortMapping, type Service, type ServiceCIDR } from '../api/gen/api/localv1/api_pb.js';
import { bytesEqual, serviceKey } from '../api/model.js';
import { anyUnknownFields, compact, compactOne, pooled, sharedPorts } from '../api/compact.js';
import { flat } from '../runtime/memory.js';
import { decodeEndpointInfoAt, decodeEndpointInfoFast, decodeServiceFastOnly, scanEndpointAt, type ScannedEndpoint } from '../api/fast-decode.js';
import { encodeSlice, encodeSliceTransient, hasUnknownFields } from './encode-slice.js';
import { Slabs, type Slab, type SlabRef } from './slabs.js';
import { forEachPackedAt, isRaw, namesPrefix, packSlice, unpackSlice } from './slice-pack.js';
import { encodeServiceFast } from '../api/fast-encode.js';

export { encodeSlice };

export type Kind = 'services' | 'endpointSlices' | 'nodes' | 'serviceCIDRs';
export const KINDS: readonly Kind[] = ['services', 'endpointSlices', 'nodes', 'serviceCIDRs'];

export interface StoredService {
  readonly key: string;
  readonly service: Service;
  /** its canonical encoding (encodeServiceFast); encoded when read: read it once and keep it */
  readonly bytes: Uint8Array;
}

export interface StoredSlice {
  /** namespace/slice-name */
  readonly key: string;
  readonly namespace: string;
  readonly name: string;
  readonly serviceName: string;
  /** decoded from bytes when read (SliceRecord) */
  readonly endpoints: readonly EndpointInfo[];
  /** the canonical encoding (encodeSlice), put together when read (SliceRecord): read it once and keep it; never changes after */
  readonly bytes: Uint8Array;
  /** what a view reads of each endpoint, straight from the bytes; undefined when one of them is not as scanEndpointAt takes it (then read endpoints) */
  scanned?(): readonly ScannedEndpoint[] | undefined;
}

/**
 * An EndpointSlice as the store keeps it: its canonical bytes only, packed
 * (slice-pack.ts) in a shared slab (slabs.ts). The decoded endpoints are
 * most of a cluster's objects and are read only when a view is computed
 * (once per change in a node agent), so they are decoded then; the last few
 * decoded are kept, for the reads that come together.
 */
class SliceRecord implements StoredSlice, SlabRef {
  constructor(
    readonly key: string,
    readonly namespace: string,
    readonly serviceName: string,
    public slab: Slab,
    public off: number,
    readonly len: number,
  ) {}

  /** from the key (namespace/name): one string a slice less to keep */
  get name(): string {
    return this.key.slice(this.namespace.length + 1);
  }

  /** the bytes as packed */
  get packed(): Uint8Array {
    return this.slab.buf.subarray(this.off, this.off + this.len);
  }

  get bytes(): Uint8Array {
    return unpackSlice(this.packed, namesPrefix(this.namespace, this.name, this.serviceName));
  }

  /** the endpoints decoded afresh */
  decode(): readonly EndpointInfo[] {
    const packed = this.packed;
    if (isRaw(packed)) return decodeSliceEndpoints(packed.subarray(1));
    const out: EndpointInfo[] = [];
    const name = this.name;
    forEachPackedAt(packed, (buf, start, end, stripped) => {
      const e = decodeEndpoint(buf, start, end);
      // (a canonical encoding has each field once: one of these later in it would be a second)
      if (stripped) {
        if (e.Namespace === '') e.Namespace = this.namespace;
        if (e.SourceName === '') e.SourceName = name;
        if (e.ServiceName === '') e.ServiceName = this.serviceName;
      }
      out.push(e);
    });
    return out;
  }

  scanned(): readonly ScannedEndpoint[] | undefined {
    const recent = recentlyScanned.get(this);
    if (recent !== undefined) return recent ?? undefined;
    const packed = this.packed;
    const out: ScannedEndpoint[] = [];
    let all = !isRaw(packed);
    if (all)
      forEachPackedAt(packed, (buf, start, end) => {
        const e = all ? scanEndpointAt(buf, start, end) : undefined;
        if (e) out.push(e);
        else all = false;
      });
    // (a view's entry and the view itself read it one after the other)
    if (recentlyScanned.size >= RECENT_MAX) recentlyScanned.delete(recentlyScanned.keys().next().value!);
    recentlyScanned.set(this, all ? out : null);
    return all ? out : undefined;
  }

  get endpoints(): readonly EndpointInfo[] {
    let eps = recentlyDecoded.get(this);
    if (eps) return eps;
    eps = this.decode();
    if (recentlyDecoded.size >= RECENT_MAX) recentlyDecoded.delete(recentlyDecoded.keys().next().value!);
    recentlyDecoded.set(this, eps);
    return eps;
  }
}

/** A slice kept decoded as well (Store's keepDecodedSlices): for a process that computes many views of each slice. */
class DecodedSliceRecord extends SliceRecord {
  private readonly decoded: readonly EndpointInfo[];
  constructor(key: string, namespace: string, serviceName: string, slab: Slab, off: number, len: number, endpoints: readonly EndpointInfo[] | undefined) {
    super(key, namespace, serviceName, slab, off, len);
    this.decoded = compact(EndpointInfoSchema, endpoints ?? this.decode());
  }

  override get endpoints(): readonly EndpointInfo[] {
    return this.decoded;
  }

  // (decoded already: a view reads those)
  override scanned(): undefined {
    return undefined;
  }
}

const RECENT_MAX = 256;
const recentlyDecoded = new Map<SliceRecord, readonly EndpointInfo[]>();
const recentlyScanned = new Map<SliceRecord, readonly ScannedEndpoint[] | null>();

/**
 * A Service as the store keeps it: the compact message, not its bytes as
 * well (an ArrayBuffer each); they are encoded again when asked for, the
 * same bytes (checked when stored).
 */
class ServiceRecord implements StoredService {
  constructor(
    readonly key: string,
    readonly service: Service,
  ) {}

  get bytes(): Uint8Array {
    return encodeServiceFast(this.service);
  }
}

/** A Service whose compact copy does not encode as it came (unknown fields: compact leaves them out): its bytes kept as they came. */
class ServiceRecordWithBytes extends ServiceRecord {
  constructor(
    key: string,
    service: Service,
    private readonly own: Uint8Array,
  ) {
    super(key, service);
  }

  override get bytes(): Uint8Array {
    return this.own;
  }
}

export interface StoredNode {
  readonly node: Node;
  readonly bytes: Uint8Array;
}

export interface StoredServiceCIDR {
  readonly cidr: ServiceCIDR;
  readonly bytes: Uint8Array;
}

/** What one update changed. */
export interface StoreChange {
  readonly rev: number;
  /** services whose Service or EndpointSlices changed (ns/name) */
  readonly services: ReadonlySet<string>;
  /** slices set or deleted (ns/slice) */
  readonly slices: ReadonlySet<string>;
  readonly nodes: ReadonlySet<string>;
  readonly serviceCIDRs: boolean;
  /** true when this update completed the initial sync of every kind */
  readonly becameSynced: boolean;
}

export interface StoreTx {
  setService(svc: Service): void;
  /** setService with the Service as its canonical encoding (encodeServiceFast), by a source that converted it elsewhere (a worker thread) */
  setServiceBytes(bytes: Uint8Array): void;
  deleteService(namespace: string, name: string): void;
  setSlice(namespace: string, name: string, serviceName: string, endpoints: EndpointInfo[]): void;
  /** setSlice with the slice already encoded (encodeSlice), by a source that encoded it elsewhere (a worker thread) */
  setSliceBytes(namespace: string, name: string, serviceName: string, bytes: Uint8Array): void;
  deleteSlice(namespace: string, name: string): void;
  setNode(node: Node): void;
  deleteNode(name: string): void;
  setServiceCIDR(cidr: ServiceCIDR): void;
  deleteServiceCIDR(name: string): void;
  /** the source has delivered its full initial state of this kind */
  setSynced(kind: Kind): void;
}

type Listener = (change: StoreChange) => void;

export interface StoreOptions {
  /**
   * keep each EndpointSlice decoded as well as encoded: a brain (to-api)
   * computes a view of a slice for every class of node, and decoding it each
   * time costs more than keeping it; a node agent computes one
   */
  readonly keepDecodedSlices?: boolean;
}

/** What the store holds, shared by the Store (its reads) and each StoreTransaction (its writes). */
class StoreRecords {
  readonly services = new Map<string, StoredService>();
  readonly slices = new Map<string, SliceRecord>();
  readonly slabs = new Slabs();
  /** service key -> its slices' keys: the one key itself (most services), or a set */
  readonly slicesByService = new Map<string, string | Set<string>>();
  readonly nodes = new Map<string, StoredNode>();
  readonly cidrs = new Map<string, StoredServiceCIDR>();
  /** per-service version: moves when the service or one of its slices changes */
  readonly serviceVersions = new Map<string, number>();
  readonly synced = new Set<Kind>();
  /** updates that really changed something */
  revision = 0;
  /** writes and deletes received from sources, changed or not */
  events = 0;
  /** the last service version given */
  version = 0;

  constructor(readonly keepDecodedSlices: boolean) {}

  get allSynced(): boolean {
    return this.synced.size === KINDS.length;
  }

  /** the Service's key, the stored Service's copy of it if there is one: the maps by service share it */
  serviceKeyOf(namespace: string, name: string): string {
    const key = serviceKey(namespace, name);
    return this.services.get(key)?.key ?? key;
  }

  indexSlice(s: StoredSlice) {
    const key = this.serviceKeyOf(s.namespace, s.serviceName);
    const had = this.slicesByService.get(key);
    if (had === undefined || had === s.key) this.slicesByService.set(key, s.key);
    else if (typeof had === 'string') this.slicesByService.set(key, new Set([had, s.key]));
    else had.add(s.key);
  }

  unindexSlice(s: StoredSlice) {
    const key = serviceKey(s.namespace, s.serviceName);
    const had = this.slicesByService.get(key);
    if (had === s.key) this.slicesByService.delete(key);
    else if (typeof had === 'object') {
      had.delete(s.key);
      if (had.size === 1) for (const k of had) this.slicesByService.set(key, k);
    }
  }
}

/**
 * One update's writes (StoreTx) against the store's records: each is made
 * at once, with how to take it back (a batch that throws changes nothing),
 * and noted for the change the listeners hear.
 */
class StoreTransaction implements StoreTx {
  /** how to take back each write of this batch, newest last */
  private readonly undo: (() => void)[] = [];
  private readonly eventsBefore: number;
  private readonly wasSynced: boolean;
  private readonly services = new Set<string>();
  private readonly slices = new Set<string>();
  private readonly nodes = new Set<string>();
  private cidrsChanged = false;
  private syncFlipped = false;

  constructor(private readonly r: StoreRecords) {
    this.eventsBefore = r.events;
    this.wasSynced = r.allSynced;
  }

  setService(svc: Service): void {
    this.putService(svc);
  }

  setServiceBytes(bytes: Uint8Array): void {
    // (what the hand-written decoder does not take, fromBinary does: then its encoding is made again to compare)
    const fast = decodeServiceFastOnly(bytes);
    if (fast) this.putService(fast, bytes);
    else this.putService(fromBinary(ServiceSchema, bytes));
  }

  deleteService(namespace: string, name: string): void {
    const r = this.r;
    r.events++;
    const key = serviceKey(namespace, name);
    if (!r.services.has(key)) return;
    this.keep(r.services, key);
    r.services.delete(key);
    this.touchService(key);
  }

  setSlice(namespace: string, name: string, serviceName: string, endpoints: EndpointInfo[]): void {
    this.putSlice(namespace, name, serviceName, encodeSliceTransient(serviceName, endpoints), endpoints);
  }

  setSliceBytes(namespace: string, name: string, serviceName: string, bytes: Uint8Array): void {
    this.putSlice(namespace, name, serviceName, bytes, undefined);
  }

  deleteSlice(namespace: string, name: string): void {
    const r = this.r;
    r.events++;
    const key = flat(namespace, '/', name);
    const prev = r.slices.get(key);
    if (!prev) return;
    this.undo.push(() => {
      r.slabs.rehold(prev);
      r.slices.set(key, prev);
      r.indexSlice(prev);
    });
    r.slabs.release(prev);
    r.slices.delete(key);
    r.unindexSlice(prev);
    this.slices.add(key);
    this.touchService(r.serviceKeyOf(namespace, prev.serviceName));
  }

  setNode(node: Node): void {
    const r = this.r;
    r.events++;
    const bytes = toBinary(NodeSchema, node);
    const prev = r.nodes.get(node.Name);
    if (prev && bytesEqual(prev.bytes, bytes)) return;
    this.keep(r.nodes, node.Name);
    r.nodes.set(node.Name, { node: compact(NodeSchema, [node])[0], bytes });
    this.nodes.add(node.Name);
  }

  deleteNode(name: string): void {
    const r = this.r;
    r.events++;
    if (!r.nodes.has(name)) return;
    this.keep(r.nodes, name);
    r.nodes.delete(name);
    this.nodes.add(name);
  }

  setServiceCIDR(cidr: ServiceCIDR): void {
    const r = this.r;
    r.events++;
    const bytes = toBinary(ServiceCIDRSchema, cidr);
    const prev = r.cidrs.get(cidr.Name);
    if (prev && bytesEqual(prev.bytes, bytes)) return;
    this.keep(r.cidrs, cidr.Name);
    r.cidrs.set(cidr.Name, { cidr, bytes });
    this.cidrsChanged = true;
  }

  deleteServiceCIDR(name: string): void {
    const r = this.r;
    r.events++;
    if (!r.cidrs.has(name)) return;
    this.keep(r.cidrs, name);
    r.cidrs.delete(name);
    this.cidrsChanged = true;
  }

  setSynced(kind: Kind): void {
    const synced = this.r.synced;
    if (synced.has(kind)) return;
    this.undo.push(() => synced.delete(kind));
    synced.add(kind);
    this.syncFlipped = true;
  }

  /** Takes every write of the batch back, newest first. */
  rollBack(): void {
    for (let i = this.undo.length - 1; i >= 0; i--) this.undo[i]();
    this.r.events = this.eventsBefore;
  }

  /** The batch is done: the bookkeeping after it, and what it changed (undefined: nothing, no new revision). */
  commit(): StoreChange | undefined {
    const r = this.r;
    // a service gone for good (no Service, no slice) needs no version: the bookkeeping stays bounded
    for (const key of this.services) if (!r.services.has(key) && !r.slicesByService.has(key)) r.serviceVersions.delete(key);
    // after the batch: its undo needs every released record where it was
    if (r.slabs.wantsCompaction) r.slabs.compact(r.slices.values());
    if (!this.services.size && !this.slices.size && !this.nodes.size && !this.cidrsChanged && !this.syncFlipped) return undefined;
    return {
      rev: ++r.revision,
      services: this.services,
      slices: this.slices,
      nodes: this.nodes,
      serviceCIDRs: this.cidrsChanged,
      becameSynced: !this.wasSynced && r.allSynced,
    };
  }

  private touchService(key: string): void {
    const versions = this.r.serviceVersions;
    this.services.add(key);
    const prev = versions.get(key);
    this.undo.push(() => (prev === undefined ? versions.delete(key) : versions.set(key, prev)));
    versions.set(key, ++this.r.version);
  }

  /** undoes a map entry's change */
  private keep<V>(m: Map<string, V>, key: string): void {
    const prev = m.get(key);
    const had = m.has(key);
    this.undo.push(() => (had ? m.set(key, prev as V) : m.delete(key)));
  }

  private putSlice(namespace: string, name: string, serviceName: string, bytes: Uint8Array, endpoints: readonly EndpointInfo[] | undefined): void {
    const r = this.r;
    r.events++;
    const key = flat(namespace, '/', name);
    const prev = r.slices.get(key);
    // packed with prev's names, the bytes compare as prev's bytes would
    let packed = packSlice(bytes, namesPrefix(namespace, name, prev?.serviceName ?? serviceName));
    if (prev && bytesEqual(prev.packed, packed)) return;
    if (prev && prev.serviceName !== serviceName) packed = packSlice(bytes, namesPrefix(namespace, name, serviceName));
    const { slab, off } = r.slabs.put(packed);
    // the Service's own copies (compact pools them)
    const ns = pooled(namespace);
    const svcName = pooled(serviceName);
    const stored = r.keepDecodedSlices ? new DecodedSliceRecord(key, ns, svcName, slab, off, packed.length, endpoints) : new SliceRecord(key, ns, svcName, slab, off, packed.length);
    if (prev) r.slabs.release(prev);
    this.undo.push(() => {
      r.unindexSlice(stored);
      r.slabs.release(stored);
      if (prev) {
        r.slabs.rehold(prev);
        r.slices.set(key, prev);
        r.indexSlice(prev);
      } else r.slices.delete(key);
    });
    if (prev && prev.serviceName !== serviceName) r.unindexSlice(prev);
    r.slices.set(key, stored);
    r.indexSlice(stored);
    this.slices.add(key);
    if (prev && prev.serviceName !== serviceName) this.touchService(r.serviceKeyOf(namespace, prev.serviceName));
    this.touchService(r.serviceKeyOf(namespace, serviceName));
  }

  /** encoded: the Service's canonical encoding (encodeServiceFast), when the caller has it */
  private putService(svc: Service, encoded?: Uint8Array): void {
    const r = this.r;
    r.events++;
    const key = serviceKey(svc.Namespace, svc.Name);
    const prev = r.services.get(key);
    // encoded only to compare with a previous version or to keep (a new key, most of a first list, needs neither)
    if (prev && bytesEqual(prev.bytes, encoded ?? encodeServiceFast(svc))) return;
    const service = compactOne(ServiceSchema, svc);
    // (compact hands back a message with a prototype chain as it is: not ours to change)
    if (service !== svc) service.Ports = sharedPorts(service.Ports) as PortMapping[];
    this.keep(r.services, key);
    // its bytes are made again when read, unless compact's copy left something out
    r.services.set(key, anyUnknownFields(svc) ? new ServiceRecordWithBytes(key, service, encodeServiceFast(svc)) : new ServiceRecord(key, service));
    this.touchService(key);
  }
}

export class Store {
  private readonly r: StoreRecords;
  private readonly listeners = new Set<Listener>();

  constructor(opts: StoreOptions = {}) {
    this.r = new StoreRecords(opts.keepDecodedSlices ?? false);
  }

  /** revisions: updates that really changed something */
  get rev(): number { return this.r.revision; }
  /** writes and deletes received from sources, changed or not */
  get events(): number { return this.r.events; }
  get allSynced(): boolean { return this.r.allSynced; }

  isSynced(kind: Kind): boolean { return this.r.synced.has(kind); }

  /**
   * Applies a batch of writes atomically (a StoreTransaction); listeners
   * hear once if anything changed. A batch that throws changes nothing (its
   * writes are undone) and the error goes to the caller.
   */
  update(fn: (tx: StoreTx) => void): StoreChange | undefined {
    const tx = new StoreTransaction(this.r);
    try {
      fn(tx);
    } catch (e) {
      tx.rollBack();
      throw e;
    }
    const change = tx.commit();
    if (change) for (const l of this.listeners) l(change);
    return change;
  }

  /** Listeners run synchronously after each changing update; keep them cheap. */
  subscribe(l: Listener): () => void {
    this.listeners.add(l);
    return () => this.listeners.delete(l);
  }

  getService(key: string): StoredService | undefined { return this.r.services.get(key); }
  /** moves whenever the service or any of its slices changes; 0 if never seen (or gone) */
  serviceVersion(key: string): number { return this.r.serviceVersions.get(key) ?? 0; }
  /** services with a version kept (for tests: bounded by what exists) */
  get versionCount(): number { return this.r.serviceVersions.size; }
  /** slices' bytes stored, and bytes of the slabs holding them (for tests: bounded by what is stored) */
  get sliceBytes(): { readonly live: number; readonly held: number } { return { live: this.r.slabs.live, held: this.r.slabs.held }; }
  serviceKeys(): IterableIterator<string> { return this.r.services.keys(); }
  allServices(): IterableIterator<StoredService> { return this.r.services.values(); }

  /** whether some slice of this Service is stored */
  hasSlices(key: string): boolean { return this.r.slicesByService.has(key); }

  slicesOfService(key: string): StoredSlice[] {
    const keys = this.r.slicesByService.get(key);
    if (keys === undefined) return [];
    if (typeof keys === 'string') return [this.r.slices.get(keys)!];
    const out: StoredSlice[] = [];
    for (const k of [...keys].sort()) out.push(this.r.slices.get(k)!);
    return out;
  }
  getSlice(key: string): StoredSlice | undefined { return this.r.slices.get(key); }
  /**
   * A slice's endpoints decoded for one use, straight from its packed bytes,
   * and not kept among the recent decodes (a walk over every Service, as
   * `to-file --once` makes, would make them live long enough to reach V8's
   * old generation, garbage that grows with the cluster)
   */
  sliceEndpointsOnce(slice: StoredSlice): readonly EndpointInfo[] {
    return slice instanceof SliceRecord && !(slice instanceof DecodedSliceRecord) ? slice.decode() : slice.endpoints;
  }
  allSlices(): IterableIterator<StoredSlice> { return this.r.slices.values(); }

  getNode(name: string): StoredNode | undefined { return this.r.nodes.get(name); }
  allNodes(): IterableIterator<StoredNode> { return this.r.nodes.values(); }

  serviceCIDRs(): StoredServiceCIDR[] {
    return [...this.r.cidrs.values()].sort((a, b) => (a.cidr.Name < b.cidr.Name ? -1 : 1));
  }
}

/** A slice's endpoints from its canonical bytes (encodeSlice), decoded afresh (not through the store's cache of recent ones). */
export function decodeSliceEndpoints(bytes: Uint8Array): readonly EndpointInfo[] {
  let off = bytes.indexOf(0) + 1;
  const out: EndpointInfo[] = [];
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  while (off < bytes.length) {
    const len = view.getUint32(off);
    out.push(decodeEndpoint(bytes, off + 4, off + 4 + len));
    off += 4 + len;
  }
  return out;
}

function decodeEndpoint(buf: Uint8Array, start: number, end: number): EndpointInfo {
  const e = decodeEndpointInfoAt(buf, start, end);
  // fromBinary keeps unknown fields as views of what it decoded: of a copy, not of a whole slab
  return hasUnknownFields(e) ? decodeEndpointInfoFast(buf.slice(start, end)) : e;
}
