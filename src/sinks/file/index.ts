// to-file: the node-local state (with --node-name) or the global state, as
// YAML or JSON, rewritten atomically (temp file + rename) after each change;
// "-" writes each new state to stdout. The text is made one Service at a
// time (stream.ts: the same bytes as formatDocument of the whole document)
// and streamed into the file; stdout gets it in one write.
import { writeFileSync, renameSync, openSync, closeSync, rmSync } from 'node:fs';
import { FdWriter } from './fd-writer.js';
import { toJson, type DescMessage, type MessageShape } from '@bufbuild/protobuf';
import { yaml } from '../../runtime/lazy.js';
import * as L from '../../api/gen/api/localv1/api_pb.js';
import * as G from '../../api/gen/api/globalv1/api_pb.js';
import type { FullState, ServiceEndpoints } from '../../diff/fullstate.js';
import type { Store } from '../../store/store.js';
import { documentChunks, type Format } from './stream.js';
import { endpointToJson } from '../../api/fast-json.js';
import type { NodeStateOnce } from './once.js';

const json = <D extends DescMessage>(schema: D, m: MessageShape<D>) => toJson(schema, m);

/** one Service of a node's state and its endpoints, as the state documents hold them */
const serviceEndpointsJson = (s: ServiceEndpoints) => ({ service: json(L.ServiceSchema, s.service), endpoints: s.endpoints.map(endpointToJson) });

export function nodeStateDocument(state: FullState): Record<string, unknown> {
  return {
    node: state.node ? json(L.NodeSchema, state.node) : null,
    serviceCIDRs: state.serviceCIDRs.map((c) => json(L.ServiceCIDRSchema, c)),
    services: state.services.map(serviceEndpointsJson),
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
    for (const s of state.services) yield serviceEndpointsJson(s);
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
