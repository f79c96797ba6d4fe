// A Service's endpoints by key, as a proxier keeps them (ProxierBase), in
// one of three layouts:
// - most Services have a few: key, endpoint pairs in one array of the exact
//   size (a Map costs about 340 bytes even for five);
// - past SMALL_ENDPOINTS pairs, a Map;
// - under kpng local, where nothing else keeps them decoded, encoded
//   (PackedEndpoints) while small, decoded in a Map past that.
// A change may make a new set (a packed set never changes; an array that
// gains a pair is a new one): the caller keeps the one returned.
import type { Endpoint } from '../../api/model.js';
import { PackedEndpoints } from './packed-endpoints.js';

export type EndpointSet = (string | Endpoint)[] | Map<string, Endpoint> | PackedEndpoints;
const SMALL_ENDPOINTS = 16;

/** the set with ep at key; packed: keep it encoded (these bytes, when given) */
export function endpointSet(set: EndpointSet | undefined, key: string, ep: Endpoint, packed?: { bytes?: Uint8Array }): EndpointSet {
  // packed (kpng local): encoded while small, decoded in a Map past that
  if (packed && (!set || set instanceof PackedEndpoints)) {
    const from = set ?? PackedEndpoints.EMPTY;
    if (from.size < SMALL_ENDPOINTS || from.keys.includes(key)) return from.with(key, ep, packed.bytes);
    return new Map([...from.entries(), [key, ep]]);
  }
  if (!set) return [key, ep];
  if (set instanceof PackedEndpoints) return new Map([...set.entries(), [key, ep]]);
  if (set instanceof Map) return set.set(key, ep);
  for (let i = 0; i < set.length; i += 2) {
    if (set[i] !== key) continue;
    set[i + 1] = ep;
    return set;
  }
  if (set.length < 2 * SMALL_ENDPOINTS) {
    // a new array of the exact size: one grown by push keeps room for 16
    // more pairs' worth (a Service's five endpoints: 100 bytes unused)
    const next = new Array<string | Endpoint>(set.length + 2);
    for (let i = 0; i < set.length; i++) next[i] = set[i];
    next[set.length] = key;
    next[set.length + 1] = ep;
    return next;
  }
  const m = new Map<string, Endpoint>();
  for (let i = 0; i < set.length; i += 2) m.set(set[i] as string, set[i + 1] as Endpoint);
  return m.set(key, ep);
}

/** the set without key */
export function endpointDelete(set: EndpointSet, key: string): EndpointSet {
  if (set instanceof PackedEndpoints) return set.without(key);
  if (set instanceof Map) return (set.delete(key), set);
  for (let i = 0; i < set.length; i += 2) if (set[i] === key) return (set.splice(i, 2), set);
  return set;
}

/** a set's endpoints, in no particular order */
export function endpointValues(set: EndpointSet): Iterable<Endpoint> {
  return set instanceof PackedEndpoints || set instanceof Map ? set.values() : pairValues(set);
}

function* pairValues(set: (string | Endpoint)[]): Generator<Endpoint> {
  for (let i = 1; i < set.length; i += 2) yield set[i] as Endpoint;
}

/** a copy to change, the set kept as it is (packed sets never change: a change makes a new one) */
export const copyOf = (set: EndpointSet): EndpointSet => (set instanceof PackedEndpoints ? set : set instanceof Map ? new Map(set) : set.slice());
