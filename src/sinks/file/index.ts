// to-file: the node-local state (with --node-name) or the global state, as
// YAML or JSON, rewritten atomically (temp file + rename) after each change;
// "-" writes each new state to stdout. The text is made one Service at a
// time (stream.ts: the same bytes as formatDocument of the whole document)
// and streamed into the file; stdout gets it in one write.
import { writeFileSync, renameSync, openSync, closeSync, rmSync } from 'node:fs';
import { FdWriter } from './fd-writer.js';
import { toJson, type DescMessage, type MessageShape } from '@bufbuild/protobuf';
import { yaml } from '../../lazy.js';
import * as L from '../../api/gen/api/localv1/api_pb.js';
import * as G from '../../api/gen/api/globalv1/api_pb.js';
import { LocalSet } from '../../api/model.js';
import { LocalDiff, runLocalDiff } from '../../diff/local-diff.js';
import { FullStateSink, type FullState } from '../../diff/fullstate.js';
import type { Store } from '../../store/store.js';
import { DEFAULT_BRAIN_SOCKET, STATE_SOCKET_HELP, startStateSocket } from '../api/state-socket.js';
import { registerSink } from '../registry.js';
import { documentChunks, type Format } from './stream.js';
import { nodeStateOnce, type NodeStateOnce } from './once.js';

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

/** nodeStateDocument(state) as text, one Service at a time (a NodeStateOnce's services computed as they go) */
export function nodeStateChunks(state: FullState | NodeStateOnce, format: Format): Iterable<string> {
  const head = { node: state.node ? json(L.NodeSchema, state.node) : null, serviceCIDRs: state.serviceCIDRs.map((c) => json(L.ServiceCIDRSchema, c)) };
  const items = (function* () {
    for (const s of state.services) yield { service: json(L.ServiceSchema, s.service), endpoints: s.endpoints.map((e) => json(L.EndpointSchema, e)) };
  })();
  return documentChunks(format, head, 'services', items);
}

/** globalStateDocument(store) as text, one Service at a time (read from the store as it goes: write it before the store changes) */
export function globalStateChunks(store: Store, format: Format): Iterable<string> {
  const byName = <T>(list: T[], key: (x: T) => string) => list.sort((a, b) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0));
  const head = {
    nodes: byName([...store.allNodes()], (n) => n.node.Name).map((n) => json(G.NodeSchema, n.node)),
    serviceCIDRs: store.serviceCIDRs().map((c) => json(L.ServiceCIDRSchema, c.cidr)),
  };
  const services = byName([...store.allServices()], (s) => s.key);
  const items = (function* () {
    for (const s of services) {
      yield { service: json(L.ServiceSchema, s.service), endpoints: store.slicesOfService(s.key).flatMap((sl) => sl.endpoints.map((e) => json(G.EndpointInfoSchema, e))) };
    }
  })();
  return documentChunks(format, head, 'services', items);
}

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

export function formatDocument(doc: unknown, format: 'yaml' | 'json'): string {
  return format === 'json' ? JSON.stringify(doc, null, 2) + '\n' : yaml().stringify(doc, { lineWidth: 0 });
}

export function writeAtomically(path: string, text: string): void {
  const tmp = `${path}.tmp-${process.pid}`;
  writeFileSync(tmp, text);
  renameSync(tmp, path);
}

/** writeAtomically, the text coming in chunks: a temporary file written as they come (FdWriter), then renamed */
export function writeChunksAtomically(path: string, chunks: Iterable<string>): void {
  const tmp = `${path}.tmp-${process.pid}`;
  const fd = openSync(tmp, 'w');
  try {
    const out = new FdWriter(fd);
    for (const c of chunks) out.write(c);
    out.flush();
  } catch (e) {
    closeSync(fd);
    rmSync(tmp, { force: true });
    throw e;
  }
  closeSync(fd);
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
