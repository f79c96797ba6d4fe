// `kpng status`'s question to a running kpng, on its state socket beside the
// Watch methods: /kpng.Status/Get, one request (empty) and one answer, a
// JSON document in gRPC's framing. Only state sockets serve it (unix, mode
// 0600); the TCP API a brain serves its nodes does not.
import type * as grpc from '@grpc/grpc-js';
import { GrpcStatus, grpcFrames, type ServerCall } from './h2-server.js';

export const STATUS_PATH = '/kpng.Status/Get';

/** One sync, as the backend reported it (src/backends/shared/runner.ts SyncResult). */
export interface SyncStatus {
  readonly ok: boolean;
  /** the dataplane was read back and compared whole (start-up, after a failure, a drift repair) */
  readonly full: boolean;
  readonly reason: string;
  /** when it ended (ISO 8601) */
  readonly at: string;
  readonly durationMs: number;
  /** dataplane objects added, changed or removed */
  readonly changes: number;
  /** Services the dataplane refused, left out at their last applied version */
  readonly skipped: readonly string[];
  readonly repaired: boolean;
  readonly error?: string;
}

export interface BackendStatus {
  /** "nft" for to-nft */
  readonly name: string;
  /** its /proxyMode answer; none for a backend without a dataplane (to-log) */
  readonly proxyMode?: string;
  readonly lastSync?: SyncStatus;
  /** the last sync that succeeded, when it is not the last one */
  readonly lastSuccess?: SyncStatus;
}

/** What a running kpng says about itself. */
export interface StatusReport {
  /** node: a node agent (to-local, kpng local); brain: to-api */
  readonly role: 'node' | 'brain';
  readonly version: string;
  readonly pid: number;
  /** ISO 8601 */
  readonly startedAt: string;
  /** where the state comes from (kube: the API server; file: the input; api: chained brains) and whether it is all listed */
  readonly source?: { readonly kind: string; readonly origin: string; readonly synced: boolean };
  /** kpng local: the brains in this node's order (the first is its own), the one it follows and whether that one delivered the state */
  readonly brains?: { readonly order: readonly string[]; readonly current?: string; readonly synced: boolean; readonly since?: string };
  /** the node it programs (node agents), or serves by default */
  readonly node?: string;
  readonly backends?: readonly BackendStatus[];
  /** the servers' bind addresses, as configured (node agents: /healthz and /livez; any: /metrics) */
  readonly healthzAddress?: string;
  readonly metricsAddress?: string;
  /** a brain: where it serves the nodes, its open Watch streams and connections */
  readonly api?: { readonly listen: string; readonly streams: number; readonly connections: number };
  /** what the store holds (a brain) */
  readonly cluster?: { readonly services: number; readonly slices: number; readonly nodes: number };
}

export function processStatus(role: StatusReport['role'], version: string): Pick<StatusReport, 'role' | 'version' | 'pid' | 'startedAt'> {
  return { role, version, pid: process.pid, startedAt: new Date(Date.now() - process.uptime() * 1000).toISOString() };
}

/** Serves one status call: the report, once the client has asked. */
export function answerStatus(call: ServerCall, report: () => StatusReport): void {
  let answered = false;
  const answer = () => {
    if (answered) return;
    answered = true;
    let body: Buffer;
    try {
      body = Buffer.from(JSON.stringify(report()));
    } catch (e) {
      return call.end(GrpcStatus.INTERNAL, `status: ${(e as Error).message}`);
    }
    call.write(grpcFrames([body]), () => call.end());
  };
  call.listen({ message: answer, end: answer, close: () => {} });
}

/** Asks a state socket's kpng for its report. */
export function requestStatus(client: grpc.Client, deadline: number): Promise<StatusReport> {
  return new Promise((resolve, reject) => {
    client.makeUnaryRequest<Buffer, StatusReport>(
      STATUS_PATH,
      (b) => b,
      (b) => JSON.parse(b.toString('utf8')) as StatusReport,
      Buffer.alloc(0),
      { deadline },
      (err, r) => (err ? reject(err) : resolve(r!)),
    );
  });
}
