// Per-node diff of the node-local state against what the node was last sent.
// Only services touched since the last diff are recomputed, so the cost of a
// change is proportional to the services it touched, not to the cluster.
import { create } from '@bufbuild/protobuf';
import { NodeSchema as LocalNodeSchema, IPSetSchema, type ServiceCIDR } from '../api/gen/api/localv1/api_pb.js';
import type { Node as GlobalNode } from '../api/gen/api/globalv1/api_pb.js';
import { LocalSet, bytesEqual, encodeLocalNode, encodeServiceCIDR, type LocalNode } from '../api/model.js';
import type { Store, StoreChange } from '../store/store.js';
import type { ServiceViews } from '../localstate/views.js';
import type { ServiceView, EndpointView } from '../localstate/service-view.js';
import type { NodeContext } from '../localstate/topology.js';
import type { LocalOp, LocalValue } from './ops.js';
import { StoreFollower } from './store-follower.js';
import { BucketDigests, bucketOf, heldBucketCount, viewDigest } from './resume.js';

export interface LocalDiffOptions {
  /** extra sets beyond services and endpoints (NodesSet, ServiceCIDRsSet) */
  sets?: readonly LocalSet[];
  /**
   * kpng-ts resume: the node's HeldDigests. The first diff is then a Resume
   * that carries only the buckets whose digest differs (src/diff/resume.ts);
   * ignored when not a valid bucket count.
   */
  held?: Uint8Array;
  /**
   * (one node's agent) make this node's views of what the store lists
   * while the lists go on, between their pages: the first diff then finds
   * them made, and the node is programmed sooner after the last page
   */
  viewsWhileListing?: boolean;
}

/** how long one step of the views made while listing holds the thread (ms) */
const LISTING_STEP_MS = 1;

// Set ops of views read the value only when a sink asks for it (a getter:
// `value` is not an own property): views keep values encoded, and a server
// sending them to nodes never decodes them.
class ViewSetOp {
  readonly kind = 'set';
  constructor(
    readonly set: LocalSet.ServicesSet | LocalSet.EndpointsSet,
    readonly path: string,
    private readonly view: ServiceView | EndpointView,
  ) {}
  get bytes(): Uint8Array { return this.view.bytes; }
  get frame(): Buffer | undefined { return this.view.frame; }
  get value(): LocalValue { return 'service' in this.view ? this.view.service : this.view.endpoint; }
}

const NODE_LABEL_PREFIXES = ['topology.kubernetes.io/', 'kubernetes.io/hostname'];

const NO_OPS: readonly LocalOp[] = Object.freeze([]);

/**
 * A later diff compares a view with the one sent by their encodings, which a
 * first diff never reads (nothing was sent): one view's encoding is made
 * now, so that the first change after a start does not meet the encoders
 * uncompiled (its diff would take several times as long as the next ones).
 * The view keeps its bytes, a few hundred.
 */
function warmEncoders(view: ServiceView): void {
  void view.bytes;
  for (const ep of view.endpoints) void ep.bytes;
}

/**
 * One change fanned out to many nodes: every node that moves from the same
 * view of the changed service to the same new one gets the same ops, built
 * once (frozen: a server may keep their wire bytes beside them). Keyed by
 * the view objects, which are never reused for another value.
 */
const transitions = new WeakMap<ServiceView, Map<ServiceView | undefined, readonly LocalOp[]>>();

/** a change of one Service's view, whose ops the next node making it reuses */
type Transition = { prev: ServiceView; view: ServiceView | undefined };

const desc = (a: string, b: string) => (a < b ? 1 : a > b ? -1 : 0);
const byPath = (a: EndpointView, b: EndpointView) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0);
const byKey = (a: ServiceView, b: ServiceView) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0);

/** What one diff found changed in the views, and its ops in kpng's order. */
class ViewChanges {
  readonly svcSets: ServiceView[] = [];
  readonly svcDeletes: string[] = [];
  readonly namedSets: EndpointView[] = [];
  readonly namedDeletes: string[] = [];
  readonly anonSets: EndpointView[] = [];
  readonly anonDeletes: string[] = [];

  endpointSet(ep: EndpointView): void {
    (ep.named ? this.namedSets : this.anonSets).push(ep);
  }

  /** Services set, then endpoints (deletes of unnamed, named sets, named deletes, unnamed sets), then Services deleted. */
  pushOps(ops: LocalOp[]): void {
    for (const v of this.svcSets.sort(byKey)) ops.push(new ViewSetOp(LocalSet.ServicesSet, v.key, v));
    for (const p of this.anonDeletes.sort(desc)) ops.push({ kind: 'delete', set: LocalSet.EndpointsSet, path: p });
    for (const e of this.namedSets.sort(byPath)) ops.push(new ViewSetOp(LocalSet.EndpointsSet, e.path, e));
    for (const p of this.namedDeletes.sort(desc)) ops.push({ kind: 'delete', set: LocalSet.EndpointsSet, path: p });
    for (const e of this.anonSets.sort(byPath)) ops.push(new ViewSetOp(LocalSet.EndpointsSet, e.path, e));
    for (const k of this.svcDeletes.sort(desc)) ops.push({ kind: 'delete', set: LocalSet.ServicesSet, path: k });
  }
}

export class LocalDiff extends StoreFollower {
  /**
   * what was last sent of each service: view ids (0: nothing) by the views'
   * slot of its key; 2 bytes each while every id fits (a brain keeps one of
   * these per node it serves), 4 once one does not
   */
  private sent: Uint16Array | Int32Array = new Uint16Array(0);
  private sentNode?: { node: LocalNode; bytes: Uint8Array };
  private readonly sentCIDRs = new Map<string, { cidr: ServiceCIDR; bytes: Uint8Array }>();
  private dirty = new Set<string>();
  private allDirty = true;
  private nodeDirty = true;
  private cidrsDirty = true;
  private first = true;
  private ctx: NodeContext;
  private readonly wantNode: boolean;
  private readonly wantCIDRs: boolean;
  private held?: Uint8Array;
  /** the Services listed whose views are still to be made before the first diff, and those made */
  private listing?: { keys: string[]; at: number; made: Set<string>; scheduled: boolean };

  constructor(
    store: Store,
    private readonly views: ServiceViews,
    readonly nodeName: string,
    opts: LocalDiffOptions = {},
  ) {
    super(store);
    this.wantNode = opts.sets?.includes(LocalSet.NodesSet) ?? false;
    this.wantCIDRs = opts.sets?.includes(LocalSet.ServiceCIDRsSet) ?? false;
    if (opts.held && heldBucketCount(opts.held)) this.held = opts.held;
    this.ctx = this.nodeContext();
    if (opts.viewsWhileListing && !store.allSynced) this.listing = { keys: [], at: 0, made: new Set(), scheduled: false };
  }

  protected note(c: StoreChange) {
    // (looking at everything next: the keys would be a Set entry per Service for nothing at a start)
    if (!this.allDirty) for (const k of c.services) this.dirty.add(k);
    const l = this.listing;
    if (l && !c.becameSynced) {
      for (const k of c.services) l.keys.push(k);
      if (!l.scheduled) {
        l.scheduled = true;
        setImmediate(() => this.makeListedViews());
      }
    }
    if (c.nodes.has(this.nodeName)) this.nodeDirty = true;
    if (c.serviceCIDRs) this.cidrsDirty = true;
  }

  get pending(): boolean {
    return this.first || this.allDirty || this.nodeDirty || this.cidrsDirty || this.dirty.size > 0;
  }

  /** How many services the next diff may look at: lets a server pace big diffs. */
  get pendingSize(): number {
    return this.first || this.allDirty ? Number.MAX_SAFE_INTEGER : this.dirty.size;
  }

  override close() {
    super.close();
    this.listing = undefined;
    this.forgetSent();
  }

  /**
   * One step of making the views of the Services listed so far, for this
   * node, between the lists' pages: the first diff then finds them made
   * instead of making them all after the last page. Each Service once,
   * when it and some slice of it are stored (a view made before the rest of
   * its slices came is made again by the first diff); only once the store
   * has this node (its zone picks the views). Steps of a millisecond, so
   * that a page waits little. Ends with the lists.
   */
  private makeListedViews(): void {
    const l = this.listing;
    if (!l) return;
    l.scheduled = false;
    if (this.store.allSynced || !this.first) {
      this.listing = undefined;
      return;
    }
    if (!this.store.getNode(this.nodeName)) return; // the next store change tries again
    const ctx = this.nodeContext();
    const end = performance.now() + LISTING_STEP_MS;
    try {
      while (l.at < l.keys.length) {
        const key = l.keys[l.at++];
        if (l.made.has(key) || !this.store.getService(key) || !this.store.hasSlices(key)) continue;
        l.made.add(key);
        this.views.view(key, ctx);
        if ((l.at & 7) === 0 && performance.now() > end) break;
      }
    } catch {
      // (a view that throws here would throw in the first diff too: left to it)
      this.listing = undefined;
      return;
    }
    if (l.at < l.keys.length) {
      l.scheduled = true;
      setImmediate(() => this.makeListedViews());
    } else {
      l.keys = [];
      l.at = 0;
    }
  }

  private forgetSent() {
    const sent = this.sent;
    this.sent = new Uint16Array(0);
    sent.forEach((id, slot) => {
      if (id === 0) return;
      this.views.unref(id);
      this.views.release(slot);
    });
  }

  private sentView(slot: number | undefined): ServiceView | undefined {
    return slot === undefined || slot >= this.sent.length ? undefined : this.views.viewById(this.sent[slot]);
  }

  private setSent(slot: number, view: ServiceView | undefined) {
    const beyond = slot >= this.sent.length;
    if (beyond && !view) return;
    const id = view ? this.views.ref(view) : 0;
    const wider = id > 0xffff && !(this.sent instanceof Int32Array);
    if (beyond || wider) {
      // by an eighth at least: a first diff meets a new slot at every Service,
      // and growing by a constant would copy the array once per few Services
      const length = beyond ? Math.max(slot + 1, this.views.slotLimit + 16, this.sent.length + (this.sent.length >> 3)) : this.sent.length;
      const grown = wider || this.sent instanceof Int32Array ? new Int32Array(length) : new Uint16Array(length);
      grown.set(this.sent);
      this.sent = grown;
    }
    const old = this.sent[slot];
    this.sent[slot] = id;
    if (view && !old) this.views.hold(slot);
    if (old) {
      this.views.unref(old);
      if (!view) this.views.release(slot);
    }
  }

  /** Forgets what was sent: the next diff is a Reset and the full state. */
  reset() {
    this.forgetSent();
    this.sentNode = undefined;
    this.sentCIDRs.clear();
    this.held = undefined;
    this.first = true;
    this.allDirty = this.nodeDirty = this.cidrsDirty = true;
  }

  private nodeContext(): NodeContext {
    const n = this.store.getNode(this.nodeName)?.node;
    return { name: this.nodeName, zone: n?.Topology?.Zone ?? '' };
  }

  /**
   * The next change set in kpng's order, ending with Sync; empty when this
   * node's view did not change. The first one starts with Reset and always
   * ends with Sync, even for an empty cluster.
   */
  next(): readonly LocalOp[] {
    if (!this.store.allSynced) return NO_OPS;
    const first = this.first;
    this.first = false;

    if (this.nodeDirty) {
      const ctx = this.nodeContext();
      if (ctx.zone !== this.ctx.zone) this.allDirty = true; // topology of every service may change
      this.ctx = ctx;
    }
    const single = first ? undefined : this.singleChange();
    if (single?.ops) return single.ops;
    const resuming = first && this.held !== undefined;
    const c = new ViewChanges();
    let keys: Set<string> = this.dirty;
    if (resuming) {
      this.takeGenericViews(c);
      keys = new Set();
    } else if (this.allDirty) {
      keys = new Set(this.store.serviceKeys());
      for (const id of this.sent) if (id) keys.add(this.views.viewById(id)!.key);
    }
    this.dirty = new Set();
    this.allDirty = false;
    for (const key of keys) this.compare(key, c);

    const ops: LocalOp[] = [];
    if (resuming) ops.push(this.resumeOnly(c));
    else if (first) ops.push({ kind: 'reset' });
    const nodeOps = this.nodeDirty && this.wantNode ? this.diffNode() : { sets: [], deletes: [] };
    const cidrOps = this.cidrsDirty && this.wantCIDRs ? this.diffCIDRs() : { sets: [], deletes: [] };
    this.nodeDirty = this.cidrsDirty = false;
    ops.push(...nodeOps.sets, ...cidrOps.sets);
    c.pushOps(ops);
    ops.push(...cidrOps.deletes, ...nodeOps.deletes);

    if (!first && ops.length === 0) return this.remember(single?.transition, NO_OPS);
    if (first && c.svcSets.length) warmEncoders(c.svcSets[0]);
    ops.push({ kind: 'sync' });
    return this.remember(single?.transition, ops);
  }

  /**
   * One Service changed and nothing else: its diff (nothing, or the ops
   * another node made of the same transition), or the transition to
   * remember once its ops are made; undefined when more than that changed.
   */
  private singleChange(): { ops?: readonly LocalOp[]; transition?: Transition } | undefined {
    if (this.allDirty || this.nodeDirty || this.cidrsDirty || this.dirty.size !== 1) return undefined;
    const key: string = this.dirty.values().next().value!;
    const view = this.views.view(key, this.ctx);
    const slot = view ? this.views.slot(key) : this.views.existingSlot(key);
    const prev = this.sentView(slot);
    if (view === prev) {
      this.dirty.clear();
      return { ops: NO_OPS };
    }
    const known = prev && transitions.get(prev)?.get(view);
    if (known) {
      this.dirty.clear();
      this.setSent(slot!, view);
      return { ops: known };
    }
    return prev ? { transition: { prev, view } } : {};
  }

  /**
   * A resume looks at every service, as a first diff does, but from the
   * views shared by the nodes of its zone, looking up only the services
   * this node is special to (thousands of nodes resume at once after a
   * brain restart).
   */
  private takeGenericViews(c: ViewChanges): void {
    const g = this.views.generic(this.ctx.zone);
    const own = new Map((g.special.get(this.nodeName) ?? []).map((i) => [i, this.views.view(g.keys[i], this.ctx)]));
    for (let i = 0; i < g.keys.length; i++) {
      const view = own.has(i) ? own.get(i) : g.views[i];
      if (!view) continue;
      this.setSent(this.views.slot(g.keys[i]), view);
      c.svcSets.push(view);
    }
  }

  /** One Service's view against the one sent: what changed, into c. */
  private compare(key: string, c: ViewChanges): void {
    const view = this.views.view(key, this.ctx);
    const slot = view ? this.views.slot(key) : this.views.existingSlot(key);
    const prev = this.sentView(slot);
    if (view === prev) return;
    this.setSent(slot!, view);
    if (view && (!prev || !bytesEqual(prev.bytes, view.bytes))) c.svcSets.push(view);
    if (!prev) {
      // nothing sent before (a first diff): no lookup table to build
      for (const ep of view!.endpoints) c.endpointSet(ep);
      return;
    }
    const prevEps = new Map(prev.endpoints.map((e) => [e.path, e]));
    for (const ep of view?.endpoints ?? []) {
      const old = prevEps.get(ep.path);
      prevEps.delete(ep.path);
      if (old && (old === ep || bytesEqual(old.bytes, ep.bytes))) continue;
      c.endpointSet(ep);
    }
    for (const old of prevEps.values()) (old.named ? c.namedDeletes : c.anonDeletes).push(old.path);
    if (!view && prev) c.svcDeletes.push(key);
  }

  /**
   * Resume: what the node holds is what the views say for every bucket
   * whose digest matches; only the others are sent, with their endpoints
   * (and the node drops what it holds in them that is not resent). Keeps
   * in c the services of the buckets resent; the Reset that says which.
   */
  private resumeOnly(c: ViewChanges): LocalOp {
    const held = this.held!;
    this.held = undefined;
    const svcSets = c.svcSets;
    const buckets = heldBucketCount(held)!;
    const digests = new BucketDigests(buckets);
    const bucketAt = new Int32Array(svcSets.length);
    svcSets.forEach((v, i) => {
      const { hash, digest } = viewDigest(v);
      digests.add((bucketAt[i] = bucketOf(hash, buckets)), digest);
    });
    const resent = digests.differing(held);
    const resend = new Uint8Array(buckets);
    for (const b of resent) resend[b] = 1;
    // keep the services of the buckets resent, in place
    let kept = 0;
    svcSets.forEach((v, i) => {
      if (!resend[bucketAt[i]]) return;
      svcSets[kept++] = v;
      for (const ep of v.endpoints) c.endpointSet(ep);
    });
    svcSets.length = kept;
    return { kind: 'reset', resume: { buckets, resent } };
  }

  /** Keeps the ops of a one-service transition for the next node that makes it (frozen: shared from now on). */
  private remember(t: Transition | undefined, ops: readonly LocalOp[]): readonly LocalOp[] {
    if (!t) return ops;
    let m = transitions.get(t.prev);
    if (!m) transitions.set(t.prev, (m = new Map()));
    const shared = Object.freeze(ops);
    m.set(t.view, shared);
    return shared;
  }

  private diffNode(): { sets: LocalOp[]; deletes: LocalOp[] } {
    const stored = this.store.getNode(this.nodeName)?.node;
    if (!stored) {
      if (!this.sentNode) return { sets: [], deletes: [] };
      this.sentNode = undefined;
      return { sets: [], deletes: [{ kind: 'delete', set: LocalSet.NodesSet, path: this.nodeName }] };
    }
    const node = localNodeOf(stored);
    const bytes = encodeLocalNode(node);
    if (this.sentNode && bytesEqual(this.sentNode.bytes, bytes)) return { sets: [], deletes: [] };
    this.sentNode = { node, bytes };
    return { sets: [{ kind: 'set', set: LocalSet.NodesSet, path: this.nodeName, value: node, bytes }], deletes: [] };
  }

  private diffCIDRs(): { sets: LocalOp[]; deletes: LocalOp[] } {
    const sets: LocalOp[] = [];
    const deletes: LocalOp[] = [];
    const now = new Map(this.store.serviceCIDRs().map((c) => [c.cidr.Name, c]));
    for (const [name, c] of now) {
      const prev = this.sentCIDRs.get(name);
      if (prev && bytesEqual(prev.bytes, c.bytes)) continue;
      const bytes = encodeServiceCIDR(c.cidr);
      this.sentCIDRs.set(name, { cidr: c.cidr, bytes });
      sets.push({ kind: 'set', set: LocalSet.ServiceCIDRsSet, path: name, value: c.cidr, bytes });
    }
    for (const name of [...this.sentCIDRs.keys()].sort().reverse()) {
      if (now.has(name)) continue;
      this.sentCIDRs.delete(name);
      deletes.push({ kind: 'delete', set: LocalSet.ServiceCIDRsSet, path: name });
    }
    return { sets, deletes };
  }
}

/** The node-local state's Node (NodesSet) of a stored Node: its topology labels only. */
export function localNodeOf(stored: GlobalNode): LocalNode {
  const labels: Record<string, string> = {};
  for (const k of Object.keys(stored.Labels).sort()) {
    if (NODE_LABEL_PREFIXES.some((p) => k.startsWith(p))) labels[k] = stored.Labels[k];
  }
  return create(LocalNodeSchema, {
    Name: stored.Name,
    Zone: stored.Topology?.Zone ?? '',
    IPs: stored.IPs ?? create(IPSetSchema),
    PodCIDRs: stored.PodCIDRs,
    Labels: labels,
    Deleting: stored.Deleting,
  });
}

/**
 * Drives a sink from a node's diff until the signal aborts: Reset and the
 * full state first, then one diff (ending with Sync) per change. A sink that
 * is slow to finish a Sync makes the next diff coalesce everything meanwhile.
 */
export async function runLocalDiff(diff: LocalDiff, sink: { send(op: LocalOp): void | Promise<void> }, signal?: AbortSignal): Promise<void> {
  const onAbort = () => diff.close();
  signal?.addEventListener('abort', onAbort, { once: true });
  try {
    while (!signal?.aborted) {
      await diff.changed();
      if (signal?.aborted) break;
      let ops: readonly LocalOp[] | undefined = diff.next();
      for (const op of ops) await sink.send(op);
      // waiting for the next change, this frame must not keep the ops (and their views)
      ops = undefined;
    }
  } finally {
    signal?.removeEventListener('abort', onAbort);
    diff.close();
  }
}
