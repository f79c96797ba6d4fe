// IPVS over generic netlink ("IPVS" family, linux/ip_vs.h), in this process
// (docs/ipvs.md says why not ipvsadm: one change through `ipvsadm -R` costs
// a process start, tens of times what a netlink message costs).
// Virtual servers and their real servers are listed, added, changed and
// deleted in batches; IPVS has no transactions, so every operation is
// acknowledged on its own and the caller commits what succeeded.
import { isIPv4 } from 'node:net';
import { writeIPv6 } from '../../api/ip.js';
import { KernelError } from '../../kernel/libc.js';
import { NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkMessage, NetlinkSocket, NetlinkWriter } from '../../kernel/netlink.js';

const NETLINK_GENERIC = 16;
const GENL_ID_CTRL = 0x10;
const CTRL_CMD_GETFAMILY = 3;
const CTRL_ATTR_FAMILY_ID = 1;
const CTRL_ATTR_FAMILY_NAME = 2;

const CMD = { NEW_SERVICE: 1, SET_SERVICE: 2, DEL_SERVICE: 3, GET_SERVICE: 4, NEW_DEST: 5, SET_DEST: 6, DEL_DEST: 7, GET_DEST: 8, SET_CONFIG: 12, GET_CONFIG: 13 } as const;
const CMD_ATTR = { SERVICE: 1, DEST: 2, TIMEOUT_TCP: 4, TIMEOUT_TCP_FIN: 5, TIMEOUT_UDP: 6 } as const;
const SVC = { AF: 1, PROTOCOL: 2, ADDR: 3, PORT: 4, SCHED_NAME: 6, FLAGS: 7, TIMEOUT: 8, NETMASK: 9 } as const;
const DEST = { ADDR: 1, PORT: 2, FWD_METHOD: 3, WEIGHT: 4, U_THRESH: 5, L_THRESH: 6, ACTIVE_CONNS: 7, INACT_CONNS: 8, ADDR_FAMILY: 11 } as const;

const AF_INET = 2;
const AF_INET6 = 10;
const PROTO = { tcp: 6, udp: 17, sctp: 132 } as const;
export type IpvsProtocol = keyof typeof PROTO;
const PROTO_NAME = new Map<number, IpvsProtocol>(Object.entries(PROTO).map(([k, v]) => [v, k as IpvsProtocol]));
/** IP_VS_CONN_F_MASQ: NAT */
const FWD_MASQ = 0;

/** IP_VS_SVC_F_PERSISTENT: ClientIP affinity */
export const FLAG_PERSISTENT = 0x1;
/** mh: IP_VS_SVC_F_SCHED1 (mh-fallback), IP_VS_SVC_F_SCHED2 (mh-port) */
export const FLAG_SCHED1 = 0x8;
export const FLAG_SCHED2 = 0x10;
/** the flags a user sets (persistent, one-packet, sched1-3); the kernel adds its own (HASHED, 0x2) */
const USER_FLAGS = 0x1 | 0x4 | 0x8 | 0x10 | 0x20;

/** A virtual server: what a service address and port is. */
export interface VirtualServer {
  readonly address: string;
  readonly protocol: IpvsProtocol;
  readonly port: number;
  readonly scheduler: string;
  readonly flags: number;
  /** persistence timeout, seconds (0: none) */
  readonly timeout: number;
}

/** A real server of a virtual server. */
export interface RealServer {
  readonly address: string;
  readonly port: number;
  readonly weight: number;
  /** as IPVS lists them */
  readonly activeConns?: number;
  readonly inactiveConns?: number;
}

/** The identity of a virtual server: "proto address port" (IPv6 bracketed) */
export function vsKey(v: { address: string; protocol: IpvsProtocol; port: number }): string {
  return `${v.protocol} ${isIPv4(v.address) ? v.address : `[${v.address}]`}:${v.port}`;
}

/** The identity of a real server within its virtual server. */
export function rsKey(r: { address: string; port: number }): string {
  return `${isIPv4(r.address) ? r.address : `[${r.address}]`}:${r.port}`;
}

export type IpvsOp =
  | { readonly op: 'add-service' | 'set-service' | 'del-service'; readonly vs: VirtualServer }
  | { readonly op: 'add-dest' | 'set-dest' | 'del-dest'; readonly vs: VirtualServer; readonly rs: RealServer };

export class IpvsError extends KernelError {
  constructor(
    message: string,
    readonly errno: number,
  ) {
    super(message);
  }
}

const ERRNO: Record<number, string> = { 2: 'ENOENT (no such service or destination)', 17: 'EEXIST (already there)', 22: 'EINVAL', 1: 'EPERM', 12: 'ENOMEM', 3: 'ESRCH (no such service)' };

function addr16(ip: string): Buffer {
  const b = Buffer.alloc(16);
  if (isIPv4(ip)) ip.split('.').forEach((x, i) => b.writeUInt8(Number(x), i));
  else writeIPv6(b, 0, ip);
  return b;
}

function ipOf(b: Buffer | undefined, af: number): string {
  if (!b) return '';
  if (af === AF_INET) return [...b.subarray(0, 4)].join('.');
  const w: string[] = [];
  for (let i = 0; i < 8; i++) w.push(b.readUInt16BE(i * 2).toString(16));
  // compress the longest zero run, as canonical form wants
  let best = -1;
  let bestLen = 0;
  for (let i = 0; i < 8; ) {
    if (w[i] !== '0') {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && w[j] === '0') j++;
    if (j - i > bestLen && j - i >= 2) [best, bestLen] = [i, j - i];
    i = j;
  }
  return best < 0 ? w.join(':') : `${w.slice(0, best).join(':')}::${w.slice(best + bestLen).join(':')}`;
}

/** IPVS in one network namespace (this process's, or a named one: tests). */
export class Ipvs {
  private readonly nl: NetlinkSocket;
  private readonly family: number;
  private seq = Math.floor(Math.random() * 0x7fffffff);

  constructor(netns?: string) {
    this.nl = new NetlinkSocket(NETLINK_GENERIC, netns);
    try {
      this.family = this.resolveFamily();
    } catch (e) {
      this.nl.close();
      throw e;
    }
  }

  close(): void {
    this.nl.close();
  }

  /** Every virtual server. */
  services(): VirtualServer[] {
    const out: VirtualServer[] = [];
    this.dump(new NetlinkWriter().begin(this.family, NLM_F_REQUEST | NLM_F_DUMP, ++this.seq, [CMD.GET_SERVICE, 1, 0]).end(), (m) => {
      const svc = m.nested(m.attrs().get(CMD_ATTR.SERVICE));
      const v = this.readService(m, svc);
      if (v) out.push(v);
    });
    return out;
  }

  /** The real servers of a virtual server (with their connection counts). */
  destinations(vs: VirtualServer): RealServer[] {
    const out: RealServer[] = [];
    const w = new NetlinkWriter().begin(this.family, NLM_F_REQUEST | NLM_F_DUMP, ++this.seq, [CMD.GET_DEST, 1, 0]);
    w.nest(CMD_ATTR.SERVICE, (n) => this.serviceId(n, vs)).end();
    this.dump(w, (m) => {
      const d = m.nested(m.attrs().get(CMD_ATTR.DEST));
      const af = m.u16(d.get(DEST.ADDR_FAMILY)) ?? (isIPv4(vs.address) ? AF_INET : AF_INET6);
      out.push({ address: ipOf(m.bytes(d.get(DEST.ADDR)), af), port: m.be16(d.get(DEST.PORT)) ?? 0, weight: m.u32(d.get(DEST.WEIGHT)) ?? 0, activeConns: m.u32(d.get(DEST.ACTIVE_CONNS)), inactiveConns: m.u32(d.get(DEST.INACT_CONNS)) });
    });
    return out;
  }

  /**
   * Applies operations in order, each on its own (IPVS has no
   * transactions); returns, per operation, undefined or its error.
   */
  apply(ops: readonly IpvsOp[]): (IpvsError | undefined)[] {
    if (!ops.length) return [];
    const first = this.seq + 1;
    const w = new NetlinkWriter();
    for (const o of ops) {
      const cmd = { 'add-service': CMD.NEW_SERVICE, 'set-service': CMD.SET_SERVICE, 'del-service': CMD.DEL_SERVICE, 'add-dest': CMD.NEW_DEST, 'set-dest': CMD.SET_DEST, 'del-dest': CMD.DEL_DEST }[o.op];
      w.begin(this.family, NLM_F_REQUEST | NLM_F_ACK, ++this.seq, [cmd, 1, 0]);
      if (o.op === 'add-service' || o.op === 'set-service') w.nest(CMD_ATTR.SERVICE, (n) => this.serviceFull(n, o.vs));
      else w.nest(CMD_ATTR.SERVICE, (n) => this.serviceId(n, o.vs));
      if ('rs' in o) w.nest(CMD_ATTR.DEST, (n) => this.dest(n, o.rs, o.op !== 'del-dest', o.vs));
      w.end();
    }
    const out: (IpvsError | undefined)[] = new Array(ops.length).fill(undefined);
    let acked = 0;
    const onAck = (m: NetlinkMessage) => {
      if (m.pid !== this.nl.port || !m.isError) return;
      const i = m.seq - first;
      if (i < 0 || i >= ops.length) return;
      acked++;
      if (m.errno) out[i] = new IpvsError(`${ops[i].op} ${vsKey(ops[i].vs)}${'rs' in ops[i] ? ` -> ${rsKey((ops[i] as { rs: RealServer }).rs)}` : ''}: ${ERRNO[m.errno] ?? `errno ${m.errno}`}`, m.errno);
    };
    // in slices the socket takes at once, reading the acks between them
    this.sendInSlices(w.take(), () => this.nl.drain(onAck));
    this.nl.await(() => acked === ops.length, onAck, 30_000);
    return out;
  }

  /** IPVS's connection timeouts, seconds (0: leave as it is) */
  setTimeouts(tcp: number, tcpFin: number, udp: number): void {
    const w = new NetlinkWriter().begin(this.family, NLM_F_REQUEST | NLM_F_ACK, ++this.seq, [CMD.SET_CONFIG, 1, 0]);
    w.u32(CMD_ATTR.TIMEOUT_TCP, tcp).u32(CMD_ATTR.TIMEOUT_TCP_FIN, tcpFin).u32(CMD_ATTR.TIMEOUT_UDP, udp).end();
    const seq = this.seq;
    let err: number | undefined;
    this.nl.send(w.take());
    this.nl.await(() => err !== undefined, (m) => void (m.isError && m.seq === seq && (err = m.errno)));
    if (err) throw new IpvsError(`setting IPVS timeouts: ${ERRNO[err] ?? `errno ${err}`}`, err);
  }

  private sendInSlices(msg: Buffer, between: () => void): void {
    const max = 64 << 10;
    for (let off = 0; off < msg.length; ) {
      // cut at a message boundary
      let end = off;
      while (end < msg.length && end - off + msg.readUInt32LE(end) <= max) end += (msg.readUInt32LE(end) + 3) & ~3;
      if (end === off) end = off + msg.readUInt32LE(off);
      this.nl.send(msg.subarray(off, end));
      between();
      off = end;
    }
  }

  private dump(w: NetlinkWriter, onMessage: (m: NetlinkMessage) => void): void {
    const seq = this.seq;
    let done = false;
    let err = 0;
    this.nl.send(w.take());
    this.nl.await(
      () => done,
      (m) => {
        if (m.seq !== seq || m.pid !== this.nl.port) return;
        if (m.isDone) done = true;
        else if (m.isError) {
          err = m.errno;
          done = true;
        } else onMessage(m);
      },
      60_000,
    );
    if (err) throw new IpvsError(`IPVS dump: ${ERRNO[err] ?? `errno ${err}`}`, err);
  }

  private resolveFamily(): number {
    const seq = ++this.seq;
    const w = new NetlinkWriter().begin(GENL_ID_CTRL, NLM_F_REQUEST, seq, [CTRL_CMD_GETFAMILY, 1, 0]).string(CTRL_ATTR_FAMILY_NAME, 'IPVS').end();
    this.nl.send(w.take());
    let id: number | undefined;
    let err = 0;
    this.nl.await(
      () => id !== undefined || err !== 0,
      (m) => {
        if (m.seq !== seq) return;
        if (m.isError) err = m.errno || -1;
        else id = m.u16(m.attrs().get(CTRL_ATTR_FAMILY_ID));
      },
    );
    if (id === undefined) throw new IpvsError(err === 2 ? 'no IPVS in this kernel (modprobe ip_vs)' : `no IPVS generic netlink family: errno ${err}`, err);
    return id;
  }

  private serviceId(n: NetlinkWriter, v: VirtualServer): void {
    n.u16(SVC.AF, isIPv4(v.address) ? AF_INET : AF_INET6)
      .u16(SVC.PROTOCOL, PROTO[v.protocol])
      .attr(SVC.ADDR, addr16(v.address))
      .be16(SVC.PORT, v.port);
  }

  private serviceFull(n: NetlinkWriter, v: VirtualServer): void {
    this.serviceId(n, v);
    const flags = Buffer.alloc(8);
    flags.writeUInt32LE(v.flags, 0);
    flags.writeUInt32LE(0xffffffff, 4);
    n.string(SVC.SCHED_NAME, v.scheduler)
      .attr(SVC.FLAGS, flags)
      .u32(SVC.TIMEOUT, v.timeout)
      .u32(SVC.NETMASK, isIPv4(v.address) ? 0xffffffff : 128);
  }

  private dest(n: NetlinkWriter, r: RealServer, full: boolean, vs: VirtualServer): void {
    n.attr(DEST.ADDR, addr16(r.address)).be16(DEST.PORT, r.port);
    if (!full) return;
    n.u32(DEST.FWD_METHOD, FWD_MASQ)
      .u32(DEST.WEIGHT, r.weight)
      .u32(DEST.U_THRESH, 0)
      .u32(DEST.L_THRESH, 0)
      .u16(DEST.ADDR_FAMILY, isIPv4(r.address) ? AF_INET : isIPv4(vs.address) ? AF_INET : AF_INET6);
  }

  private readService(m: NetlinkMessage, s: Map<number, [number, number]>): VirtualServer | undefined {
    const af = m.u16(s.get(SVC.AF));
    const protocol = PROTO_NAME.get(m.u16(s.get(SVC.PROTOCOL)) ?? 0);
    if (!af || !protocol || s.has(5 /* FWMARK */) && !s.has(SVC.ADDR)) return undefined; // fwmark services are not kpng's
    const flags = m.bytes(s.get(SVC.FLAGS));
    return {
      address: ipOf(m.bytes(s.get(SVC.ADDR)), af),
      protocol,
      port: m.be16(s.get(SVC.PORT)) ?? 0,
      scheduler: m.string(s.get(SVC.SCHED_NAME)) ?? '',
      flags: flags ? flags.readUInt32LE(0) & USER_FLAGS : 0,
      timeout: m.u32(s.get(SVC.TIMEOUT)) ?? 0,
    };
  }
}
