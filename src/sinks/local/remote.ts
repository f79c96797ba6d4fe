// kpng local: the node agent of a split deployment. It watches its node-local
// state on another kpng's /localv1.Sets/Watch (to-api) and drives a backend
// as to-local does (agent.ts), with no store of its own. After a reconnect
// the server resends everything after a Reset; HeldState (held-state.ts)
// turns that into what really changed, so the backend never sees a flush
// and refill (QuietResyncSink: not even a Sync when nothing changed). What a brain sends
// is checked before the backend sees it (ValidatingSink).
import { create } from '@bufbuild/protobuf';
import { WatchReqSchema, type OpItem } from '../../api/gen/api/localv1/api_pb.js';
import { LocalSet, decodeEndpoint, decodeLocalNode, decodeService, decodeServiceCIDR, type Endpoint, type LocalNode, type Service, type ServiceCIDR } from '../../api/model.js';
import { endpointProblem, localPathProblem, nodeProblem, serviceCIDRProblem, serviceProblem } from '../../api/validate.js';
import { brainOrder, parseBrains, runWatch, type WatchClientOptions } from '../../api/grpc/client.js';
import { processStatus, type StatusReport } from '../../api/grpc/status.js';
import { version } from '../../runtime/version.js';
import { localMetrics } from './metrics.js';
import { MAX_BUCKETS } from '../../diff/resume.js';
import { clientTLSFromOpts } from '../../api/grpc/tls.js';
import { localWatchMethod } from '../../api/grpc/wire.js';
import type { LocalOp, LocalSink, LocalValue } from '../../diff/ops.js';
import type { BackendSpec } from '../../backends/run.js';
import { runNodeAgent } from './agent.js';
import { tenantFlags } from '../../aggregator/defaults.js';
import { NodeStateMirror, serveMirror } from './state-mirror.js';
import { HeldState } from './held-state.js';
import type { Logger } from '../../runtime/log.js';

const DECODERS: Partial<Record<LocalSet, (b: Uint8Array) => LocalValue>> = {
  [LocalSet.ServicesSet]: decodeService,
  [LocalSet.EndpointsSet]: decodeEndpoint,
  [LocalSet.NodesSet]: decodeLocalNode,
  [LocalSet.ServiceCIDRsSet]: decodeServiceCIDR,
};

const RESET: LocalOp = { kind: 'reset' };
const SYNC: LocalOp = { kind: 'sync' };

/**
 * An OpItem as a LocalOp, or why it is refused (a set this side does not
 * know, a path of the wrong shape: nothing the node could have, so it is
 * refused before the reset filter). The value is decoded only if someone
 * reads it (the reset filter drops most resent ones).
 */
export function toLocalOp(item: OpItem): LocalOp | string {
  const op = item.Op;
  switch (op.case) {
    case 'Sync': return SYNC;
    case 'Reset': return RESET;
    case 'Resume': {
      // kpng-ts: a resent part only makes sense with a bucket count; without one it is a full Reset
      const buckets = op.value.BucketCount;
      if (!heldBucketCountOk(buckets)) return RESET;
      return { kind: 'reset', resume: { buckets, resent: op.value.Buckets.filter((b) => b < buckets) } };
    }
    case 'Set': {
      const set = op.value.Ref?.Set ?? LocalSet.UnknownSet;
      const path = op.value.Ref?.Path ?? '';
      const decode = DECODERS[set];
      const problem = localPathProblem(set, path) ?? (decode ? undefined : 'no decoder');
      if (problem || !decode) return `local: ignoring a Set of ${LocalSet[set] ?? set} ${JSON.stringify(path)} (${problem})`;
      const bytes = op.value.Bytes;
      let value: LocalValue | undefined;
      return {
        kind: 'set',
        set,
        path,
        bytes,
        get value() {
          return (value ??= decode(bytes));
        },
      };
    }
    case 'Delete': {
      const { Set: set, Path: path } = op.value;
      const problem = localPathProblem(set, path);
      if (problem) return `local: ignoring a Delete of ${LocalSet[set] ?? set} ${JSON.stringify(path)} (${problem})`;
      return { kind: 'delete', set, path };
    }
    default:
      return 'local: ignoring an op of an unknown kind';
  }
}

const heldBucketCountOk = (n: number) => n > 0 && n <= MAX_BUCKETS && (n & (n - 1)) === 0;

/**
 * After a reconnect the resend ends with a Sync even when HeldState
 * found nothing changed: that Sync is dropped, so the backend does not even
 * wake up. Other Syncs go through (the server never sends an empty diff).
 */
export class QuietResyncSink implements LocalSink {
  private resending = false;
  private forwarded = false;
  /** the node's state as received: the reset filter, and what the state socket answers from */
  readonly held: HeldState;

  /** backend: the sink behind, or a function that builds it around the held state (HeldState.backend) */
  constructor(backend: LocalSink | ((held: HeldState) => LocalSink)) {
    let next: LocalSink;
    this.held = new HeldState({
      send: (op) => {
        if (op.kind === 'sync' && this.resending && !this.forwarded) return;
        this.forwarded = op.kind !== 'sync';
        return next.send(op);
      },
    });
    next = typeof backend === 'function' ? backend(this.held) : backend;
  }

  /** what the node holds, for a new stream's first request (resume) */
  heldDigests(): Uint8Array {
    return this.held.heldDigests();
  }

  async send(op: LocalOp): Promise<void> {
    // ops a broken stream left without their Sync still count as forwarded
    if (op.kind === 'reset') this.resending = true;
    await this.held.send(op);
    if (op.kind === 'sync') (this.resending = false), (this.forwarded = false);
  }
}

/** what watchLocalApi needs beyond the connection */
export interface LocalWatchOptions {
  /** send what the node holds on a new stream (HeldDigests), so that a brain resends only the difference (default: when the sink knows it) */
  readonly resume?: boolean;
}

/**
 * Watches one node's state until the signal aborts, reconnecting (or
 * failing over to the next brain) as needed; ops go to sink as they arrive,
 * but for those refused by toLocalOp (one log line each). A sink that knows
 * what the node holds (QuietResyncSink) lets a new stream resume: it sends
 * its digests, and a brain that understands them resends only what differs.
 */
export async function watchLocalApi(opts: WatchClientOptions, nodeName: string, sets: readonly LocalSet[], sink: LocalSink & { heldDigests?(): Uint8Array }, local: LocalWatchOptions = {}): Promise<void> {
  const req = create(WatchReqSchema, { NodeName: nodeName, Sets: [...sets] });
  const resume = local.resume !== false && sink.heldDigests ? () => sink.heldDigests!() : undefined;
  await runWatch({ key: nodeName, ...opts }, localWatchMethod, {
    request: (first) => {
      const held = first && resume ? resume() : undefined;
      return held?.length ? create(WatchReqSchema, { NodeName: nodeName, Sets: [...sets], HeldDigests: held }) : req;
    },
    op: (item) => {
      const op = toLocalOp(item);
      if (typeof op !== 'string') return sink.send(op);
      opts.log.warn(op);
    },
  });
}

/**
 * A value from a brain that does not decode, or is not valid (src/api/validate.ts),
 * never reaches the backend: one log line naming it and the field; the
 * backend keeps what it had (the Set is dropped, it is not a Delete). It sits
 * behind the reset filter (HeldState), which thus counts a refused value as
 * resent: the last good one is not deleted after a reconnect.
 */
export class ValidatingSink implements LocalSink {
  constructor(
    private readonly inner: LocalSink,
    private readonly log: Logger,
  ) {}

  send(op: LocalOp): void | Promise<void> {
    if (op.kind === 'set') {
      const problem = this.problem(op);
      if (problem) {
        this.log.warn({ set: LocalSet[op.set], path: op.path, problem }, `local: ignoring an invalid value of ${LocalSet[op.set]} ${op.path} (${problem}); the last good one stays`);
        return;
      }
    }
    return this.inner.send(op);
  }

  private problem(op: Extract<LocalOp, { kind: 'set' }>): string | undefined {
    let value: LocalValue;
    try {
      value = op.value;
    } catch (e) {
      return `does not decode: ${(e as Error).message}`;
    }
    const named = (name: string) => (name === op.path ? undefined : `Name ${JSON.stringify(name)} is not its path`);
    switch (op.set) {
      case LocalSet.ServicesSet: {
        const svc = value as Service;
        return serviceProblem(svc) ?? (`${svc.Namespace}/${svc.Name}` === op.path ? undefined : `Namespace/Name ${svc.Namespace}/${svc.Name} is not its path`);
      }
      case LocalSet.EndpointsSet:
        return endpointProblem(value as Endpoint);
      case LocalSet.NodesSet:
        return nodeProblem(value as LocalNode) ?? named((value as LocalNode).Name);
      case LocalSet.ServiceCIDRsSet:
        return serviceCIDRProblem(value as ServiceCIDR) ?? named((value as ServiceCIDR).Name);
    }
    return undefined;
  }
}

/**
 * Which brain the node follows and whether it delivered the node's state,
 * for kpng status and kpng_local_brain_connected (every brain's series
 * exists from the start: a node that never reached one shows 0, not nothing).
 */
function followBrains(api: string, node: string): { onStream: NonNullable<WatchClientOptions['onStream']>; status(): StatusReport['brains'] } {
  const order = brainOrder(parseBrains(api), node);
  for (const brain of order) localMetrics.brainConnected.set({ brain }, 0);
  let current: string | undefined;
  let since: number | undefined;
  return {
    onStream(brain, event) {
      if (event === 'open') (current = brain), (since = undefined);
      else if (event === 'synced') since ??= Date.now();
      else since = undefined;
      localMetrics.brainConnected.set({ brain }, since === undefined ? 0 : 1);
    },
    status: () => ({ order, current, synced: since !== undefined, since: since === undefined ? undefined : new Date(since).toISOString() }),
  };
}

export async function runLocal(localOpts: Record<string, any>, backends: readonly BackendSpec[], log: Logger, signal: AbortSignal): Promise<void> {
  await runNodeAgent({
    backends: backends.map((b, i) => (i === 0 ? { ...b, opts: { ...b.opts, nodeName: b.opts.nodeName ?? localOpts.nodeName } } : b)),
    log,
    signal,
    stateSocket: localOpts.stateSocket,
    // the reset filter holds the endpoints' bytes; nothing here keeps them decoded
    packEndpoints: true,
    tenants: tenantFlags(localOpts),
    async feed(sink, stop, b, agentStatus, routes) {
      log.info({ node: b.nodeName, backends: backends.map((x) => x.name).join(','), api: localOpts.api }, 'local: starting');
      const brains = followBrains(localOpts.api, b.nodeName);
      const status = () => ({ ...processStatus('node', version()), brains: brains.status(), ...agentStatus() });
      // what the backend gets, served read-only for kpng get; the mirror
      // answers from the reset filter's state, which learns what the backend took
      let mirror!: NodeStateMirror;
      const quiet = new QuietResyncSink((held) => new ValidatingSink(held.backend((mirror = new NodeStateMirror(held)).wrap(sink)), log));
      const once = backends.some((x) => x.opts.once);
      const served = once ? undefined : await serveMirror(localOpts.stateSocket ?? '', b.nodeName, mirror, log, status, routes);
      try {
        await watchLocalApi(
          {
            address: localOpts.api,
            tls: clientTLSFromOpts(localOpts),
            log,
            signal: stop,
            minBackoffMs: localOpts.errorDelay,
            maxBackoffMs: localOpts.maxErrorDelay,
            watchdogMs: localOpts.watchdog,
            failbackMs: localOpts.failback,
            onStream: brains.onStream,
          },
          b.nodeName,
          b.sets ?? [],
          quiet,
          { resume: localOpts.resume !== false },
        );
      } finally {
        await served?.stop();
      }
    },
  });
}
