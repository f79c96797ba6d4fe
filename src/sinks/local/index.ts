// to-local: runs a backend in this process on this node's diff stream,
// computed from this process's store (the node agent: agent.ts).
import { LocalDiff, runLocalDiff } from '../../diff/local-diff.js';
import { metrics } from '../../backends/shared/metrics.js';
import { registerSink } from '../registry.js';
import { runNodeAgent, serviceOfOp } from './agent.js';
import './remote.js';

registerSink({
  name: 'to-local',
  description: 'program this node with a backend running in this process (to-<backend>)',
  takesBackend: true,
  options() {},
  async run(_opts, ctx, backends) {
    if (!backends.length) throw new Error('to-local needs a backend: to-<backend>');
    // network programming latency starts when the store first sees a Service change
    const changed = new Map<string, number>();
    const unsubscribe = ctx.store.subscribe((c) => {
      const t = Date.now();
      for (const k of c.services) if (!changed.has(k)) changed.set(k, t);
    });
    try {
      await runNodeAgent({
        backends: backends.map((b, i) => (i === 0 ? { ...b, opts: { ...b.opts, nodeName: b.opts.nodeName ?? ctx.nodeName } } : b)),
        log: ctx.log,
        signal: ctx.signal,
        changedAt: (k) => changed.get(k),
        observed: (k, since) => changed.get(k) === since && changed.delete(k),
        async feed(sink, signal, b) {
          ctx.log.info({ node: b.nodeName, backends: backends.map((x) => x.name).join(',') }, 'to-local: starting');
          const diff = new LocalDiff(ctx.store, ctx.views, b.nodeName, { sets: b.sets });
          // a change the diff saw and did not carry is not this node's: it is not timed
          let diffStart = 0;
          const carried = new Set<string>();
          await runLocalDiff(
            diff,
            {
              send: async (op) => {
                diffStart ||= Date.now();
                const key = serviceOfOp(op);
                if (key !== undefined) carried.add(key);
                await sink.send(op);
                if (op.kind !== 'sync') return;
                for (const [k, t] of changed) if (t < diffStart && !carried.has(k)) changed.delete(k);
                carried.clear();
                diffStart = 0;
                metrics.apiEvents.set(ctx.store.events);
                metrics.revisions.set(ctx.store.rev);
              },
            },
            signal,
          );
        },
      });
    } finally {
      unsubscribe();
    }
  },
});
