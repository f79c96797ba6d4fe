// to-file's definition (name, flags): registered at start for the command
// line; the writers (index.ts) load when the sink runs.
import { LocalSet } from '../../api/model.js';
import type { Store } from '../../store/store.js';
import { DEFAULT_BRAIN_SOCKET, STATE_SOCKET_HELP } from '../api/defaults.js';
import { registerSink } from '../registry.js';
import type { Format } from './stream.js';

/** Resolves true once every kind is synced, false if the signal aborts first. */
function synced(store: Store, signal: AbortSignal): Promise<boolean> {
  return new Promise<boolean>((resolve) => {
    if (store.allSynced || signal.aborted) return resolve(!signal.aborted);
    const done = (ok: boolean) => {
      unsubscribe();
      signal.removeEventListener('abort', onAbort);
      resolve(ok);
    };
    const onAbort = () => done(false);
    // after the update that synced it, not inside it
    const unsubscribe = store.subscribe(() => {
      if (!store.allSynced) return;
      unsubscribe();
      setImmediate(() => done(true));
    });
    signal.addEventListener('abort', onAbort, { once: true });
  });
}

registerSink({
  name: 'to-file',
  description: 'write the node-local state (--node-name) or the global state to a file, or "-" for stdout',
  options(cmd) {
    cmd
      .option('-o, --output <path>', 'file to write, or - for stdout', '-')
      .option('--format <format>', 'yaml or json', 'yaml')
      .option('--node-name <name>', 'write this node\'s node-local state instead of the global state')
      .option('--once', 'write the first complete state, then exit')
      .option('--state-socket <address>', STATE_SOCKET_HELP, DEFAULT_BRAIN_SOCKET);
  },
  // the writers and the diff load when the sink runs
  async run(opts, ctx) {
    const [{ nodeStateChunks, globalStateChunks, writeChunksAtomically }, { nodeStateOnce }, { LocalDiff, runLocalDiff }, { FullStateSink }, { startStateSocket }] = await Promise.all([
      import('./index.js'),
      import('./once.js'),
      import('../../diff/local-diff.js'),
      import('../../diff/fullstate.js'),
      import('../api/state-socket.js'),
    ]);
    const format: Format = opts.format === 'json' ? 'json' : 'yaml';
    let first = true;
    // synchronously, whole: the state does not change while it is written
    // resolves once stdout has taken the text: a pipe takes 64 KiB at once
    // and the rest as it drains, and --once exits right after (it would be lost)
    const write = (chunks: Iterable<string>): Promise<void> | void => {
      if (opts.output === '-') {
        // one write: later ones would wait in the stream
        const text = (format === 'yaml' && !first ? '---\n' : '') + [...chunks].join('');
        first = false;
        return new Promise<void>((resolve) => process.stdout.write(text, () => resolve()));
      }
      writeChunksAtomically(opts.output, chunks);
      first = false;
    };
    const stop = new AbortController();
    const onAbort = () => stop.abort();
    ctx.signal.addEventListener('abort', onAbort, { once: true });
    const nodeName: string | undefined = opts.nodeName ?? ctx.nodeName;
    // what it knows, for kpng get, while it follows its source (not for --once)
    const state = opts.once ? undefined : await startStateSocket({ address: opts.stateSocket, store: ctx.store, views: ctx.views, log: ctx.log, defaultNode: nodeName });
    try {
      if (nodeName && opts.once) {
        // one state and exit: computed and written one Service at a time
        if (await synced(ctx.store, stop.signal)) await write(nodeStateChunks(nodeStateOnce(ctx.store, nodeName, ctx.views.proxyName), format));
        return;
      }
      if (nodeName) {
        const sink = new FullStateSink((state) => write(nodeStateChunks(state, format)));
        const diff = new LocalDiff(ctx.store, ctx.views, nodeName, { sets: [LocalSet.NodesSet, LocalSet.ServiceCIDRsSet] });
        await runLocalDiff(diff, sink, stop.signal);
        return;
      }
      // global state: one write per batch of store changes, once all synced
      await new Promise<void>((resolve) => {
        let scheduled = false;
        let wrote = false;
        const flush = () => {
          scheduled = false;
          if (stop.signal.aborted || !ctx.store.allSynced || (opts.once && wrote)) return;
          const written = write(globalStateChunks(ctx.store, format));
          wrote = true;
          if (opts.once) void Promise.resolve(written).then(() => stop.abort());
        };
        const unsubscribe = ctx.store.subscribe(() => {
          if (!scheduled) (scheduled = true), setImmediate(flush);
        });
        stop.signal.addEventListener('abort', () => (unsubscribe(), resolve()), { once: true });
        if (ctx.store.allSynced) flush();
      });
    } finally {
      ctx.signal.removeEventListener('abort', onAbort);
      await state?.stop();
    }
  },
});
