// Compact copies of protobuf-es messages for values kept a long time.
//
// protobuf-es builds a message as `{ $typeName }` and then adds its fields
// one by one, so V8 keeps all but the first few of them outside the object,
// in a separate property array, which makes a large part of what the store
// keeps (docs/design/compact-store.md). A copy made by one object literal
// naming every field keeps them inside the object.
// The literal is compiled once per message type (like protobuf-es's own
// create), lists get their exact length, and empty lists and maps are one
// shared frozen value: nothing may change a stored message.
import { ScalarType, type DescField, type DescMessage, type Message } from '@bufbuild/protobuf';
import type { PortMapping, PortName } from './gen/api/localv1/api_pb.js';

/** copies made in one call, by source: what the source shared stays shared */
type Memo = Map<object, unknown>;
type Copy = (m: Record<string, unknown>, memo: Memo) => Record<string, unknown>;

const EMPTY_LIST: readonly unknown[] = Object.freeze([]);
const EMPTY_MAP: Readonly<Record<string, unknown>> = Object.freeze({});

const copies = new WeakMap<DescMessage, Copy>();

// Strings that repeat across objects (namespaces, service and node names,
// zones) arrive as a fresh copy in every object a source decodes or a worker
// thread clones, and held that way they are a large part of the store's
// memory. Fields that name such things share one copy. The pool is
// bounded: when full it starts over (objects keep the copies they have).
const POOLED_FIELDS = new Set(['Namespace', 'Name', 'ServiceName', 'SourceName', 'NodeName', 'Node', 'Zone', 'Type', 'TargetPortName', 'Hostname']);
const POOL_MAX = 1 << 16;
let pool = new Map<string, string>();

/** the pool's copy of s */
export function pooled(s: string): string {
  if (s === '' || s.length > 253) return s;
  const p = pool.get(s);
  if (p !== undefined) return p;
  if (pool.size >= POOL_MAX) pool = new Map();
  pool.set(s, s);
  return s;
}

function list(memo: Memo, xs: unknown[] | undefined, each?: Copy): readonly unknown[] {
  if (!xs || xs.length === 0) return EMPTY_LIST;
  let c = memo.get(xs) as unknown[] | undefined;
  if (!c) memo.set(xs, (c = each ? xs.map((x) => each(x as Record<string, unknown>, memo)) : xs.slice()));
  return c;
}

function map(memo: Memo, o: Record<string, unknown> | undefined, each?: Copy): Readonly<Record<string, unknown>> {
  if (!o) return EMPTY_MAP;
  const keys = Object.keys(o);
  if (keys.length === 0) return EMPTY_MAP;
  if (!each) return o;
  const out: Record<string, unknown> = {};
  for (const k of keys) out[k] = each(o[k] as Record<string, unknown>, memo);
  return out;
}

function message(memo: Memo, m: Record<string, unknown> | undefined, copy: Copy): Record<string, unknown> | undefined {
  if (m === undefined) return undefined;
  let c = memo.get(m) as Record<string, unknown> | undefined;
  if (!c) memo.set(m, (c = copy(m, memo)));
  return c;
}

// A nested message left at its defaults (a Service's empty ExternalIPs,
// LoadBalancerIPs, ProxyLoadBalancerIPs; a oneof with no case) is one shared
// frozen value per type: 150 bytes a Service less to keep.
const NO_CASE = Object.freeze({ case: undefined });
const defaults = new Map<unknown, Readonly<Record<string, unknown>>>();

function isDefault(v: unknown): boolean {
  return v === '' || v === 0 || v === false || v === 0n || v === undefined || v === EMPTY_LIST || v === EMPTY_MAP || v === NO_CASE || (v instanceof Uint8Array && v.length === 0);
}

function nestedMessage(memo: Memo, m: Record<string, unknown> | undefined, copy: Copy): Record<string, unknown> | undefined {
  const c = message(memo, m, copy);
  if (!c) return c;
  let flags = true;
  for (const k in c) {
    if (k === '$typeName' || isDefault(c[k])) continue;
    if (typeof c[k] !== 'boolean') return c;
    flags = false;
  }
  if (!flags) return flagsMessage(c);
  let d = defaults.get(c.$typeName);
  if (!d) defaults.set(c.$typeName, (d = Object.freeze(c)));
  return d as Record<string, unknown>;
}

// A nested message of flags only (an endpoint's Scopes, a slice endpoint's
// Conditions) has a few values at most: one shared frozen copy of each (a
// 56-byte object per endpoint otherwise).
const flagMessages = new Map<string, Readonly<Record<string, unknown>>>();
function flagsMessage(c: Record<string, unknown>): Record<string, unknown> {
  let key = c.$typeName as string;
  for (const k in c) if (k !== '$typeName') key += c[k] ? '1' : '0';
  let d = flagMessages.get(key);
  if (!d) {
    if (flagMessages.size >= 1024) flagMessages.clear();
    flagMessages.set(key, (d = Object.freeze(c)));
  }
  return d as Record<string, unknown>;
}

// Services' port lists, one copy for the Services whose lists are the same:
// most Services have one of a few (a ClusterIP Service's "http" 80 -> 8080),
// and a list and each PortMapping in it would otherwise be objects of their
// own per Service. The pool is bounded: when full it starts over (Services
// keep the lists they have).
const PORTS_POOL_MAX = 4096;

/** frozen lists, one per key; bounded: when full it starts over (holders keep the lists they have) */
class ListPool<T extends object> {
  private lists = new Map<string, readonly T[]>();

  shared(key: string, list: readonly T[]): readonly T[] {
    const had = this.lists.get(key);
    if (had) return had;
    if (this.lists.size >= PORTS_POOL_MAX) this.lists = new Map();
    const frozen = Object.freeze(list.map((x) => Object.freeze(x)));
    this.lists.set(key, frozen);
    return frozen;
  }
}

const portLists = new ListPool<PortMapping>();

/** the pool's frozen copy of a compact list of ports (every field a scalar) */
export function sharedPorts(ports: readonly PortMapping[]): readonly PortMapping[] {
  if (ports.length === 0) return ports;
  // the key by hand, each name after its length (no two lists have the
  // same key): JSON of each port's values would be a good part of a Service's copy
  let key = '';
  for (const p of ports) {
    if (Object.getPrototypeOf(p) !== Object.prototype || p.$unknown !== undefined) return ports;
    key += `${p.Protocol}/${p.Port}/${p.NodePort}/${p.TargetPort}/${p.HasEndpointsV4 ? 1 : 0}${p.HasEndpointsV6 ? 1 : 0}/${p.Name.length}/${p.Name}/${p.TargetPortName.length}/${p.TargetPortName};`;
  }
  return portLists.shared(key, ports);
}

// Endpoints' PortOverrides likewise: almost every endpoint of a Service maps
// the Service's ports the same way, and most Services map one of a few
// ("http" -> 8080). A list and its PortName of their own cost 112 bytes per
// endpoint a proxier keeps; shared, nothing.
const portNameLists = new ListPool<PortName>();

/** the pool's frozen copy of an endpoint's PortOverrides (compact PortNames: no unknown fields, no prototype chain) */
export function sharedPortNames(ports: readonly PortName[]): readonly PortName[] {
  if (ports.length === 0 || Object.isFrozen(ports)) return ports;
  // the name last, after its length: no two lists have the same key
  let key = '';
  for (const p of ports) {
    if (Object.getPrototypeOf(p) !== Object.prototype || p.$unknown !== undefined) return ports;
    key += `${p.Port}/${p.Protocol}/${p.Name.length}/${p.Name}`;
  }
  return portNameLists.shared(key, ports);
}

/** whether a message (or anything nested in it) has unknown fields: compact's copy leaves them out */
export function anyUnknownFields(v: unknown): boolean {
  if (typeof v !== 'object' || v === null || v instanceof Uint8Array) return false;
  if (Array.isArray(v)) return v.some(anyUnknownFields);
  const o = v as Record<string, unknown>;
  if ((o.$unknown as unknown[] | undefined)?.length) return true;
  for (const k in o) if (k !== '$unknown' && anyUnknownFields(o[k])) return true;
  return false;
}

function compile(desc: DescMessage): Copy {
  const helpers: Copy[] = [];
  const helper = (d: DescMessage) => {
    helpers.push((m, memo) => copyOf(d)(m, memo));
    return `h[${helpers.length - 1}]`;
  };
  const value = (f: DescField, v: string): string => {
    switch (f.fieldKind) {
      case 'scalar':
        return f.scalar === ScalarType.STRING && POOLED_FIELDS.has(f.localName) ? `pooled(${v})` : v;
      case 'enum':
        return v;
      case 'message':
        return `message(memo, ${v}, ${helper(f.message)})`;
      case 'list':
        // an endpoint's PortOverrides: the pool's list (sharedPortNames)
        if (f.listKind === 'message' && f.message.typeName === 'localv1.PortName') return `portNames(list(memo, ${v}, ${helper(f.message)}))`;
        return `list(memo, ${v}${f.listKind === 'message' ? `, ${helper(f.message)}` : ''})`;
      case 'map':
        return `map(memo, ${v}${f.mapKind === 'message' ? `, ${helper(f.message)}` : ''})`;
    }
  };
  // the descriptor's name, not the message's: a decoded or cloned message has its own copy
  const props = [`$typeName: ${JSON.stringify(desc.typeName)}`];
  for (const member of desc.members) {
    const v = `m[${JSON.stringify(member.localName)}]`;
    if (member.kind === 'oneof') {
      // { case, value }: the value is copied by the case's field
      const cases = member.fields.map((f) => `${JSON.stringify(f.localName)}: (x) => ${value(f, 'x')}`).join(', ');
      props.push(`${JSON.stringify(member.localName)}: oneof(${v}, { ${cases} })`);
    } else props.push(`${JSON.stringify(member.localName)}: ${value(member, v)}`);
  }
  const oneof = (o: { case?: string; value?: unknown } | undefined, byCase: Record<string, (x: unknown) => unknown>) =>
    o?.case === undefined ? NO_CASE : { case: o.case, value: byCase[o.case](o.value) };
  // eslint-disable-next-line @typescript-eslint/no-implied-eval
  const make = new Function('h', 'list', 'map', 'message', 'oneof', 'pooled', 'portNames', `return (m, memo) => ({ ${props.join(', ')} });`);
  return make(helpers, list, map, nestedMessage, oneof, pooled, sharedPortNames) as Copy;
}

function copyOf(desc: DescMessage): Copy {
  let c = copies.get(desc);
  if (!c) copies.set(desc, (c = compile(desc)));
  return c;
}

/**
 * A copy of a message whose fields are all inside one object; nested
 * messages are copied too. Parts the given messages share (the same list or
 * message object) are copied once and stay shared. Messages with a prototype
 * chain (proto2 defaults) are returned as they are.
 */
export function compact<T extends Message>(schema: DescMessage, ms: readonly T[]): T[] {
  const memo: Memo = new Map();
  const copy = copyOf(schema);
  return ms.map((m) => (Object.getPrototypeOf(m) !== Object.prototype ? m : (message(memo, m as unknown as Record<string, unknown>, copy) as unknown as T)));
}

/** a memo that remembers nothing: for a message none of whose parts appear twice */
const NO_MEMO: Memo = {
  get: () => undefined,
  set: () => NO_MEMO,
} as unknown as Memo;

/**
 * compact() of one message that shares no part with itself or with others
 * (one just decoded or converted: each list and message made once), without
 * the memo that keeps shared parts shared, whose lookups are a large part
 * of a Service's copy (docs/design/compact-store.md). A part that does
 * appear twice is copied twice: the same values, less sharing.
 */
export function compactOne<T extends Message>(schema: DescMessage, m: T): T {
  if (Object.getPrototypeOf(m) !== Object.prototype) return m;
  return message(NO_MEMO, m as unknown as Record<string, unknown>, copyOf(schema)) as unknown as T;
}
