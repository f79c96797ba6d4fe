// Applying converted Kubernetes objects to the store, shared by sources.
import { encodeSlice, type StoreTx } from '../store/store.js';
import type { Converted } from './objects.js';
import { flat } from '../runtime/memory.js';
import { encodeServiceFast } from '../api/fast-encode.js';

/** an EndpointSlice already in the store's form (encodeSlice): what the file source's worker thread hands over */
export interface EncodedSlice {
  kind: 'EncodedSlice';
  namespace: string;
  name: string;
  serviceName: string;
  bytes: Uint8Array;
}

/** a Service as its canonical encoding (encodeServiceFast): what a worker thread hands over */
export interface EncodedService {
  kind: 'EncodedService';
  namespace: string;
  name: string;
  bytes: Uint8Array;
}

export type ModelObject = Exclude<Converted, { kind: 'Ignored' }> | EncodedSlice | EncodedService;

/**
 * The object in the form that costs least to hand over and store: a slice
 * encoded; a Service too when it crosses from a worker thread (its bytes
 * clone for a tenth of what the object does, and the store's decoder takes
 * them for about what a copy of the object costs there).
 */
export function encodedObject(c: ModelObject, crossing = false): ModelObject {
  if (c.kind === 'Service' && crossing) return { kind: 'EncodedService', namespace: c.namespace, name: c.name, bytes: encodeServiceFast(c.service) };
  if (c.kind !== 'EndpointSlice') return c;
  return { kind: 'EncodedSlice', namespace: c.namespace, name: c.name, serviceName: c.serviceName, bytes: encodeSlice(c.serviceName, c.endpoints) };
}

/** kind/namespace/name: identifies an object across reloads */
export function modelKey(c: ModelObject): string {
  switch (c.kind) {
    case 'Service':
    case 'EndpointSlice':
      return flat(c.kind, '/', c.namespace, '/', c.name);
    case 'EncodedService':
      return flat('Service/', c.namespace, '/', c.name);
    case 'EncodedSlice':
      return flat('EndpointSlice/', c.namespace, '/', c.name);
    case 'Node':
    case 'ServiceCIDR':
      return flat(c.kind, '/', c.name);
  }
}

export function applyObject(tx: StoreTx, c: ModelObject): void {
  switch (c.kind) {
    case 'Service': return tx.setService(c.service);
    case 'EncodedService': return tx.setServiceBytes(c.bytes);
    case 'EndpointSlice': return tx.setSlice(c.namespace, c.name, c.serviceName, c.endpoints);
    case 'EncodedSlice': return tx.setSliceBytes(c.namespace, c.name, c.serviceName, c.bytes);
    case 'Node': return tx.setNode(c.node);
    case 'ServiceCIDR': return tx.setServiceCIDR(c.cidr);
  }
}

/** Deletes the object a model key names (modelKey): a source need not keep the object to delete it. */
export function deleteByKey(tx: StoreTx, key: string): void {
  const [kind, a, b] = key.split('/');
  switch (kind) {
    case 'Service': return tx.deleteService(a, b);
    case 'EndpointSlice': return tx.deleteSlice(a, b);
    case 'Node': return tx.deleteNode(a);
    case 'ServiceCIDR': return tx.deleteServiceCIDR(a);
  }
}

export function deleteObject(tx: StoreTx, c: ModelObject): void {
  switch (c.kind) {
    case 'Service':
    case 'EncodedService': return tx.deleteService(c.namespace, c.name);
    case 'EndpointSlice':
    case 'EncodedSlice': return tx.deleteSlice(c.namespace, c.name);
    case 'Node': return tx.deleteNode(c.name);
    case 'ServiceCIDR': return tx.deleteServiceCIDR(c.name);
  }
}
