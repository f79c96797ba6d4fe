// to-local: runs a backend in this process on this node's diff stream,
// computed from this process's store (the node agent: agent.ts).
import type { LocalOp } from '../../diff/ops.js';
import { registerSink } from '../registry.js';
import { DEFAULT_NODE_SOCKET, STATE_SOCKET_HELP } from '../api/defaults.js';
import { addTenantFlags, tenantFlags } from '../../aggregator/defaults.js';

registerSink({
  name: 'to-local',
  description: 'program this node with a backend running in this process (to-<backend>)',
  takesBackend: true,
  options(cmd) {
    cmd.option('--state-socket <address>', STATE_SOCKET_HELP, DEFAULT_NODE_SOCKET);
    addTenantFlags(cmd);
  },
  async run(opts, ctx, backends) {
    if (!backends.length) throw new Error('to-local needs a backend: to-<backend>');
    // loaded when the sink runs: a brain or kpng get does not need them
    const [{ LocalDiff }, { metrics }, { runNodeAgent, serviceOfOp }, { sourceStatus, startStateSocket }, { processStatus }, { version }] = await Promise.all([
      import('../../diff/local-diff.js'),
      import('../../runtime/metrics.js'),
      import('./agent.js'),
      import('../api/state-socket.js'),
      import('../../api/grpc/status.js'),
      import('../../runtime/version.js'),
    ]);
    // network programming latency starts when the store first sees a Service
    // change; the state at start (until the store is synced) is not a change
    const changed = new Map<string, number>();
    const unsubscribe = ctx.store.subscribe((c) => {
      if (!ctx.store.allSynced || c.becameSynced) return;
      const t = Date.now();
      for (const k of c.services) if (!changed.has(k)) changed.set(k, t);
    });
    /** when the store first saw the change each Service of the current diff carries */
    let since = new Map<string, number>();
    try {
      await runNodeAgent({
        backends: backends.map((b, i) => (i === 0 ? { ...b, opts: { ...b.opts, nodeName: b.opts.nodeName ?? ctx.nodeName } } : b)),
        log: ctx.log,
        signal: ctx.signal,
        stateSocket: opts.stateSocket,
        changedAt: (k) => since.get(k),
        tenants: tenantFlags(opts),
        async feed(sink, signal, b, agentStatus, routes) {
          ctx.log.info({ node: b.nodeName, backends: backends.map((x) => x.name).join(',') }, 'to-local: starting');
          const diff = new LocalDiff(ctx.store, ctx.views, b.nodeName, { sets: b.sets, viewsWhileListing: true });
          // a one-shot run (--once) has nothing to serve for long
          const once = backends.some((x) => x.opts.once);
          const status = () => ({ ...processStatus('node', version()), source: sourceStatus(ctx), ...agentStatus() });
          const state = once ? undefined : await startStateSocket({ address: opts.stateSocket, store: ctx.store, views: ctx.views, log: ctx.log, defaultNode: b.nodeName, status, routes });
          const onAbort = () => diff.close();
          signal.addEventListener('abort', onAbort, { once: true });
          try {
            while (!signal.aborted) {
              await diff.changed();
              if (signal.aborted) break;
              let ops: readonly LocalOp[] | undefined = diff.next();
              // every change noted so far was looked at by this diff: what it
              // carries is timed from its store time, the rest is not this node's
              since = new Map();
              let last: string | undefined;
              if (changed.size) for (const op of ops) {
                const k = serviceOfOp(op);
                // (a Service's ops come one after another)
                if (k === undefined || k === last) continue;
                last = k;
                const t = changed.get(k);
                if (t !== undefined) since.set(k, t);
              }
              changed.clear();
              for (const op of ops) {
                const r = sink.send(op);
                if (r) await r;
              }
              if (!ops.length) continue;
              // this frame waits for the next change: it must not keep the ops (and their views) meanwhile
              ops = undefined;
              metrics.apiEvents.set(ctx.store.events);
              metrics.revisions.set(ctx.store.rev);
            }
          } finally {
            signal.removeEventListener('abort', onAbort);
            diff.close();
            await state?.stop();
          }
        },
      });
    } finally {
      unsubscribe();
    }
  },
});
