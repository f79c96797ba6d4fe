// Starting registered backends on one node's diff stream: node name,
// kube-proxy configuration and --once for every backend, wherever its ops
// come from (to-local in-process, or `kpng local` from a brain). Several
// backends can share one stream (`to-local to-ebpf to-nft`: each gets every
// op, in order); they then share one set of health and metrics servers, and
// the node is healthy while every one of them keeps up.
import { hostname } from 'node:os';
import type { Command } from 'commander';
import type { Logger } from '../runtime/log.js';
import type { LocalOp, LocalSink } from '../diff/ops.js';
import { LocalSet } from '../api/model.js';
import { getBackend, registeredBackends, type BackendContext, type BackendDefinition, type BackendInstance, type SyncReporter } from './registry.js';
import { addConfigFlags, configFromFlags, type KubeProxyConfiguration } from './shared/config.js';
import { ProxyHealth, startProxyServers } from '../runtime/health.js';
import { metrics, enableProcessMetrics, initKnownSeries, ipFamily } from '../runtime/metrics.js';
import type { SyncResult } from './shared/runner.js';
import { NodePresence } from './node-presence.js';

/** The flags every backend command has, then the backend's own. */
export function addBackendOptions(cmd: Command, def: BackendDefinition): void {
  cmd
    .option('--node-name <name>', 'the node whose state to program (default: hostnameOverride, then the hostname)')
    .option('--once', 'apply the first full state, then exit 0 (the dataplane stays)');
  addConfigFlags(cmd);
  def.options?.(cmd);
}

/** backends one stream can feed at once (`to-local to-ebpf to-nft`) */
const MAX_BACKENDS = 3;

// The command line names at most a few backends; the full tree of
// `to-<backend>` commands (each with the others under it) is hundreds of
// commands, built at every start for nothing. Once the words of
// the command line are known, only the named backends get their subtrees;
// the others are listed (for help) without theirs.
let namedBackends: ReadonlySet<string> | undefined;

/** Builds only the backends argv names in full (see addBackendCommands); undefined: all. */
export function buildBackendsNamedIn(argv: readonly string[] | undefined): void {
  namedBackends = argv && new Set(argv.filter((w) => w.startsWith('to-')).map((w) => w.slice(3)));
}

/**
 * `to-<backend> [flags]` commands under cmd, each with the other backends
 * under it again (up to MAX_BACKENDS in a row): the command line names
 * several backends for one stream, each with its own flags.
 */
export function addBackendCommands(cmd: Command, go: (backends: readonly BackendSpec[]) => Promise<void> | void, chain: readonly { name: string; cmd: Command }[] = []): void {
  const candidates = registeredBackends().filter((b) => !chain.some((c) => c.name === b.name));
  const named = namedBackends && candidates.filter((b) => namedBackends!.has(b.name));
  const pruned = named !== undefined && named.length > 0;
  for (const b of pruned ? named : candidates) {
    const bc = cmd.command(`to-${b.name}`).description(chain.length ? `${b.description} (beside ${chain.map((c) => `to-${c.name}`).join(', ')})` : b.description);
    if (chain.length + 1 < MAX_BACKENDS) bc.enablePositionalOptions();
    addBackendOptions(bc, b);
    const here = [...chain, { name: b.name, cmd: bc }];
    bc.action(() => go(here.map((c) => ({ name: c.name, opts: c.cmd.opts() }))));
    // a backend the command line does not name only needs its own flags (for help)
    if (here.length < MAX_BACKENDS && (namedBackends === undefined || pruned)) addBackendCommands(bc, go, here);
  }
}

/** A backend as chosen on the command line: its name and flags. */
export interface BackendSpec {
  readonly name: string;
  readonly opts: Record<string, any>;
}

export interface StartedBackend {
  /** the backends, in the order they get each op */
  readonly instances: readonly BackendInstance[];
  /** the sets every backend wants, together */
  readonly sets: readonly LocalSet[];
  readonly nodeName: string;
  /** the first backend's configuration (its servers' addresses) */
  readonly config: KubeProxyConfiguration;
  /** the sink to feed: every backend's, with health, metrics and --once around them */
  readonly sink: LocalSink;
  /** resolves after the first Sync was applied when --once is set */
  readonly done: Promise<void>;
  readonly health: ProxyHealth;
  /** the backends that report sync results (the dataplane ones), by index */
  readonly reporting: readonly number[];
  /** the last sync's result of any backend (whoever asked for it) */
  readonly lastResult: SyncResult | undefined;
  /** every sync's result from now on, with the index of the backend; returns an unsubscriber */
  onResult(listener: (r: SyncResult, backend: number) => void): () => void;
  /** stops the backends and their servers (the dataplane stays) */
  close(): Promise<void>;
}

/** One backend: see startBackends. */
export function startBackend(name: string, opts: Record<string, any>, log: Logger, signal: AbortSignal): Promise<StartedBackend> {
  return startBackends([{ name, opts }], log, signal);
}

export async function startBackends(specs: readonly BackendSpec[], log: Logger, signal: AbortSignal, context: Pick<BackendContext, 'packEndpoints' | 'tenants'> = {}): Promise<StartedBackend> {
  if (!specs.length) throw new Error('no backend');
  const defs = specs.map((s) => {
    const def = getBackend(s.name);
    if (!def) throw new Error(`unknown backend ${s.name}`);
    return def;
  });
  const configs = specs.map((s) => configFromFlags(s.opts));
  const first = specs[0].opts;
  const config = configs[0];
  const nodeName = String(first.nodeName || config.hostnameOverride || hostname());
  const reporting = defs.map((d, i) => (d.proxyMode ? i : -1)).filter((i) => i >= 0);
  const timeout = 2 * Math.max(...defs.map((d, i) => d.syncPeriodMs?.(configs[i]) ?? configs[i].nftables.syncPeriodMs));
  const health = new ProxyHealth(timeout, Math.max(1, reporting.length));
  const changes = new ChangeMetrics();
  const results = new SyncResults(health, reporting, changes);
  const instances: BackendInstance[] = [];
  const closeInstances = async () => {
    for (const i of [...instances].reverse()) await i.close?.();
  };
  try {
    for (const [i, def] of defs.entries()) {
      const blog = log.child({ backend: def.name });
      instances.push(await def.create({ ...specs[i].opts, nodeName }, { ...context, nodeName, config: configs[i], log: blog, signal, report: results.reportOf(i) }));
    }
  } catch (e) {
    await closeInstances();
    throw e;
  }
  let closeServers = async () => {};
  const once = specs.some((s) => s.opts.once);
  const modes = defs.map((d) => d.proxyMode).filter((m): m is string => !!m);
  warnOfIgnoredModes(specs, configs, modes, log);
  const sets = [...new Set(instances.flatMap((i) => i.sets ?? []))];
  const node = new NodePresence(nodeName, health, log, sets.includes(LocalSet.NodesSet));
  if (modes.length && !once) {
    enableProcessMetrics();
    initKnownSeries(modes);
    closeServers = await startProxyServers(
      health,
      { healthzBindAddress: config.healthzBindAddress, metricsBindAddress: config.metricsBindAddress, proxyMode: modes.join('+'), hardFail: config.bindAddressHardFail },
      log.child({ backend: defs.map((d) => d.name).join('+') }),
    );
  }
  let resolveDone!: () => void;
  const done = new Promise<void>((r) => (resolveDone = r));
  return {
    instances,
    sets,
    nodeName,
    config,
    sink: fanOut(instances, health, node, changes, () => once && resolveDone()),
    done,
    health,
    reporting,
    get lastResult() {
      return results.last;
    },
    onResult: (l) => results.listen(l),
    async close() {
      node.close();
      await closeInstances();
      await closeServers();
    },
  };
}

/**
 * The sink every backend's ops go through: each backend gets each op, in
 * order, synchronously while they are (no promise per op); the diff's
 * changes are counted (metrics), its start and end told to health, and the
 * node's presence followed (node-presence.ts). ended: after a Sync went
 * through every backend.
 */
function fanOut(instances: readonly BackendInstance[], health: ProxyHealth, node: NodePresence, changes: ChangeMetrics, ended: () => void): LocalSink {
  let inDiff = false;
  const toInstances = async (op: LocalOp, from: number, pending: unknown): Promise<void> => {
    await pending;
    for (let i = from; i < instances.length; i++) await instances[i].sink.send(op);
  };
  return {
    send(op: LocalOp) {
      if (!inDiff && op.kind !== 'sync') {
        inDiff = true;
        health.queued();
      }
      changes.count(op);
      if (op.kind === 'sync') {
        node.synced();
        health.delivered();
      } else if (op.kind !== 'reset' && op.set === LocalSet.NodesSet) node.op(op);
      const through = () => {
        if (op.kind !== 'sync') return;
        inDiff = false;
        ended();
      };
      for (let i = 0; i < instances.length; i++) {
        const r = instances[i].sink.send(op);
        if (r) return toInstances(op, i + 1, r).then(through);
      }
      through();
      return undefined;
    },
  };
}

/**
 * kube-proxy's change metrics: changes received (counted per diff, told
 * once at its Sync: prom-client's labelled inc per op would be a good part of
 * a cold sync's delivery) and not yet applied everywhere (*_changes_pending), and
 * each sync's duration.
 */
class ChangeMetrics {
  private pendingEndpoints = 0;
  private pendingServices = 0;
  private readonly tally = { endpoints: 0, services: 0, ops: { set: 0, delete: 0, reset: 0 } };

  count(op: LocalOp): void {
    const tally = this.tally;
    if (op.kind === 'set' || op.kind === 'delete') {
      if (op.set === LocalSet.EndpointsSet) {
        tally.endpoints++;
        this.pendingEndpoints++;
      } else if (op.set === LocalSet.ServicesSet) {
        tally.services++;
        this.pendingServices++;
      }
    }
    if (op.kind === 'sync') {
      this.flush();
      metrics.opsSent.inc({ op: 'sync' });
    } else tally.ops[op.kind]++;
  }

  /** a good sync: every change received was applied if health says so */
  synced(r: SyncResult, applied: boolean): void {
    if (applied) {
      this.pendingEndpoints = this.pendingServices = 0;
      metrics.endpointChangesPending.set(0);
      metrics.serviceChangesPending.set(0);
    }
    const family = { ip_family: ipFamily() };
    metrics.syncDuration.observe(family, r.durationMs / 1000);
    (r.full ? metrics.syncFullDuration : metrics.syncPartialDuration).observe(family, r.durationMs / 1000);
  }

  private flush(): void {
    const tally = this.tally;
    if (tally.endpoints) metrics.endpointChangesTotal.inc(tally.endpoints);
    if (tally.services) metrics.serviceChangesTotal.inc(tally.services);
    metrics.endpointChangesPending.set(this.pendingEndpoints);
    metrics.serviceChangesPending.set(this.pendingServices);
    for (const [op, n] of Object.entries(tally.ops)) if (n) metrics.opsSent.inc({ op }, n);
    tally.endpoints = tally.services = tally.ops.set = tally.ops.delete = tally.ops.reset = 0;
  }
}

/** What the backends' syncs report: to health, to the change metrics, and to whoever listens. */
class SyncResults {
  /** the last sync's result of any backend */
  last: SyncResult | undefined;
  private readonly listeners = new Set<(r: SyncResult, backend: number) => void>();

  constructor(
    private readonly health: ProxyHealth,
    /** the backends that report sync results (the dataplane ones), by index */
    private readonly reporting: readonly number[],
    private readonly changes: ChangeMetrics,
  ) {}

  reportOf(index: number): SyncReporter {
    return (r) => {
      this.last = r;
      this.health.observe(r, Math.max(0, this.reporting.indexOf(index)));
      for (const l of this.listeners) l(r, index);
      if (r.ok) this.changes.synced(r, this.health.applied);
    };
  }

  listen(l: (r: SyncResult, backend: number) => void): () => void {
    this.listeners.add(l);
    return () => this.listeners.delete(l);
  }
}

/** the backend of each kube-proxy mode a configuration may name */
const BACKEND_OF_MODE: Record<string, string> = { nftables: 'nft', iptables: 'iptables', ipvs: 'ipvs', userspace: 'userspace' };

/**
 * kube-proxy chooses its proxier by the configuration's mode; kpng by the
 * command line. A mode no backend here runs would be silently ignored: it is
 * said once, with the command that runs it.
 */
function warnOfIgnoredModes(specs: readonly BackendSpec[], configs: readonly KubeProxyConfiguration[], modes: readonly string[], log: Logger): void {
  const said = new Set<string>();
  configs.forEach((c, i) => {
    const where = `--config ${specs[i].opts.config}`;
    if (!c.mode || modes.includes(c.mode) || said.has(`${where} ${c.mode}`)) return;
    said.add(`${where} ${c.mode}`);
    const backend = BACKEND_OF_MODE[c.mode];
    const fix = backend ? `the backend is chosen on the command line: to-${backend}` : 'kpng has no backend for it';
    log.warn(`${where}: mode: ${c.mode} is ignored (this process runs to-${specs.map((s) => s.name).join(', to-')}); ${fix}`);
  });
}
