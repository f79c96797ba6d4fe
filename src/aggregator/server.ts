// The tenant socket: /kpng.aggregator.v1.Tenants/Session on a unix socket
// of mode 0600 (only root, as the node's other agents run, reaches it),
// served by grpc-js's server: a tenant's session is one bidirectional
// stream, and tenants are written in every language (grpc-go, grpcio), so
// the API is served by gRPC's own implementation rather than kpng's h2
// server (which exists to fan one diff out to thousands of nodes). Also the
// read-only /kpng.aggregator.v1.TenantStatus/List, added to the node's state
// socket (kpng get tenants).
import type * as grpc from '@grpc/grpc-js';
import { create, fromBinary, toBinary } from '@bufbuild/protobuf';
import type { Logger } from '../runtime/log.js';
import { grpcJs } from '../runtime/lazy.js';
import { parseAddress } from '../api/grpc/address.js';
import { bindUnixSocket, type BoundSocket } from '../api/grpc/unix-socket.js';
import { grpcFrames, GrpcStatus, type ServerCall } from '../api/grpc/h2-server.js';
import { TenantListSchema, TenantReplySchema, TenantRequestSchema, type TenantReply, type TenantRequest } from '../api/gen/kpng/aggregator/v1/aggregator_pb.js';
import type { Aggregator, SessionPort } from './aggregator.js';

export const TENANT_SESSION_PATH = '/kpng.aggregator.v1.Tenants/Session';
export const TENANT_LIST_PATH = '/kpng.aggregator.v1.TenantStatus/List';

/** a Declare at Calico's scale (thousands of chains and sets) is megabytes */
const MAX_MESSAGE_BYTES = 64 * 1024 * 1024;

export interface TenantServer {
  stop(): Promise<void>;
}

const serviceDefinition = (): grpc.ServiceDefinition => ({
  session: {
    path: TENANT_SESSION_PATH,
    requestStream: true,
    responseStream: true,
    requestSerialize: (m: TenantRequest) => Buffer.from(toBinary(TenantRequestSchema, m)),
    requestDeserialize: (b: Buffer) => fromBinary(TenantRequestSchema, b),
    responseSerialize: (m: TenantReply) => Buffer.from(toBinary(TenantReplySchema, m)),
    responseDeserialize: (b: Buffer) => fromBinary(TenantReplySchema, b),
    originalName: 'Session',
  },
});

/** Serves the tenant API at address; undefined (one log line) when it cannot: kpng's own work goes on without it. */
export async function startTenantServer(o: { address: string; aggregator: Aggregator; log: Logger }): Promise<TenantServer | undefined> {
  if (!o.address || o.address === 'none') return undefined;
  const g = grpcJs();
  const server = new g.Server({ 'grpc.max_receive_message_length': MAX_MESSAGE_BYTES, 'grpc.max_send_message_length': MAX_MESSAGE_BYTES });
  const calls = new Set<grpc.ServerDuplexStream<TenantRequest, TenantReply>>();
  server.addService(serviceDefinition(), {
    session: (call: grpc.ServerDuplexStream<TenantRequest, TenantReply>) => serveSession(call, o.aggregator, calls),
  });
  let socket: BoundSocket;
  try {
    const a = parseAddress(o.address);
    if (a.kind !== 'unix') throw new Error('the tenant API is served on a unix socket only');
    socket = await bindUnixSocket(a.path, 0o600, (privatePath) => new Promise<void>((resolve, reject) => server.bindAsync(`unix://${privatePath}`, g.ServerCredentials.createInsecure(), (e) => (e ? reject(e) : resolve()))));
  } catch (e) {
    o.log.warn({ socket: o.address, reason: (e as Error).message }, 'tenant API: not serving');
    server.forceShutdown();
    return undefined;
  }
  o.log.info({ socket: o.address }, 'tenant API: serving');
  return {
    /** after the aggregator ended its sessions (Aggregator.close) */
    async stop() {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(() => (server.forceShutdown(), resolve()), 1000);
        server.tryShutdown(() => (clearTimeout(timer), resolve()));
      });
      for (const c of calls) c.destroy();
      socket.remove();
    },
  };
}

const STATUS: Record<Exclude<Parameters<SessionPort['close']>[0], 'ok'>, number> = {
  invalid: 3, // INVALID_ARGUMENT
  denied: 7, // PERMISSION_DENIED
  replaced: 10, // ABORTED
  unavailable: 14, // UNAVAILABLE
};

function serveSession(call: grpc.ServerDuplexStream<TenantRequest, TenantReply>, aggregator: Aggregator, calls: Set<unknown>): void {
  calls.add(call);
  let open = true;
  const port: SessionPort = {
    send(r) {
      if (!open) return;
      const reply = create(TenantReplySchema, { id: r.id, outcome: r.outcome, error: r.error ?? '', changes: r.changes ?? 0, held: r.held ?? false });
      // a tenant that does not read its replies stops being read (its requests wait in its socket)
      if (!call.write(reply)) {
        call.pause();
        call.once('drain', () => call.resume());
      }
    },
    close(how, message) {
      if (!open) return;
      open = false;
      if (how === 'ok') call.end();
      else call.emit('error', { code: STATUS[how], details: message });
    },
  };
  const session = aggregator.open(port, call.getPeer());
  const ended = () => {
    open = false;
    calls.delete(call);
    session.ended();
  };
  call.on('data', (req: TenantRequest) => session.request(req));
  call.on('end', () => {
    // the tenant half-closed: what it sent is answered, then the stream ends
    ended();
    call.end();
  });
  call.on('cancelled', ended);
  call.on('error', ended);
  call.on('close', ended);
}

/** The state socket's /kpng.aggregator.v1.TenantStatus/List: one TenantList, then the end. */
export function tenantListMethod(aggregator: Aggregator): [string, (call: ServerCall) => void] {
  return [
    TENANT_LIST_PATH,
    (call) =>
      call.listen({
        message: () => {
          const list = create(TenantListSchema, aggregator.list());
          call.write(grpcFrames([toBinary(TenantListSchema, list)]), () => call.end(GrpcStatus.OK));
        },
        end: () => {},
        close: () => {},
      }),
  ];
}
