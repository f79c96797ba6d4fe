// The one place that says how kpng.bpf.c's map keys and values are laid out
// in bytes. At load every struct here is compared with the object's BTF
// (size and each field's offset), so the C and the encoders cannot drift
// apart unnoticed.
import { canonicalIP, ipFamily, writeIPv6 } from '../../api/ip.js';
import type { BtfStruct } from './libbpf.js';

export const IPPROTO = { tcp: 6, udp: 17 } as const;
export type BpfProto = keyof typeof IPPROTO;

/** C struct name -> size and field offsets, as encoded below */
export const LAYOUTS = {
  kpng_svc_key: { size: 20, fields: { addr: 0, port: 16, proto: 18, family: 19 } },
  kpng_svc_value: { size: 16, fields: { id: 0, count: 4, flags: 6, affinity_secs: 8, pad: 12 } },
  kpng_ep_key: { size: 8, fields: { id: 0, index: 4 } },
  kpng_ep_value: { size: 20, fields: { addr: 0, port: 16, family: 18, pad: 19 } },
  kpng_affinity_key: { size: 16, fields: { netns: 0, id: 8, pad: 12 } },
  kpng_affinity_value: { size: 40, fields: { last_ns: 0, index: 8, pad: 12, ep: 16, pad2: 36 } },
  kpng_rev_key: { size: 32, fields: { cookie: 0, ep: 8, pad: 28 } },
} as const;

/** the maps: name, key and value struct (undefined: a scalar of that size) */
export const MAPS = {
  services: { name: 'kpng_services', key: 'kpng_svc_key', value: 'kpng_svc_value' },
  endpoints: { name: 'kpng_endpoints', key: 'kpng_ep_key', value: 'kpng_ep_value' },
  affinity: { name: 'kpng_affinity', key: 'kpng_affinity_key', value: 'kpng_affinity_value' },
  reverse: { name: 'kpng_reverse', key: 'kpng_rev_key', value: 'kpng_ep_value' },
  counters: { name: 'kpng_counters', key: 4, value: 8 },
  hostNetns: { name: 'kpng_host_netns', key: 4, value: 8 },
} as const;

export type MapName = keyof typeof MAPS;

/** the counters map's slots (enum in the C) */
export const COUNTERS = ['translated', 'refused', 'missed', 'reversed'] as const;

export const SVC_REFUSE = 1;
/** localhost NodePorts: only for sockets in the node's network namespace */
export const SVC_HOST_ONLY = 2;

/** Differences between a struct here and the object's BTF; empty when they agree. */
export function layoutProblems(name: keyof typeof LAYOUTS, btf: BtfStruct | undefined): string[] {
  const want = LAYOUTS[name];
  if (!btf) return [`struct ${name}: not in the object's BTF`];
  const out: string[] = [];
  if (btf.size !== want.size) out.push(`struct ${name}: ${btf.size} bytes in the object, ${want.size} in layout.ts`);
  for (const [field, off] of Object.entries(want.fields)) {
    const got = btf.members.get(field);
    if (got !== off) out.push(`struct ${name}.${field}: offset ${got ?? 'missing'} in the object, ${off} in layout.ts`);
  }
  for (const field of btf.members.keys()) if (!(field in want.fields)) out.push(`struct ${name}.${field}: in the object, not in layout.ts`);
  return out;
}

/** the byte size of a map's key or value */
export function sizeOf(s: keyof typeof LAYOUTS | number): number {
  return typeof s === 'number' ? s : LAYOUTS[s].size;
}

function writeAddr(buf: Buffer, at: number, ip: string): 4 | 6 {
  const c = canonicalIP(ip);
  if (!c) throw new Error(`not an IP address: ${ip}`);
  buf.fill(0, at, at + 16);
  if (ipFamily(c) === 4) {
    c.split('.').forEach((b, i) => buf.writeUInt8(Number(b), at + i));
    return 4;
  }
  writeIPv6(buf, at, c);
  return 6;
}

function readAddr(buf: Buffer, at: number, family: number): string {
  if (family === 4) return [...buf.subarray(at, at + 4)].join('.');
  const parts: string[] = [];
  for (let i = 0; i < 16; i += 2) parts.push(buf.readUInt16BE(at + i).toString(16));
  return canonicalIP(parts.join(':')) ?? parts.join(':');
}

export interface SvcKey {
  readonly ip: string;
  readonly port: number;
  readonly proto: BpfProto;
}
export interface SvcValue {
  readonly id: number;
  readonly count: number;
  readonly flags: number;
  readonly affinitySecs: number;
}
export interface EpValue {
  readonly ip: string;
  readonly port: number;
}

export const encode = {
  svcKey(k: SvcKey, buf: Buffer = Buffer.alloc(20)): Buffer {
    const family = writeAddr(buf, 0, k.ip);
    buf.writeUInt16BE(k.port, 16);
    buf.writeUInt8(IPPROTO[k.proto], 18);
    buf.writeUInt8(family, 19);
    return buf;
  },
  svcValue(v: SvcValue, buf: Buffer = Buffer.alloc(16)): Buffer {
    buf.writeUInt32LE(v.id, 0);
    buf.writeUInt16LE(v.count, 4);
    buf.writeUInt16LE(v.flags, 6);
    buf.writeUInt32LE(v.affinitySecs, 8);
    buf.writeUInt32LE(0, 12);
    return buf;
  },
  epKey(id: number, index: number, buf: Buffer = Buffer.alloc(8)): Buffer {
    buf.writeUInt32LE(id, 0);
    buf.writeUInt32LE(index, 4);
    return buf;
  },
  epValue(v: EpValue, buf: Buffer = Buffer.alloc(20)): Buffer {
    const family = writeAddr(buf, 0, v.ip);
    buf.writeUInt16BE(v.port, 16);
    buf.writeUInt8(family, 18);
    buf.writeUInt8(0, 19);
    return buf;
  },
};

const PROTO_NAME: Record<number, BpfProto | undefined> = { 6: 'tcp', 17: 'udp' };

export const decode = {
  /** undefined for a key kpng would not write */
  svcKey(buf: Buffer): SvcKey | undefined {
    const proto = PROTO_NAME[buf.readUInt8(18)];
    const family = buf.readUInt8(19);
    if (!proto || (family !== 4 && family !== 6)) return undefined;
    return { ip: readAddr(buf, 0, family), port: buf.readUInt16BE(16), proto };
  },
  svcValue(buf: Buffer): SvcValue {
    return { id: buf.readUInt32LE(0), count: buf.readUInt16LE(4), flags: buf.readUInt16LE(6), affinitySecs: buf.readUInt32LE(8) };
  },
  epKey(buf: Buffer): { id: number; index: number } {
    return { id: buf.readUInt32LE(0), index: buf.readUInt32LE(4) };
  },
  epValue(buf: Buffer): EpValue | undefined {
    const family = buf.readUInt8(18);
    if (family !== 4 && family !== 6) return undefined;
    return { ip: readAddr(buf, 0, family), port: buf.readUInt16BE(16) };
  },
};

/** a service key as a string (map of the committed state) */
export const svcKeyString = (k: SvcKey): string => `${k.proto} ${k.ip} ${k.port}`;
