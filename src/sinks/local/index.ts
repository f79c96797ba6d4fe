// to-local: runs a backend in this process on this node's diff stream.
import { LocalDiff, runLocalDiff } from '../../diff/local-diff.js';
import type { LocalOp } from '../../diff/ops.js';
import { metrics } from '../../backends/shared/metrics.js';
import { startBackend } from '../../backends/run.js';
import { registerSink } from '../registry.js';

registerSink({
  name: 'to-local',
  description: 'program this node with a backend running in this process (to-<backend>)',
  takesBackend: true,
  options() {},
  async run(_opts, ctx, backend) {
    if (!backend) throw new Error('to-local needs a backend: to-<backend>');
    const b = await startBackend(backend.name, { ...backend.opts, nodeName: backend.opts.nodeName ?? ctx.nodeName }, ctx.log, ctx.signal);
    ctx.log.info({ node: b.nodeName, backend: backend.name }, 'to-local: starting');
    const stop = new AbortController();
    const onAbort = () => stop.abort();
    ctx.signal.addEventListener('abort', onAbort, { once: true });
    void b.done.then(() => stop.abort());
    const diff = new LocalDiff(ctx.store, ctx.views, b.nodeName, { sets: b.instance.sets });
    // network programming latency: from the store seeing a service change to
    // the backend having applied the diff that carries it
    const pending = new Map<string, number>();
    const unsubscribe = ctx.store.subscribe((c) => {
      const t = Date.now();
      for (const k of c.services) if (!pending.has(k)) pending.set(k, t);
    });
    const sink = {
      send: async (op: LocalOp) => {
        if (op.kind !== 'sync') return b.sink.send(op);
        const covered = [...pending.entries()];
        const before = b.lastResult;
        await b.sink.send(op);
        const r = b.lastResult;
        if (r && r !== before && r.ok) {
          const now = Date.now();
          for (const [k, t] of covered) {
            if (pending.get(k) === t) pending.delete(k);
            metrics.networkProgramming.observe({ ip_family: '' }, (now - t) / 1000);
          }
        }
        metrics.apiEvents.set(ctx.store.events);
        metrics.revisions.set(ctx.store.rev);
      },
    };
    try {
      await runLocalDiff(diff, sink, stop.signal);
    } finally {
      ctx.signal.removeEventListener('abort', onAbort);
      unsubscribe();
      await b.close();
    }
  },
});
