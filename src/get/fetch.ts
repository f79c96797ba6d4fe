// What kpng get reads from a running kpng: one snapshot of its global state
// (/globalv1.Sets/Watch: Services, endpoints with conditions and hints,
// Nodes) and the node it serves by default (/localv1.Sets/Watch without a
// node name, asking for the node set). A stream is read to its first Sync
// and closed: kpng get is a client like any node, and changes nothing.
import { existsSync } from 'node:fs';
import type * as grpc from '@grpc/grpc-js';
import { grpcJs } from '../runtime/lazy.js';
import { create, fromBinary, toBinary } from '@bufbuild/protobuf';
import * as G from '../api/gen/api/globalv1/api_pb.js';
import { WatchReqSchema, type OpItem } from '../api/gen/api/localv1/api_pb.js';
import { LocalSet, decodeEndpoint, decodeLocalNode, decodeService, type Endpoint, type Service, type LocalNode } from '../api/model.js';
import { parseAddress } from '../api/grpc/address.js';
import { newClient } from '../api/grpc/client.js';
import type { ClientTLS } from '../api/grpc/tls.js';
import { decodeOpItem, localWatchMethod, GLOBAL_WATCH_PATH } from '../api/grpc/wire.js';

export interface ClusterState {
  services: Service[];
  /** by service key ns/name, each slice's endpoints */
  slices: Map<string, { name: string; endpoints: G.EndpointInfo[] }[]>;
  nodes: G.Node[];
  /** the node the server serves by default (a node agent's own), if any */
  node?: LocalNode;
  /** a kpng local node agent serves only its node-local state: its Services and the endpoints it uses */
  local?: { services: Service[]; endpoints: Map<string, Endpoint[]> };
}

const TIMEOUT_MS = 10_000;

/** Reads one stream up to its first Sync, each op to onOp. */
export function readToSync(client: grpc.Client, path: string, request: Buffer, deadline: number, onOp: (op: OpItem) => void): Promise<void> {
  return new Promise((resolve, reject) => {
    const call = client.makeBidiStreamRequest<Buffer, OpItem>(path, (b) => b, decodeOpItem, new (grpcJs().Metadata)(), { deadline });
    let done = false;
    call.on('data', (op: OpItem) => {
      if (done) return;
      onOp(op);
      if (op.Op.case === 'Sync') {
        done = true;
        call.cancel();
        resolve();
      }
    });
    call.on('error', (e: grpc.ServiceError) => {
      if (!done) (done = true), reject(e);
    });
    call.on('end', () => {
      if (!done) (done = true), reject(new Error('the server ended the stream before its state was complete'));
    });
    call.write(request);
  });
}

/** Reads one stream up to its first Sync. */
async function snapshot(client: grpc.Client, path: string, request: Buffer, deadline: number): Promise<OpItem[]> {
  const ops: OpItem[] = [];
  await readToSync(client, path, request, deadline, (op) => ops.push(op));
  return ops;
}

export class GetError extends Error {}

/** Nothing answers at the address: no kpng serves there. */
export class NotRunning extends GetError {
  constructor(
    readonly address: string,
    readonly reason: string,
  ) {
    super(`nothing answers at ${address} (${reason}): no kpng runs there`);
  }
}

/** Whether a failed call found no server at all (no socket file, a refused connection). */
function notRunning(address: string, err: grpc.ServiceError): NotRunning | undefined {
  const m = /\b(ENOENT|ECONNREFUSED)\b/.exec(err.details ?? err.message);
  return err.code === grpcJs().status.UNAVAILABLE && m ? new NotRunning(address, m[1] === 'ENOENT' ? 'no such socket' : 'connection refused') : undefined;
}

/** A kpng local node agent: its node-local state only (what its backend programs). */
async function nodeLocalState(client: grpc.Client, address: string, node: string | undefined, deadline: number): Promise<ClusterState> {
  let ops: OpItem[];
  try {
    ops = await snapshot(client, localWatchMethod.path, localWatchMethod.serialize(create(WatchReqSchema, { NodeName: node ?? '', Sets: [LocalSet.NodesSet] })), deadline);
  } catch (e) {
    const err = e as grpc.ServiceError;
    throw new GetError(`${address}: ${err.details ?? err.message}`);
  }
  const local = { services: [] as Service[], endpoints: new Map<string, Endpoint[]>() };
  const state: ClusterState = { services: [], slices: new Map(), nodes: [], local };
  for (const op of ops) {
    if (op.Op.case !== 'Set') continue;
    const { Ref: ref, Bytes: bytes } = op.Op.value;
    if (ref?.Set === LocalSet.NodesSet) state.node = decodeLocalNode(bytes);
    else if (ref?.Set === LocalSet.ServicesSet) local.services.push(decodeService(bytes));
    else if (ref?.Set === LocalSet.EndpointsSet) {
      const key = ref.Path.split('/').slice(0, 2).join('/');
      local.endpoints.set(key, [...(local.endpoints.get(key) ?? []), decodeEndpoint(bytes)]);
    }
  }
  return state;
}

/** The state of the kpng at address (a state socket, or a brain's API). */
export async function fetchState(address: string, tls?: ClientTLS, node?: string): Promise<ClusterState> {
  const a = parseAddress(address);
  if (a.kind === 'unix' && !existsSync(a.path)) throw new NotRunning(address, 'no such socket');
  const client = newClient(a, tls);
  const deadline = Date.now() + TIMEOUT_MS;
  try {
    let global: OpItem[];
    try {
      global = await snapshot(client, GLOBAL_WATCH_PATH, Buffer.from(toBinary(G.GlobalWatchReqSchema, create(G.GlobalWatchReqSchema, {}))), deadline);
    } catch (e) {
      const err = e as grpc.ServiceError;
      if (err.code === grpcJs().status.UNIMPLEMENTED) return await nodeLocalState(client, address, node, deadline);
      throw notRunning(address, err) ?? new GetError(`${address}: ${err.details ?? err.message}`);
    }
    const state: ClusterState = { services: [], slices: new Map(), nodes: [] };
    for (const op of global) {
      if (op.Op.case !== 'Set') continue;
      const ref = op.Op.value.Ref;
      const bytes = op.Op.value.Bytes;
      switch (ref?.Set) {
        case LocalSet.GlobalServiceInfos: {
          const s = fromBinary(G.ServiceInfoSchema, bytes).Service;
          if (s) state.services.push(s);
          break;
        }
        case LocalSet.GlobalNodeInfos: {
          const n = fromBinary(G.NodeInfoSchema, bytes).Node;
          if (n) state.nodes.push(n);
          break;
        }
        case LocalSet.GlobalEndpointInfos: {
          // every endpoint comes twice: by service (ns|svc|slice|hash) and by slice (ns||slice|hash)
          const [ns, svc, slice] = ref.Path.split('|');
          if (!svc) break;
          const info = fromBinary(G.EndpointInfoSchema, bytes);
          const key = `${ns}/${svc}`;
          const list = state.slices.get(key) ?? [];
          state.slices.set(key, list);
          let sl = list.find((x) => x.name === slice);
          if (!sl) list.push((sl = { name: slice ?? '', endpoints: [] }));
          sl.endpoints.push(info);
          break;
        }
      }
    }
    // which node the server stands for (a node agent), or the one asked for
    const local = await snapshot(client, localWatchMethod.path, localWatchMethod.serialize(create(WatchReqSchema, { NodeName: node ?? '', Sets: [LocalSet.NodesSet] })), deadline).catch(() => [] as OpItem[]);
    for (const op of local) {
      if (op.Op.case === 'Set' && op.Op.value.Ref?.Set === LocalSet.NodesSet) state.node = decodeLocalNode(op.Op.value.Bytes);
    }
    if (node && !state.node) state.node = { $typeName: 'localv1.Node', Name: node, Zone: state.nodes.find((n) => n.Name === node)?.Topology?.Zone ?? '', IPs: undefined, PodCIDRs: [], Labels: {}, Deleting: false } as LocalNode;
    return state;
  } finally {
    client.close();
  }
}
