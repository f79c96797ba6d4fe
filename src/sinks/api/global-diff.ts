// The global diff stream (/globalv1.Sets/Watch): the store's Nodes, Services
// and endpoints as kpng's proxystore lays them out, diffed per stream
// against what that stream was last sent.
//
// Paths are kpng's KV paths "Namespace|Name|Source|Key": a node is
// "|node||", a service "ns|name||", and every endpoint is sent twice, as
// "ns|svc|slice|hexhash" (indexed by service) and "ns||slice|hexhash"
// (indexed by slice), because kpng's store holds it twice. Values are
// globalv1.NodeInfo / ServiceInfo / EndpointInfo with Hash set. Op order is
// kpng's: Node Sets, Service Sets, Endpoint Sets (ascending paths), then
// Endpoint Deletes, Service Deletes, Node Deletes (descending), then Sync.
//
// kpng-ts: ServiceCIDRs ("|name||", ServiceCIDRInfo) only to a client that
// asked for them (GLOBAL_SETS_HEADER: GlobalWatchReq has no Sets field), their Sets after the Node Sets and
// their Deletes before the Node Deletes.
import { create, toBinary } from '@bufbuild/protobuf';
import { hash } from 'node:crypto';
import * as G from '../../api/gen/api/globalv1/api_pb.js';
import { LocalSet, bytesEqual } from '../../api/model.js';
import { StoreFollower } from '../../diff/store-follower.js';
import type { Store, StoreChange, StoredNode, StoredService, StoredServiceCIDR, StoredSlice } from '../../store/store.js';

export { GLOBAL_SETS_HEADER } from '../../api/grpc/wire.js';

export type GlobalOp =
  | { readonly kind: 'reset' }
  | { readonly kind: 'sync' }
  | { readonly kind: 'set'; readonly set: LocalSet; readonly path: string; readonly bytes: Uint8Array }
  | { readonly kind: 'delete'; readonly set: LocalSet; readonly path: string };

/** 64 bits of SHA-256: kpng used xxhash64; the value is opaque to clients */
export function hash64(bytes: Uint8Array): bigint {
  return hash('sha256', bytes, 'buffer').readBigUInt64BE(0);
}

export interface EncodedEndpoint {
  /** hex hash: the Key of the endpoint's paths */
  readonly key: string;
  readonly bytes: Uint8Array;
}

/**
 * Encodes global values once per stored object (the store replaces an object
 * when it changes), shared by every global stream.
 */
export class GlobalEncoder {
  private readonly nodes = new WeakMap<StoredNode, Uint8Array>();
  private readonly services = new WeakMap<StoredService, Uint8Array>();
  private readonly slices = new WeakMap<StoredSlice, readonly EncodedEndpoint[]>();
  private readonly cidrs = new WeakMap<StoredServiceCIDR, Uint8Array>();

  node(n: StoredNode): Uint8Array {
    let b = this.nodes.get(n);
    if (!b) this.nodes.set(n, (b = toBinary(G.NodeInfoSchema, create(G.NodeInfoSchema, { Hash: hash64(n.bytes), Node: n.node }))));
    return b;
  }

  service(s: StoredService): Uint8Array {
    let b = this.services.get(s);
    if (!b) this.services.set(s, (b = toBinary(G.ServiceInfoSchema, create(G.ServiceInfoSchema, { Hash: hash64(s.bytes), Service: s.service }))));
    return b;
  }

  serviceCIDR(c: StoredServiceCIDR): Uint8Array {
    let b = this.cidrs.get(c);
    if (!b) this.cidrs.set(c, (b = toBinary(G.ServiceCIDRInfoSchema, create(G.ServiceCIDRInfoSchema, { Hash: hash64(c.bytes), ServiceCIDR: c.cidr }))));
    return b;
  }

  /** the slice's endpoints, one per distinct hash (kpng's store keys them by hash) */
  slice(s: StoredSlice): readonly EncodedEndpoint[] {
    let list = this.slices.get(s);
    if (list) return list;
    const out: EncodedEndpoint[] = [];
    const seen = new Set<string>();
    for (const e of s.endpoints) {
      // a shallow copy: only its own scalar fields change
      const info = create(G.EndpointInfoSchema, { ...e, Hash: 0n, Namespace: s.namespace, SourceName: s.name, ServiceName: s.serviceName });
      const h = hash64(toBinary(G.EndpointInfoSchema, info));
      const key = h.toString(16); // Go's strconv.FormatUint(h, 16)
      if (seen.has(key)) continue;
      seen.add(key);
      info.Hash = h;
      out.push({ key, bytes: toBinary(G.EndpointInfoSchema, info) });
    }
    this.slices.set(s, (list = out));
    return list;
  }
}

export const nodePath = (name: string) => `|${name}||`;
export const servicePath = (key: string) => {
  const i = key.indexOf('/');
  return `${key.slice(0, i)}|${key.slice(i + 1)}||`;
};

export interface GlobalDiffOptions {
  /** kpng-ts extra sets (GlobalServiceCIDRInfos) */
  sets?: readonly LocalSet[];
}

const asc = (a: { path: string }, b: { path: string }) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0);
const desc = (a: string, b: string) => (a < b ? 1 : a > b ? -1 : 0);

export class GlobalDiff extends StoreFollower {
  /** path -> value bytes, as last sent */
  private readonly sentNodes = new Map<string, Uint8Array>();
  private readonly sentServices = new Map<string, Uint8Array>();
  private readonly sentCIDRs = new Map<string, Uint8Array>();
  /** slice key (ns/name) -> path -> value bytes */
  private readonly sentSlices = new Map<string, Map<string, Uint8Array>>();
  private dirtyNodes = new Set<string>();
  private dirtyServices = new Set<string>();
  private dirtySlices = new Set<string>();
  private cidrsDirty = true;
  private allDirty = true;
  private first = true;
  private readonly wantCIDRs: boolean;

  constructor(
    store: Store,
    private readonly enc: GlobalEncoder,
    opts: GlobalDiffOptions = {},
  ) {
    super(store);
    this.wantCIDRs = opts.sets?.includes(LocalSet.GlobalServiceCIDRInfos) ?? false;
  }

  protected note(c: StoreChange) {
    for (const k of c.nodes) this.dirtyNodes.add(k);
    for (const k of c.services) this.dirtyServices.add(k);
    for (const k of c.slices) this.dirtySlices.add(k);
    if (c.serviceCIDRs) this.cidrsDirty = true;
  }

  get pending(): boolean {
    return this.first || this.allDirty || this.dirtyNodes.size > 0 || this.dirtyServices.size > 0 || this.dirtySlices.size > 0 || (this.wantCIDRs && this.cidrsDirty);
  }

  /** how much the next diff may cover (objects), to pace big diffs */
  get pendingSize(): number {
    if (this.allDirty) return Number.MAX_SAFE_INTEGER;
    return this.dirtyNodes.size + this.dirtyServices.size + this.dirtySlices.size;
  }

  /** The next change set ending with Sync (Reset first on the first one); empty when nothing changed. */
  next(): GlobalOp[] {
    if (!this.store.allSynced) return [];
    const first = this.first;
    this.first = false;
    const store = this.store;

    let nodeKeys: Iterable<string> = this.dirtyNodes;
    let serviceKeys: Iterable<string> = this.dirtyServices;
    let sliceKeys: Iterable<string> = this.dirtySlices;
    if (this.allDirty) {
      nodeKeys = new Set([...[...store.allNodes()].map((n) => n.node.Name), ...this.sentNodes.keys()]);
      serviceKeys = new Set([...store.serviceKeys(), ...this.sentServices.keys()]);
      sliceKeys = new Set([...[...store.allSlices()].map((s) => s.key), ...this.sentSlices.keys()]);
    }
    this.dirtyNodes = new Set();
    this.dirtyServices = new Set();
    this.dirtySlices = new Set();
    this.allDirty = false;

    type SetOp = { path: string; bytes: Uint8Array };
    const nodeSets: SetOp[] = [];
    const nodeDeletes: string[] = [];
    const svcSets: SetOp[] = [];
    const svcDeletes: string[] = [];
    const epSets: SetOp[] = [];
    const epDeletes: string[] = [];
    const cidrSets: SetOp[] = [];
    const cidrDeletes: string[] = [];

    const diffOne = (sent: Map<string, Uint8Array>, path: string, bytes: Uint8Array | undefined, sets: SetOp[], deletes: string[]) => {
      const prev = sent.get(path);
      if (bytes) {
        if (prev && bytesEqual(prev, bytes)) return;
        sent.set(path, bytes);
        sets.push({ path, bytes });
      } else if (prev) {
        sent.delete(path);
        deletes.push(path);
      }
    };

    for (const name of nodeKeys) {
      const n = store.getNode(name);
      diffOne(this.sentNodes, nodePath(name), n && this.enc.node(n), nodeSets, nodeDeletes);
    }
    for (const key of serviceKeys) {
      const s = store.getService(key);
      diffOne(this.sentServices, servicePath(key), s && this.enc.service(s), svcSets, svcDeletes);
    }
    for (const key of sliceKeys) {
      const s = store.getSlice(key);
      const prev = this.sentSlices.get(key);
      const now = new Map<string, Uint8Array>();
      if (s) {
        for (const e of this.enc.slice(s)) {
          now.set(`${s.namespace}|${s.serviceName}|${s.name}|${e.key}`, e.bytes);
          now.set(`${s.namespace}||${s.name}|${e.key}`, e.bytes);
        }
      }
      for (const [path, bytes] of now) {
        const old = prev?.get(path);
        if (!old || !bytesEqual(old, bytes)) epSets.push({ path, bytes });
      }
      for (const path of prev?.keys() ?? []) if (!now.has(path)) epDeletes.push(path);
      if (now.size) this.sentSlices.set(key, now);
      else this.sentSlices.delete(key);
    }
    if (this.wantCIDRs && this.cidrsDirty) {
      const now = new Map(store.serviceCIDRs().map((c) => [nodePath(c.cidr.Name), c]));
      for (const [path, c] of now) diffOne(this.sentCIDRs, path, this.enc.serviceCIDR(c), cidrSets, cidrDeletes);
      for (const path of [...this.sentCIDRs.keys()]) if (!now.has(path)) diffOne(this.sentCIDRs, path, undefined, cidrSets, cidrDeletes);
    }
    this.cidrsDirty = false;

    const ops: GlobalOp[] = [];
    if (first) ops.push({ kind: 'reset' });
    const sets = (set: LocalSet, list: SetOp[]) => {
      for (const s of list.sort(asc)) ops.push({ kind: 'set', set, path: s.path, bytes: s.bytes });
    };
    const deletes = (set: LocalSet, list: string[]) => {
      for (const path of list.sort(desc)) ops.push({ kind: 'delete', set, path });
    };
    sets(LocalSet.GlobalNodeInfos, nodeSets);
    sets(LocalSet.GlobalServiceCIDRInfos, cidrSets);
    sets(LocalSet.GlobalServiceInfos, svcSets);
    sets(LocalSet.GlobalEndpointInfos, epSets);
    deletes(LocalSet.GlobalEndpointInfos, epDeletes);
    deletes(LocalSet.GlobalServiceInfos, svcDeletes);
    deletes(LocalSet.GlobalServiceCIDRInfos, cidrDeletes);
    deletes(LocalSet.GlobalNodeInfos, nodeDeletes);
    if (!first && ops.length === 0) return [];
    ops.push({ kind: 'sync' });
    return ops;
  }
}
