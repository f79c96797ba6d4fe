// Service views shared by every node that sees a service the same way.
//
// A node's view of a service depends on the node only through locality (does
// it host an endpoint, is it named in a node hint) and its zone (only if the
// endpoints carry zone hints). Nodes of the same "class" share one computed
// view, so one change costs one computation per class, not per node.
//
// The views of one service version also share their parts: a node-specific
// view (a node hosting an endpoint) reuses the shared view's Service and
// every endpoint that is the same for it, so memory grows with what differs
// per node, and each distinct value has one bytes object (encoded once for
// every node that is sent it).
import type { Store, StoredSlice } from '../store/store.js';
import { LocalSet, bytesEqual, decodeEndpoint, decodeService, type Endpoint, type Service } from '../api/model.js';
import { putSetOp, setOpSize } from '../api/opitem.js';
import { computeServiceView, DecodedEndpointView, type EndpointView, type ServiceView } from './service-view.js';
import type { EndpointFacts, NodeContext } from './topology.js';
import { encodeServiceFast } from '../api/fast-encode.js';

interface Entry {
  version: number;
  /** nodes hosting an endpoint of the service or named in a node hint (usually a few: an array) */
  specialNodes: readonly string[] | Set<string>;
  usesZones: boolean;
  /** views by node class: the first one inline (most services have one class per process) */
  firstClass?: string;
  firstView?: ServiceView;
  byClass?: Map<string, ServiceView | undefined>;
  /** distinct services and endpoints (by path) among this version's views, once a second view is interned */
  services?: LazyServiceView[];
  endpoints?: Map<string, LazyEndpointView[]>;
}

/** Every service's view for the nodes of a zone that are special to none of it, at one store revision (ServiceViews.generic). */
export interface GenericViews {
  readonly keys: readonly string[];
  /** keys[i]'s view (undefined: none, e.g. a service not proxied) */
  readonly views: readonly (ServiceView | undefined)[];
  /** per node, the indexes of the keys it is special to (hosts an endpoint, named in a hint) */
  readonly special: ReadonlyMap<string, readonly number[]>;
}

/** a node name no node has: its class is the generic one */
const NO_NODE = '\0';

export class ServiceViews {
  private readonly entries = new Map<string, Entry>();
  private generics = new Map<string, GenericViews>();
  private genericsRev = -1;
  private readonly unsubscribe: () => void;
  /** views computed (cache misses), for benchmarks and stats */
  computed = 0;

  // Slots: dense numbers for service keys, so that each LocalDiff keeps what
  // it sent in an array indexed by slot rather than in a Map per node (~45
  // bytes per service and node on the JS heap). A slot is reused only once
  // its service is gone and no LocalDiff holds a view in it.
  private readonly slots = new Map<string, number>();
  private readonly slotKeys: (string | undefined)[] = [];
  private readonly slotHolders: number[] = [];
  private readonly freeSlots: number[] = [];

  /** keep decoded values (in-process consumers read them all) or only their bytes (a server fanning out) */
  private readonly keepDecoded: boolean;

  constructor(
    private readonly store: Store,
    readonly proxyName = '',
    opts: { keepDecoded?: boolean } = {},
  ) {
    this.keepDecoded = opts.keepDecoded ?? true;
    // drop entries of deleted services as soon as the store forgets them
    this.unsubscribe = store.subscribe((change) => {
      // generic views are per revision: do not keep old ones alive
      if (this.generics.size) this.generics = new Map();
      for (const key of change.services) {
        if (!this.gone(key)) continue;
        this.entries.delete(key);
        const slot = this.slots.get(key);
        if (slot !== undefined && this.slotHolders[slot] === 0) this.freeSlot(slot);
      }
    });
  }

  private gone(key: string): boolean {
    return !this.store.getService(key) && this.store.slicesOfService(key).length === 0;
  }

  /** The slot of a service key (assigned on first use). */
  slot(key: string): number {
    let s = this.slots.get(key);
    if (s === undefined) {
      s = this.freeSlots.pop() ?? this.slotKeys.length;
      this.slots.set(key, s);
      this.slotKeys[s] = key;
      this.slotHolders[s] = 0;
    }
    return s;
  }

  /** The slot of a service key, if it has one. */
  existingSlot(key: string): number | undefined {
    return this.slots.get(key);
  }

  /** A LocalDiff now holds a view in this slot. */
  hold(slot: number): void {
    this.slotHolders[slot]++;
  }

  /** A LocalDiff no longer holds a view in this slot. */
  release(slot: number): void {
    if (--this.slotHolders[slot] > 0) return;
    const key = this.slotKeys[slot];
    if (key !== undefined && this.gone(key)) this.freeSlot(slot);
  }

  private freeSlot(slot: number) {
    const key = this.slotKeys[slot];
    if (key === undefined) return;
    this.slots.delete(key);
    this.slotKeys[slot] = undefined;
    this.freeSlots.push(slot);
  }

  /** services with views kept (for tests and stats) */
  get entryCount(): number {
    return this.entries.size;
  }

  /** slots in use (for tests and stats) */
  get slotCount(): number {
    return this.slots.size;
  }

  /** every slot number is below this */
  get slotLimit(): number {
    return this.slotKeys.length;
  }

  // View ids: a LocalDiff keeps the id of each view it sent in a typed array
  // (off the JS heap, 2 bytes per service and node while ids stay under
  // 65,536, else 4); a view stays known by its id while some LocalDiff holds it.
  private readonly table: ((ServiceView & HeldView) | undefined)[] = [undefined];
  private readonly tableRefs: number[] = [0];
  private readonly freeIds: number[] = [];
  /** The id of a view (from view()) a LocalDiff now holds; 0 is never an id. */
  ref(v: ServiceView): number {
    if (!(v instanceof HeldView)) throw new Error('ServiceViews.ref: not a view of these views');
    const lv = v as ServiceView & HeldView;
    if (lv.id === 0) {
      lv.id = this.freeIds.pop() ?? this.table.length;
      this.table[lv.id] = lv;
      this.tableRefs[lv.id] = 0;
    }
    this.tableRefs[lv.id]++;
    return lv.id;
  }

  /** A LocalDiff no longer holds this view. */
  unref(id: number): void {
    if (--this.tableRefs[id] > 0) return;
    this.table[id]!.id = 0;
    this.table[id] = undefined;
    this.freeIds.push(id);
  }

  viewById(id: number): ServiceView | undefined {
    return this.table[id];
  }

  /** Stops following the store (a ServiceViews that outlives its use would leak). */
  close(): void {
    this.unsubscribe();
    this.entries.clear();
  }

  /**
   * Every service's view as the nodes of this zone see it unless they are
   * special to it, and which nodes are special to which: a node's whole
   * state without looking each service up for it (a resuming node's first
   * diff), built once per zone and store revision.
   */
  generic(zone: string): GenericViews {
    if (this.genericsRev !== this.store.rev) {
      this.generics = new Map();
      this.genericsRev = this.store.rev;
    }
    let g = this.generics.get(zone);
    if (g) return g;
    const keys = [...this.store.serviceKeys()];
    const views = keys.map((k) => this.view(k, { name: NO_NODE, zone }));
    // every key's entry is current now: its special nodes are this revision's
    const special = new Map<string, number[]>();
    keys.forEach((k, i) => {
      for (const n of this.entries.get(k)?.specialNodes ?? []) {
        const l = special.get(n);
        if (l) l.push(i);
        else special.set(n, [i]);
      }
    });
    g = { keys, views, special };
    this.generics.set(zone, g);
    return g;
  }

  view(key: string, node: NodeContext): ServiceView | undefined {
    const version = this.store.serviceVersion(key);
    // a deleted service has no view; keeping an entry for it would leak one per delete
    if (version === 0) {
      this.entries.delete(key);
      return undefined;
    }
    let e = this.entries.get(key);
    // (looked up once for both: two map lookups a Service less in a first diff)
    let slices: StoredSlice[] | undefined;
    if (!e || e.version !== version) {
      slices = this.store.slicesOfService(key);
      e = this.newEntry(version, slices);
      this.entries.set(key, e);
    }
    const zone = e.usesZones ? `z:${node.zone}` : '*';
    const special = Array.isArray(e.specialNodes) ? e.specialNodes.includes(node.name) : (e.specialNodes as Set<string>).has(node.name);
    const cls = special ? `n:${node.name}|${zone}` : zone;
    if (e.firstClass === cls) return e.firstView;
    if (e.byClass?.has(cls)) return e.byClass.get(cls);
    const stored = this.store.getService(key);
    // the first view of an in-process consumer keeps its messages only (intern): not encoded
    const encoded = !(this.keepDecoded && e.firstClass === undefined);
    const computed = stored ? computeServiceView(stored.service, slices ?? this.store.slicesOfService(key), node, this.proxyName, encoded) : undefined;
    const view = computed && this.intern(e, computed);
    this.computed++;
    if (e.firstClass === undefined) {
      e.firstClass = cls;
      e.firstView = view;
    } else (e.byClass ??= new Map()).set(cls, view);
    return view;
  }

  /**
   * The view with the parts it has in common with this version's other views
   * replaced by theirs. Values are kept as their encoding only and decoded
   * when first read: a server fanning views out to nodes only sends bytes,
   * and the decoded messages would be most of a view's memory. Such a server
   * (keepDecoded false) keeps each value as the OpItem that sends it, the
   * values new in one computation packed in one buffer.
   */
  private intern(e: Entry, v: ServiceView): ServiceView {
    // in-process (one node): nothing to share; its messages are kept, their encodings are not
    if (this.keepDecoded && e.firstClass === undefined) {
      const eps = v.endpoints.every((ep) => ep instanceof DecodedEndpointView) ? v.endpoints : v.endpoints.map((ep) => new DecodedEndpointView(ep.path, ep.named, ep.endpoint));
      return new DecodedServiceView(v.key, v.service, eps);
    }
    const services = e.services ?? [];
    const known = (e.endpoints ??= new Map<string, LazyEndpointView[]>());
    const svc = services.find((x) => bytesEqual(x.bytes, v.bytes));
    const fresh: EndpointView[] = [];
    const shared = v.endpoints.map((ep) => {
      const same = known.get(ep.path)?.find((x) => x.named === ep.named && bytesEqual(x.bytes, ep.bytes));
      if (!same) fresh.push(ep);
      return same;
    });
    const frames = this.keepDecoded ? undefined : new FrameWriter(svc ? [] : [[LocalSet.ServicesSet, v.key, v.bytes]], fresh.map((ep) => [LocalSet.EndpointsSet, ep.path, ep.bytes]));
    let root = svc;
    if (!root) {
      root = frames ? frames.service(v.key) : new LazyServiceView(v.key, v.bytes, -1, NO_ENDPOINTS, undefined, v.service);
      e.services = services.concat(root);
    }
    let f = 0;
    const endpoints = v.endpoints.map((ep, i) => {
      const same = shared[i];
      if (same) return same;
      const variants = known.get(ep.path);
      // the path string of an earlier variant: one copy per path
      const path = variants ? variants[0].path : ep.path;
      const lazy = frames ? frames.endpoint(f++, path, ep.named) : new LazyEndpointView(path, ep.named, ep.bytes, -1, ep.endpoint);
      // arrays of their exact size (a pushed-to array keeps room for 16 more)
      known.set(ep.path, variants ? variants.concat(lazy) : [lazy]);
      return lazy;
    });
    return new LazyServiceView(v.key, NO_BYTES, -1, endpoints, root);
  }

  private newEntry(version: number, slices: readonly StoredSlice[]): Entry {
    // an array is a tenth of a Set's memory, and as fast to search when short:
    // a Set only past 16 nodes (and none made for the usual few)
    let few: string[] | undefined;
    let many: Set<string> | undefined;
    const add = (n: string) => {
      if (many) many.add(n);
      else if (!few) few = [n];
      else if (!few.includes(n)) {
        if (few.length < 16) few.push(n);
        else (many = new Set(few)).add(n);
      }
    };
    let usesZones = false;
    for (const slice of slices) {
      // (scanned: the view reads the same next, without decoding the slice)
      const eps: readonly EndpointFacts[] = slice.scanned?.() ?? slice.endpoints;
      for (let i = 0; i < eps.length; i++) {
        const info = eps[i];
        if (info.Topology?.Node) add(info.Topology.Node);
        const hints = info.Hints;
        if (hints) {
          for (let j = 0; j < hints.Nodes.length; j++) add(hints.Nodes[j]);
          if (hints.Zones.length > 0) usesZones = true;
        }
      }
    }
    // (exact size: a pushed-to array keeps room for 16 more)
    return { version, specialNodes: many ?? (few ? (few.length === 1 ? few : few.slice()) : NO_NODES), usesZones };
  }
}

const NO_BYTES = new Uint8Array(0);
const NO_NODES: string[] = [];
const NO_ENDPOINTS: readonly EndpointView[] = Object.freeze([]) as readonly EndpointView[];

// Classes, not object literals with getters: a literal's getter is a closure
// and a dictionary-mode object, several times the size of these.
abstract class HeldView {
  /** ServiceViews.ref's id while some LocalDiff holds this view (a field: no WeakMap for the GC to trace) */
  id = 0;
}

/**
 * A node agent's view (one node, in the process: keepDecoded): the messages
 * only. Their encodings are made when asked for (a diff comparing a changed
 * Service's two versions, the state socket), not kept: a buffer per view,
 * with its wrappers, would cost hundreds of bytes a Service for bytes
 * rarely read.
 */
class DecodedServiceView extends HeldView implements ServiceView {
  constructor(
    readonly key: string,
    readonly service: Service,
    readonly endpoints: readonly EndpointView[],
  ) {
    super();
  }
  get bytes(): Uint8Array {
    return encodeServiceFast(this.service);
  }
}

// A value's `data` is either its bytes (valueAt -1) or the OpItem Set frame
// that sends it, whose bytes start at valueAt: one object per value, and
// the frames of one computation share one buffer.
class LazyServiceView extends HeldView implements ServiceView {
  constructor(
    readonly key: string,
    private readonly data: Uint8Array,
    private readonly valueAt: number,
    readonly endpoints: readonly EndpointView[],
    private readonly from?: LazyServiceView,
    private decoded?: Service,
  ) {
    super();
  }
  get bytes(): Uint8Array {
    if (this.from) return this.from.bytes;
    return this.valueAt < 0 ? this.data : this.data.subarray(this.valueAt);
  }
  get frame(): Buffer | undefined {
    if (this.from) return this.from.frame;
    return this.valueAt < 0 ? undefined : (this.data as Buffer);
  }
  get service(): Service {
    if (this.from) return this.from.service;
    return (this.decoded ??= decodeService(this.bytes));
  }
}

class LazyEndpointView implements EndpointView {
  constructor(
    readonly path: string,
    readonly named: boolean,
    private readonly data: Uint8Array,
    private readonly valueAt: number,
    private decoded?: Endpoint,
  ) {}
  get bytes(): Uint8Array {
    return this.valueAt < 0 ? this.data : this.data.subarray(this.valueAt);
  }
  get frame(): Buffer | undefined {
    return this.valueAt < 0 ? undefined : (this.data as Buffer);
  }
  get endpoint(): Endpoint {
    return (this.decoded ??= decodeEndpoint(this.bytes));
  }
}

/** Encodes the OpItem frames of one computation's new values into one buffer. */
class FrameWriter {
  private readonly buf: Buffer;
  private readonly starts: number[] = [];
  private readonly valueAts: number[] = [];

  /** values: [set, path, bytes]; the service's (if any) first */
  constructor(
    private readonly svc: [LocalSet, string, Uint8Array][],
    endpoints: [LocalSet, string, Uint8Array][],
  ) {
    const all = [...svc, ...endpoints];
    let size = 0;
    for (const [set, path, bytes] of all) size += setOpSize(set, path, bytes.length);
    this.buf = Buffer.allocUnsafeSlow(size);
    let off = 0;
    for (const [set, path, bytes] of all) {
      this.starts.push(off);
      const at = putSetOp(this.buf, off, set, path, bytes);
      this.valueAts.push(at - off);
      off = at + bytes.length;
    }
    this.starts.push(off);
  }

  private frame(i: number): Buffer {
    return this.buf.subarray(this.starts[i], this.starts[i + 1]);
  }

  service(key: string): LazyServiceView {
    return new LazyServiceView(key, this.frame(0), this.valueAts[0], NO_ENDPOINTS);
  }

  /** the i-th endpoint given */
  endpoint(i: number, path: string, named: boolean): LazyEndpointView {
    const j = i + this.svc.length;
    return new LazyEndpointView(path, named, this.frame(j), this.valueAts[j]);
  }
}
