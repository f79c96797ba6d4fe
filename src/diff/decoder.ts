// Incremental consumption: ops decoded into callbacks, as kpng's decoder.Sink
// does, so a backend can do work proportional to what changed.
import { LocalSet, type Service, type Endpoint, type LocalNode, type ServiceCIDR } from '../api/model.js';
import type { LocalOp, LocalSink } from './ops.js';
import { splitEndpointPath } from './fullstate.js';
import { flat } from '../runtime/memory.js';

export interface DecoderHandler {
  /** everything known so far is void; the full state follows */
  reset?(): void | Promise<void>;
  setService(svc: Service): void | Promise<void>;
  deleteService(namespace: string, name: string): void | Promise<void>;
  /**
   * key: the endpoint's name within its service (pod name or hash);
   * encoded: the op, whose bytes are its encoding, to be read only by a
   * handler that keeps them (a view of this process encodes on demand)
   */
  setEndpoint(namespace: string, service: string, key: string, ep: Endpoint, encoded: { readonly bytes: Uint8Array }): void | Promise<void>;
  deleteEndpoint(namespace: string, service: string, key: string): void | Promise<void>;
  setNode?(node: LocalNode): void | Promise<void>;
  deleteNode?(name: string): void | Promise<void>;
  setServiceCIDR?(cidr: ServiceCIDR): void | Promise<void>;
  deleteServiceCIDR?(name: string): void | Promise<void>;
  /** the change set is complete: apply it (a proxier resolves with what its sync did) */
  sync(): unknown;
}

export class DecoderSink implements LocalSink {
  constructor(private readonly handler: DecoderHandler) {}

  send(op: LocalOp): void | Promise<void> {
    const h = this.handler;
    switch (op.kind) {
      case 'reset':
        return h.reset?.();
      case 'sync': {
        const r = h.sync();
        return r instanceof Promise ? r.then(() => {}) : undefined;
      }
      case 'set':
        switch (op.set) {
          case LocalSet.ServicesSet:
            return h.setService(op.value as Service);
          case LocalSet.EndpointsSet: {
            const [ns, svc, key] = splitPath3(op.path);
            return h.setEndpoint(ns, svc, key, op.value as Endpoint, op);
          }
          case LocalSet.NodesSet:
            return h.setNode?.(op.value as LocalNode);
          case LocalSet.ServiceCIDRsSet:
            return h.setServiceCIDR?.(op.value as ServiceCIDR);
        }
        return;
      case 'delete':
        switch (op.set) {
          case LocalSet.ServicesSet: {
            const i = op.path.indexOf('/');
            return h.deleteService(op.path.slice(0, i), op.path.slice(i + 1));
          }
          case LocalSet.EndpointsSet: {
            const [ns, svc, key] = splitPath3(op.path);
            return h.deleteEndpoint(ns, svc, key);
          }
          case LocalSet.NodesSet:
            return h.deleteNode?.(op.path);
          case LocalSet.ServiceCIDRsSet:
            return h.deleteServiceCIDR?.(op.path);
        }
    }
  }
}

function splitPath3(path: string): [string, string, string] {
  const [svcKey, key] = splitEndpointPath(path);
  const i = svcKey.indexOf('/');
  return [svcKey.slice(0, i), svcKey.slice(i + 1), flatKey(key)];
}

/**
 * The endpoint's key as a string of its own. A slice of 13 characters or
 * more (a pod name, a hash) is a 32-byte view that keeps the whole path
 * alive, and handlers keep the key as long as the endpoint. kpng local's
 * paths are otherwise garbage: 48 bytes an endpoint less with 24-character
 * pod names, 56 with 30. (to-local's views keep their paths anyway: there a
 * key of n > 16 characters costs about n - 16 bytes more than the slice.)
 */
function flatKey(key: string): string {
  return key.length < 13 ? key : flat(key[0], key.slice(1));
}
