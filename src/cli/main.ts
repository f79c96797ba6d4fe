// kpng's command line: `kpng <source> [flags] <sink> [flags] [to-<backend> [flags]]`,
// built from the source, sink and backend registries.
import { Command, Option } from 'commander';
import { KpngCommand } from './command.js';
import { createLogger, setLogger, type Logger } from '../runtime/log.js';
import { registeredSources, type SourceDefinition } from '../sources/registry.js';
import { registeredSinks, type SinkDefinition } from '../sinks/registry.js';
import { addBackendCommands, buildBackendsNamedIn, type BackendSpec } from '../backends/run.js';
import { registeredBackends } from '../backends/registry.js';
import { ConfigError } from '../runtime/errors.js';
import { loadConfigFile } from '../backends/shared/config.js';
import { registeredCommands } from './commands.js';
import '../sources/index.js';
import '../sinks/index.js';
import '../backends/index.js';
import { versionLine } from './builtin.js';
import './trace.js';
import './get.js';
import './status.js';
import './local.js';

export { version } from '../runtime/version.js';

/** Runs a source into a sink until the sink finishes or a signal arrives. */
export async function runPipeline(p: {
  source: SourceDefinition;
  sourceOpts: Record<string, any>;
  sink: SinkDefinition;
  sinkOpts: Record<string, any>;
  /** to-local's backends, in order */
  backends?: readonly BackendSpec[];
  log: Logger;
  signal: AbortSignal;
}): Promise<void> {
  // loaded when a pipeline runs: other commands (get, cleanup, --help) have no store
  const [{ Store }, { ServiceViews }, { startStats }] = await Promise.all([import('../store/store.js'), import('../localstate/views.js'), import('./stats.js')]);
  // a server fanning out views computes each slice's many times: it keeps them decoded
  const store = new Store({ keepDecodedSlices: !!p.sink.compactViews });
  const views = new ServiceViews(store, p.sourceOpts.serviceProxyName ?? '', { keepDecoded: !p.sink.compactViews });
  const stopStats = p.sourceOpts.stats ? startStats(store) : undefined;
  const once = !!p.sinkOpts.once || !!p.backends?.some((b) => b.opts.once);
  // the node's kube-proxy configuration names the API server too (clientConnection.kubeconfig)
  const config = p.backends?.[0]?.opts.config;
  const clientConnection = config ? loadConfigFile(String(config)).clientConnection : undefined;
  const source = await p.source.start(p.sourceOpts, { store, log: p.log, signal: p.signal, once, clientConnection });
  try {
    await p.sink.run(p.sinkOpts, { store, views, log: p.log, signal: p.signal, nodeName: p.sourceOpts.nodeName, source: { name: p.source.name, origin: source.origin } }, p.backends ?? []);
  } finally {
    stopStats?.();
    await source.stop();
  }
}

export function buildProgram(run: (fn: (log: Logger, signal: AbortSignal) => Promise<void>) => Promise<void> = runMain): Command {
  const program = new KpngCommand('kpng')
    .description('Kubernetes Proxy NG: kpng <source> [flags] <sink> [flags] [to-<backend> [flags]]')
    .version(versionLine(), '-V, --version', 'print the kpng version')
    .enablePositionalOptions()
    .addOption(new Option('--log-level <level>', 'log level').choices(['trace', 'debug', 'info', 'warn', 'error']).default('info'))
    .addOption(new Option('--log-format <format>', 'log format').choices(['text', 'json']).default('text'));

  for (const source of registeredSources()) {
    const sc = program.command(source.name).description(source.description).enablePositionalOptions();
    source.options(sc);
    sc.option('--service-proxy-name <name>', 'handle only Services labelled service.kubernetes.io/service-proxy-name=<name>', '');
    sc.option('--stats', 'print one stats line per second on stderr');
    sc.option('--node-name <name>', 'the node whose state sinks and backends use, unless they name one themselves');
    for (const sink of registeredSinks()) {
      const kc = sc.command(sink.name).description(sink.description).enablePositionalOptions();
      sink.options(kc);
      const go = (backends: readonly BackendSpec[] = []) => run((log, signal) => runPipeline({ source, sourceOpts: sc.opts(), sink, sinkOpts: kc.opts(), backends, log, signal }));
      if (!sink.takesBackend) {
        kc.action(() => go());
        continue;
      }
      addBackendCommands(kc, go);
    }
  }
  for (const c of registeredCommands()) c(program, run);
  program.hook('preAction', () => {
    const o = program.opts();
    setLogger(createLogger({ level: o.logLevel, format: o.logFormat }));
    logOptions = { level: o.logLevel, format: o.logFormat };
  });
  return program;
}

/** the --log-level and --log-format of the command that runs (how its failure is told) */
let logOptions = { level: 'info', format: 'text' };

/**
 * A command that failed says why once, in one line: "error: ..." on stderr
 * (one JSON record with --log-format json), the way commander reports a
 * usage error; its stack only at --log-level debug or trace (a bug's).
 */
function reportFailure(logger: Logger, e: unknown): void {
  const message = e instanceof ConfigError ? `invalid configuration: ${e.message}` : e instanceof Error ? e.message : String(e);
  const stack = ['debug', 'trace'].includes(logOptions.level) && e instanceof Error ? e.stack : undefined;
  if (logOptions.format === 'json') logger.error(stack ? { stack } : {}, message);
  else process.stderr.write(`error: ${message}\n${stack ? `${stack}\n` : ''}`);
}

/** Runs fn with a logger and a signal that SIGINT/SIGTERM abort, then exits. */
export async function runMain(fn: (log: Logger, signal: AbortSignal) => Promise<void>): Promise<void> {
  const { log } = await import('../runtime/log.js');
  const logger = log();
  const ac = new AbortController();
  const stop = (sig: string) => {
    logger.info({ signal: sig }, 'stopping');
    ac.abort();
  };
  process.once('SIGINT', () => stop('SIGINT'));
  process.once('SIGTERM', () => stop('SIGTERM'));
  let code = 0;
  try {
    await fn(logger, ac.signal);
  } catch (e) {
    code = 1;
    reportFailure(logger, e);
  }
  // sources may keep watches open: exit explicitly
  process.exit(code);
}

export async function main(argv = process.argv): Promise<void> {
  // a to- word that names nothing gets the whole tree, for the error to say what it may have meant
  const known = new Set([...registeredSinks().map((s) => s.name), ...registeredBackends().map((b) => `to-${b.name}`)]);
  buildBackendsNamedIn(argv.some((w) => w.startsWith('to-') && !known.has(w)) ? undefined : argv);
  await buildProgram().parseAsync(argv);
}
