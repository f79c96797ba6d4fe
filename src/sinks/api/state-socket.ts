// The read-only state socket every long-running kpng serves, so that
// `kpng get` can ask it what it knows: a brain (to-api) its global state and
// any node's, a node agent (to-local) the same with its own node as the
// default; and `kpng status` what the process is and does. It is the API
// server (localv1/globalv1 Watch, read-only by nature) with the status query,
// on a unix socket of mode 0600. Best effort: a path in use (another kpng on
// this host) or not writable costs one log line, never the process.
import type { Logger } from '../../runtime/log.js';
import type { Store } from '../../store/store.js';
import type { ServiceViews } from '../../localstate/views.js';
import type { SinkContext } from '../registry.js';
import type { StatusReport } from '../../api/grpc/status.js';
import { ApiServer } from './server.js';
import type { ServerCall } from '../../api/grpc/h2-server.js';

export { DEFAULT_BRAIN_SOCKET, DEFAULT_NODE_SOCKET, STATE_SOCKET_HELP } from './defaults.js';

/** how long setting the socket up, or tearing it down, may take: it must never hold the process */
const LIMIT_MS = 5_000;

function bounded<T>(p: Promise<T>, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const t = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`${what} took over ${LIMIT_MS} ms`)), LIMIT_MS)));
  return Promise.race([p, t]).finally(() => clearTimeout(timer));
}

export interface StateSocket {
  stop(): Promise<void>;
}

/** kpng status's line about the source a sink runs on */
export function sourceStatus(ctx: Pick<SinkContext, 'source' | 'store'>): StatusReport['source'] {
  return ctx.source && { kind: ctx.source.name, origin: ctx.source.origin ?? '', synced: ctx.store.allSynced };
}

export async function startStateSocket(o: { address: string; store: Store; views: ServiceViews; log: Logger; defaultNode?: string; status?: () => StatusReport; routes?: ReadonlyMap<string, (call: ServerCall) => void> }): Promise<StateSocket | undefined> {
  if (!o.address || o.address === 'none') return undefined;
  let server: ApiServer | undefined;
  const stop = async () => {
    await bounded(server!.stop(100), 'closing the state socket').catch((e) => o.log.info({ reason: (e as Error).message }, 'state socket: not closed cleanly'));
  };
  try {
    server = new ApiServer({ store: o.store, views: o.views, log: o.log, listen: o.address, socketMode: 0o600, defaultNode: o.defaultNode, maxConnections: 64, logName: 'state socket', status: o.status, routes: o.routes });
    // it logs "state socket: serving"
    await bounded(server.start(), 'opening the state socket');
    return { stop };
  } catch (e) {
    o.log.info({ socket: o.address, reason: (e as Error).message }, 'state socket: not serving');
    if (server) await stop();
    return undefined;
  }
}
