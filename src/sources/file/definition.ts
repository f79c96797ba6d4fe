// The file source's definition (name, flags): registered at start for the
// command line; the reader (index.ts) loads when the source runs.
import { statSync } from 'node:fs';
import { resolve } from 'node:path';
import { ConfigError } from '../../runtime/errors.js';
import { registerSource } from '../registry.js';

const message = (e: unknown) => (e instanceof Error ? e.message : String(e));

registerSource({
  name: 'file',
  description: 'read Kubernetes objects (kubectl get -o yaml|json) from a file or a directory, and follow their changes',
  options(cmd) {
    cmd
      .requiredOption('-i, --input <path>', 'file or directory of Service, EndpointSlice, Node and ServiceCIDR objects (regular files named *.yaml, *.yml, *.json)')
      .option('--debounce <ms>', 'reload once file events have been quiet this long (at the latest 10 times this, and 1 s, after the first event); a JSON file that parses whole is taken at its first event', '100')
      .option('--write-grace <ms>', 'a file rewritten in place that looks unfinished (emptied, lost objects, cut mid-line, does not parse) keeps its objects this long before it counts', '3000')
      .option('--no-watch', 'read the input once; do not follow changes');
  },
  async start(opts, ctx) {
    const ms = (flag: string, v: string) => {
      const n = Number(v);
      if (!Number.isInteger(n) || n < 0 || n > 3_600_000) throw new ConfigError(flag, `${v} is not a whole number of milliseconds from 0 to 3600000`);
      return n;
    };
    const debounceMs = ms('--debounce', opts.debounce);
    const writeGraceMs = ms('--write-grace', opts.writeGrace);
    // followed, a missing input may still appear (its directory is watched);
    // read once (--once, --no-watch), it would be an empty cluster and a wrong success
    if (ctx.once || opts.watch === false) {
      try {
        statSync(opts.input);
      } catch (e) {
        const code = (e as NodeJS.ErrnoException).code;
        throw new ConfigError('--input', `${resolve(opts.input)}: ${code === 'ENOENT' ? 'no such file or directory' : (code ?? message(e))}`);
      }
    }
    // the reader and its parser thread load when the source starts
    const { FileSource } = await import('./index.js');
    const src = new FileSource(ctx.store, ctx.log, { input: opts.input, debounceMs, watch: opts.watch, writeGraceMs });
    const stop = () => src.stop();
    ctx.signal.addEventListener('abort', stop, { once: true });
    // sinks wait for the store to be synced, which start() does once the input is loaded
    src.start().catch((e) => ctx.log.error({ err: message(e) }, 'file source: failed to start'));
    return {
      origin: opts.input,
      stop: async () => {
        ctx.signal.removeEventListener('abort', stop);
        await src.stop();
      },
    };
  },
});
