// The node agent: runs a backend on this node's diff stream, wherever the
// stream comes from (to-local: this process's store; `kpng local`: a brain
// over gRPC), the same way: the backend with its health and metrics servers
// (closed on exit), and kubeproxy_network_programming_duration_seconds for
// each Service a diff carried once the sync that applied it succeeded.
import type { Logger } from '../../log.js';
import { LocalSet } from '../../api/model.js';
import { splitEndpointPath } from '../../diff/fullstate.js';
import type { LocalOp, LocalSink } from '../../diff/ops.js';
import { startBackends, type BackendSpec, type StartedBackend } from '../../backends/run.js';
import { metrics } from '../../backends/shared/metrics.js';

export interface NodeAgentOptions {
  /** one backend, or several on the same stream (each gets every op) */
  readonly backends: readonly BackendSpec[];
  readonly log: Logger;
  readonly signal: AbortSignal;
  /**
   * When a Service's change was first seen upstream (to-local: the store);
   * without it, or when it does not know, the time the node received the
   * change's first op.
   */
  readonly changedAt?: (serviceKey: string) => number | undefined;
  /** observed: forget the upstream time of this change */
  readonly observed?: (serviceKey: string, since: number) => void;
  /** feeds the ops to sink until the signal aborts (or the backend is done, with --once) */
  feed(sink: LocalSink, signal: AbortSignal, backend: StartedBackend): Promise<void>;
}

/** The Service an op of the diff stream is about, or undefined (the node, ServiceCIDRs). */
export function serviceOfOp(op: LocalOp): string | undefined {
  if (op.kind !== 'set' && op.kind !== 'delete') return undefined;
  if (op.set === LocalSet.ServicesSet) return op.path;
  if (op.set === LocalSet.EndpointsSet) return splitEndpointPath(op.path)[0];
  return undefined;
}

export async function runNodeAgent(o: NodeAgentOptions): Promise<void> {
  const b = await startBackends(o.backends, o.log, o.signal);
  const stop = new AbortController();
  const onAbort = () => stop.abort();
  o.signal.addEventListener('abort', onAbort, { once: true });
  void b.done.then(() => stop.abort());
  // the Services delivered and not yet applied by every dataplane backend:
  // when their change started, when delivered, which backends still have to
  const pending = new Map<string, { since: number; delivered: number; waiting: Set<number> }>();
  const unsubscribe = b.onResult((r, backend) => {
    if (!r.ok) return;
    const started = r.endedAt - r.durationMs;
    for (const [k, p] of pending) {
      if (p.delivered > started) continue; // came after this sync began: the next one applies it
      p.waiting.delete(backend);
      if (p.waiting.size) continue;
      metrics.networkProgramming.observe({ ip_family: '' }, (r.endedAt - p.since) / 1000);
      o.observed?.(k, p.since);
      pending.delete(k);
    }
  });
  const sink: LocalSink = {
    send: (op: LocalOp) => {
      const key = serviceOfOp(op);
      if (key !== undefined && b.reporting.length) {
        const now = Date.now();
        const p = pending.get(key);
        if (p) p.waiting = new Set(b.reporting); // changed again: every backend has to apply it
        else pending.set(key, { since: o.changedAt?.(key) ?? now, delivered: now, waiting: new Set(b.reporting) });
      }
      return b.sink.send(op);
    },
  };
  try {
    await o.feed(sink, stop.signal, b);
  } finally {
    o.signal.removeEventListener('abort', onAbort);
    unsubscribe();
    await b.close();
  }
}
