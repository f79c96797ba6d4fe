// kpng demo: the embedded example through kpng's pipeline.
import { fileURLToPath } from 'node:url';
import type { Logger } from '../log.js';
import { Store } from '../store/store.js';
import { ServiceViews } from '../localstate/views.js';
import { FileSource } from '../sources/file/index.js';
import { LocalDiff, runLocalDiff } from '../diff/local-diff.js';
import { formatOp } from '../backends/log/index.js';

export const EXAMPLE = fileURLToPath(new URL('../../examples/cluster.yaml', import.meta.url));

export async function runDemo(opts: { example?: string }, log: Logger, signal: AbortSignal): Promise<void> {
  const store = new Store();
  const src = new FileSource(store, log, { input: opts.example ?? EXAMPLE, watch: false });
  src.start();
  const views = new ServiceViews(store);
  for (const node of ['node-a', 'node-b']) {
    console.log(`\n# node-local diff stream of ${node}`);
    const ac = new AbortController();
    signal.addEventListener('abort', () => ac.abort(), { once: true });
    await runLocalDiff(new LocalDiff(store, views, node), { send: (op) => { console.log(formatOp(op)); if (op.kind === 'sync') ac.abort(); } }, ac.signal);
  }
}
