// to-local: runs a backend in this process on this node's diff stream.
import { LocalDiff, runLocalDiff } from '../../diff/local-diff.js';
import { startBackend } from '../../backends/run.js';
import { registerSink } from '../registry.js';

registerSink({
  name: 'to-local',
  description: 'program this node with a backend running in this process (to-<backend>)',
  takesBackend: true,
  options() {},
  async run(_opts, ctx, backend) {
    if (!backend) throw new Error('to-local needs a backend: to-<backend>');
    const b = await startBackend(backend.name, backend.opts, ctx.log, ctx.signal);
    ctx.log.info({ node: b.nodeName, backend: backend.name }, 'to-local: starting');
    const stop = new AbortController();
    const onAbort = () => stop.abort();
    ctx.signal.addEventListener('abort', onAbort, { once: true });
    void b.done.then(() => stop.abort());
    const diff = new LocalDiff(ctx.store, ctx.views, b.nodeName, { sets: b.instance.sets });
    try {
      await runLocalDiff(diff, b.sink, stop.signal);
    } finally {
      ctx.signal.removeEventListener('abort', onAbort);
      await b.instance.close?.();
    }
  },
});
