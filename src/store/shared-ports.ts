// Services' port lists, one copy for the Services whose lists are the same:
// most Services have one of a few (a ClusterIP Service's "http" 80 -> 8080),
// and a list and each PortMapping in it were objects of their own per
// Service (1 MiB at 10k Services). Frozen: nothing may change a stored
// message. The pool is bounded: when full it starts over (Services keep the
// lists they have).
import type { PortMapping } from '../api/gen/api/localv1/api_pb.js';

const POOL_MAX = 4096;
let pool = new Map<string, readonly PortMapping[]>();

/** the pool's copy of a list of ports (compact copies: every field a scalar, in the same order) */
export function sharedPorts(ports: readonly PortMapping[]): readonly PortMapping[] {
  if (ports.length === 0) return ports;
  for (const p of ports) if (Object.getPrototypeOf(p) !== Object.prototype) return ports;
  const key = JSON.stringify(ports.map((p) => Object.values(p)));
  const had = pool.get(key);
  if (had) return had;
  if (pool.size >= POOL_MAX) pool = new Map();
  const list = Object.freeze(ports.map((p) => Object.freeze(p)));
  pool.set(key, list);
  return list;
}
