// to-file: the node-local state (with --node-name) or the global state, as
// YAML or JSON, rewritten atomically (temp file + rename) after each change;
// "-" writes each new state to stdout.
import { writeFileSync, renameSync } from 'node:fs';
import { toJson, type DescMessage, type MessageShape } from '@bufbuild/protobuf';
import { stringify as toYAML } from 'yaml';
import * as L from '../../api/gen/api/localv1/api_pb.js';
import * as G from '../../api/gen/api/globalv1/api_pb.js';
import { LocalSet } from '../../api/model.js';
import { LocalDiff, runLocalDiff } from '../../diff/local-diff.js';
import { FullStateSink, type FullState } from '../../diff/fullstate.js';
import type { Store } from '../../store/store.js';
import { DEFAULT_BRAIN_SOCKET, STATE_SOCKET_HELP, startStateSocket } from '../api/state-socket.js';
import { registerSink } from '../registry.js';

const json = <D extends DescMessage>(schema: D, m: MessageShape<D>) => toJson(schema, m);

export function nodeStateDocument(state: FullState): Record<string, unknown> {
  return {
    node: state.node ? json(L.NodeSchema, state.node) : null,
    serviceCIDRs: state.serviceCIDRs.map((c) => json(L.ServiceCIDRSchema, c)),
    services: state.services.map((s) => ({
      service: json(L.ServiceSchema, s.service),
      endpoints: s.endpoints.map((e) => json(L.EndpointSchema, e)),
    })),
  };
}

export function globalStateDocument(store: Store): Record<string, unknown> {
  const byName = <T>(list: T[], key: (x: T) => string) => list.sort((a, b) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0));
  return {
    nodes: byName([...store.allNodes()], (n) => n.node.Name).map((n) => json(G.NodeSchema, n.node)),
    serviceCIDRs: store.serviceCIDRs().map((c) => json(L.ServiceCIDRSchema, c.cidr)),
    services: byName([...store.allServices()], (s) => s.key).map((s) => ({
      service: json(L.ServiceSchema, s.service),
      endpoints: store.slicesOfService(s.key).flatMap((sl) => sl.endpoints.map((e) => json(G.EndpointInfoSchema, e))),
    })),
  };
}

export function formatDocument(doc: unknown, format: 'yaml' | 'json'): string {
  return format === 'json' ? JSON.stringify(doc, null, 2) + '\n' : toYAML(doc, { lineWidth: 0 });
}

export function writeAtomically(path: string, text: string): void {
  const tmp = `${path}.tmp-${process.pid}`;
  writeFileSync(tmp, text);
  renameSync(tmp, path);
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
  async run(opts, ctx) {
    const format = opts.format === 'json' ? 'json' : 'yaml';
    let first = true;
    const write = (doc: unknown) => {
      const text = formatDocument(doc, format);
      if (opts.output === '-') process.stdout.write((format === 'yaml' && !first ? '---\n' : '') + text);
      else writeAtomically(opts.output, text);
      first = false;
    };
    const stop = new AbortController();
    const onAbort = () => stop.abort();
    ctx.signal.addEventListener('abort', onAbort, { once: true });
    const nodeName: string | undefined = opts.nodeName ?? ctx.nodeName;
    // what it knows, for kpng get, while it follows its source (not for --once)
    const state = opts.once ? undefined : await startStateSocket({ address: opts.stateSocket, store: ctx.store, views: ctx.views, log: ctx.log, defaultNode: nodeName });
    try {
      if (nodeName) {
        const sink = new FullStateSink((state) => {
          write(nodeStateDocument(state));
          if (opts.once) stop.abort();
        });
        const diff = new LocalDiff(ctx.store, ctx.views, nodeName, { sets: [LocalSet.NodesSet, LocalSet.ServiceCIDRsSet] });
        await runLocalDiff(diff, sink, stop.signal);
        return;
      }
      // global state: one write per batch of store changes, once all synced
      await new Promise<void>((resolve) => {
        let scheduled = false;
        const flush = () => {
          scheduled = false;
          if (stop.signal.aborted || !ctx.store.allSynced) return;
          write(globalStateDocument(ctx.store));
          if (opts.once) stop.abort();
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
