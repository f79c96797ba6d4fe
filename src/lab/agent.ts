// The lab agent: one long-lived process per network namespace, commanded
// over stdin/stdout JSON lines. It runs TCP/UDP/SCTP servers that answer every
// message with "<local ip:port> <remote ip:port> <agent name> <request tag>"
// (so the client sees which endpoint answered and the endpoint's view of the
// client, which shows masquerading), and clients that connect from a given source address
// and report what happened. Connections can be kept open and used again.
//
// agentMain is serialized with Function.prototype.toString and run with
// `node -e` inside the namespace (no TypeScript loader: a plain node starts
// in ~60 ms), so it must be self-contained: no imports, no outer variables
// (but KPNG_SCTP_HELPER, which agentScript defines). SCTP goes through a
// Python helper (sctp-helper.ts), started on the first SCTP request.
import { SCTP_HELPER_PY } from './sctp-helper.js';

export type LabProtocol = 'TCP' | 'UDP' | 'SCTP';

/** The SCTP helper's source, a global of the agent's script (see agentScript). */
declare const KPNG_SCTP_HELPER: string;

/** What one connection attempt (or one exchange on a kept connection) gave. */
export type Outcome =
  | {
      kind: 'answered';
      /** the agent (namespace) that answered */
      by: string;
      /** the address the server saw itself at: the endpoint when DNATed */
      local: string;
      /** the address the server saw the client at: not the client's when masqueraded */
      remote: string;
      /** the client's own address (ip:port) */
      client: string;
      ms: number;
    }
  | {
      /**
       * refused: ICMP port unreachable (kpng's REJECT); timeout: no answer
       * (DROP); unreachable: no host, or a port nobody listens on in the lab;
       * closed: a kept connection ended
       */
      kind: 'refused' | 'timeout' | 'unreachable' | 'reset' | 'closed' | 'error';
      code?: string;
      /** TCP, SCTP: the handshake completed before the failure */
      connected?: boolean;
      client?: string;
      ms: number;
    };

export interface ConnectArgs {
  protocol: LabProtocol;
  /** source address to bind (port 0) */
  src: string;
  dst: string;
  port: number;
  timeoutMs: number;
}

export type AgentRequest =
  | { id: number; op: 'ping' }
  | { id: number; op: 'sysctl'; values: Record<string, string> }
  | { id: number; op: 'listen'; protocol: LabProtocol; host: string; port: number }
  | { id: number; op: 'unlisten'; protocol?: LabProtocol; port?: number; dropConnections?: boolean }
  | ({ id: number; op: 'connect' } & ConnectArgs)
  | ({ id: number; op: 'burst'; count: number } & ConnectArgs)
  | ({ id: number; op: 'open'; cid: string } & ConnectArgs)
  | { id: number; op: 'send'; cid: string; timeoutMs: number }
  | { id: number; op: 'close'; cid: string };

export interface AgentResponse {
  id: number;
  ok: boolean;
  error?: string;
  result?: unknown;
}

export function agentMain(): void {
  const net = require('node:net') as typeof import('node:net');
  const dgram = require('node:dgram') as typeof import('node:dgram');
  const fs = require('node:fs') as typeof import('node:fs');
  const childProcess = require('node:child_process') as typeof import('node:child_process');
  const name = process.argv[process.argv.length - 1];

  type Proto = 'TCP' | 'UDP' | 'SCTP';
  type Out = Record<string, unknown> & { kind: string; ms: number };
  const hostPort = (ip: string | undefined, port: number | undefined) => (ip && ip.includes(':') ? `[${ip}]:${port}` : `${ip}:${port}`);
  // the request's tag is echoed, so a late answer to an earlier request is not taken for this one
  const answer = (local: string, remote: string, tag: string) => `${local} ${remote} ${name} ${tag.trim().slice(0, 32)}\n`;
  let seq = 0;
  const servers = new Map<string, { close(): void; conns: Set<import('node:net').Socket>; sctp?: boolean }>();
  const kept = new Map<string, Kept>();

  interface Kept {
    exchange(timeoutMs: number): Promise<Out>;
    close(): void;
  }

  const write = (o: unknown) => process.stdout.write(JSON.stringify(o) + '\n');

  const classify = (code: string | undefined): string => {
    switch (code) {
      case 'ECONNREFUSED':
        return 'refused';
      // EHOSTUNREACH/EACCES: ICMP admin-prohibited, the lab's answer for a
      // port nobody listens on (so that only kpng's REJECT reads "refused")
      case 'EHOSTUNREACH':
      case 'ENETUNREACH':
      case 'EACCES':
      case 'EADDRNOTAVAIL':
        return 'unreachable';
      case 'ECONNRESET':
      case 'EPIPE':
        return 'reset';
      case 'ETIMEDOUT':
        return 'timeout';
      default:
        return 'error';
    }
  };

  const parseAnswer = (line: string, client: string, ms: number): Out => {
    const [local, remote, by] = line.trim().split(' ');
    return { kind: 'answered', by, local, remote, client, ms };
  };
  const tagOf = (line: string) => line.trim().split(' ')[3];

  // --- servers

  // --- SCTP: the Python helper, started once; a kernel without SCTP fails every SCTP request

  let sctpHelper: Promise<(req: Record<string, unknown>) => Promise<any>> | undefined;
  function sctp(req: Record<string, unknown>): Promise<any> {
    sctpHelper ??= new Promise((resolve, reject) => {
      const py = fs.existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3';
      const p = childProcess.spawn(py, ['-u', '-c', KPNG_SCTP_HELPER, name], { stdio: ['pipe', 'pipe', 'pipe'] });
      const waiting = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();
      let ids = 0;
      let stderr = '';
      let buf = '';
      let ready = false;
      const send = (r: Record<string, unknown>) =>
        new Promise((res, rej) => {
          const id = ++ids;
          waiting.set(id, { resolve: res, reject: rej });
          p.stdin!.write(JSON.stringify({ ...r, id }) + '\n');
        });
      p.stdin!.on('error', () => {});
      p.stderr!.on('data', (d) => (stderr = (stderr + d).slice(-2000)));
      p.on('error', (e) => reject(new Error(`SCTP needs python3 (Node has no SCTP sockets): ${e.message}`)));
      p.on('exit', (code) => {
        const e = new Error(`SCTP helper exited (${code}): ${stderr.trim()}`);
        if (!ready) reject(e);
        for (const w of waiting.values()) w.reject(e);
        waiting.clear();
      });
      p.stdout!.on('data', (d) => {
        buf += d;
        let i: number;
        while ((i = buf.indexOf('\n')) >= 0) {
          const msg = JSON.parse(buf.slice(0, i));
          buf = buf.slice(i + 1);
          if (msg.ready === true) {
            ready = true;
            resolve(send);
          } else if (msg.ready === false) reject(new Error(msg.error));
          else {
            const w = waiting.get(msg.id);
            waiting.delete(msg.id);
            if (msg.ok) w?.resolve(msg.result);
            else w?.reject(new Error(msg.error));
          }
        }
      });
    });
    return sctpHelper.then((send) => send(req));
  }

  function listen(protocol: Proto, host: string, port: number): Promise<void> {
    const key = `${protocol} ${host} ${port}`;
    if (servers.has(key)) return Promise.resolve();
    if (protocol === 'SCTP') {
      // one address per socket: the helper refuses nothing, but a wildcard would misreport the local address
      if (host === '0.0.0.0' || host === '::') return Promise.reject(new Error(`listen ${key}: SCTP serves one address at a time, not the wildcard`));
      return sctp({ op: 'listen', host, port }).then(() => {
        servers.set(key, { close: () => {}, conns: new Set(), sctp: true });
      });
    }
    return new Promise((resolve, reject) => {
      if (protocol === 'TCP') {
        const conns = new Set<import('node:net').Socket>();
        const srv = net.createServer((s) => {
          conns.add(s);
          s.on('close', () => conns.delete(s));
          s.on('error', () => {});
          let buf = '';
          s.on('data', (d) => {
            buf += d;
            let i: number;
            while ((i = buf.indexOf('\n')) >= 0) {
              const tag = buf.slice(0, i);
              buf = buf.slice(i + 1);
              s.write(answer(hostPort(s.localAddress, s.localPort), hostPort(s.remoteAddress, s.remotePort), tag));
            }
          });
        });
        srv.once('error', (e: NodeJS.ErrnoException) => reject(new Error(`listen ${key}: ${e.code ?? e.message}`)));
        srv.listen({ host, port, ipv6Only: host.includes(':'), exclusive: true }, () => {
          servers.set(key, { close: () => srv.close(), conns });
          resolve();
        });
      } else {
        const sock = dgram.createSocket({ type: host.includes(':') ? 'udp6' : 'udp4', ipv6Only: host.includes(':') });
        sock.once('error', (e: NodeJS.ErrnoException) => reject(new Error(`listen ${key}: ${e.code ?? e.message}`)));
        sock.on('message', (m, rinfo) => {
          const a = sock.address();
          sock.send(answer(hostPort(a.address, a.port), hostPort(rinfo.address, rinfo.port), String(m)), rinfo.port, rinfo.address);
        });
        sock.bind({ address: host, port, exclusive: true }, () => {
          sock.removeAllListeners('error');
          sock.on('error', () => {});
          servers.set(key, { close: () => sock.close(), conns: new Set() });
          resolve();
        });
      }
    });
  }

  async function unlisten(protocol: Proto | undefined, port: number | undefined, drop: boolean) {
    const jobs: Promise<unknown>[] = [];
    for (const [key, s] of servers) {
      const [p, host, n] = key.split(' ');
      if ((protocol && p !== protocol) || (port !== undefined && Number(n) !== port)) continue;
      if (s.sctp) jobs.push(sctp({ op: 'unlisten', host, port: Number(n), drop }));
      s.close();
      if (drop) for (const c of s.conns) c.destroy();
      servers.delete(key);
    }
    await Promise.all(jobs);
  }

  // --- clients

  function tcpOpen(a: { src: string; dst: string; port: number; timeoutMs: number }): Promise<{ out: Out; kept?: Kept }> {
    const t0 = Date.now();
    return new Promise((resolve) => {
      const s = net.connect({ host: a.dst, port: a.port, localAddress: a.src, family: a.dst.includes(':') ? 6 : 4 });
      let connected = false;
      let client = '';
      let buf = '';
      let waiter: ((line: string | Error) => void) | undefined;
      let failure: Error | undefined;
      s.on('data', (d) => {
        buf += d;
        let i: number;
        while ((i = buf.indexOf('\n')) >= 0) {
          const line = buf.slice(0, i);
          buf = buf.slice(i + 1);
          const w = waiter;
          waiter = undefined;
          w?.(line);
        }
      });
      const fail = (e: Error) => {
        failure ??= e;
        if (waiter) {
          const w = waiter;
          waiter = undefined;
          w(e);
        }
      };
      s.on('error', fail);
      s.on('close', () => fail(Object.assign(new Error('closed'), { code: 'CLOSED' })));
      const exchange = (timeoutMs: number): Promise<Out> => {
        const t1 = Date.now();
        if (failure) return Promise.resolve({ kind: 'closed', code: (failure as NodeJS.ErrnoException).code, connected, client, ms: 0 });
        return new Promise((res) => {
          const timer = setTimeout(() => {
            waiter = undefined;
            res({ kind: 'timeout', connected, client, ms: Date.now() - t1 });
          }, timeoutMs);
          const tag = `q${++seq}`;
          const wait = (r: string | Error) => {
            if (!(r instanceof Error) && tagOf(r) !== tag) return void (waiter = wait);
            clearTimeout(timer);
            if (r instanceof Error) {
              const code = (r as NodeJS.ErrnoException).code;
              res({ kind: code === 'CLOSED' ? 'closed' : classify(code), code, connected, client, ms: Date.now() - t1 });
            } else res(parseAnswer(r, client, Date.now() - t1));
          };
          waiter = wait;
          s.write(`${tag}\n`);
        });
      };
      const kept: Kept = { exchange, close: () => s.destroy() };
      const timer = setTimeout(() => {
        s.destroy();
        resolve({ out: { kind: 'timeout', connected: false, ms: Date.now() - t0 } });
      }, a.timeoutMs);
      s.once('connect', async () => {
        clearTimeout(timer);
        connected = true;
        client = hostPort(s.localAddress, s.localPort);
        const out = await exchange(Math.max(1, a.timeoutMs - (Date.now() - t0)));
        out.ms = Date.now() - t0;
        resolve({ out, kept: out.kind === 'answered' ? kept : undefined });
      });
      s.once('error', (e: NodeJS.ErrnoException) => {
        if (connected) return;
        clearTimeout(timer);
        s.destroy();
        resolve({ out: { kind: classify(e.code), code: e.code, connected: false, ms: Date.now() - t0 } });
      });
    });
  }

  // A connected UDP socket: ICMP errors (REJECT) arrive as ECONNREFUSED
  // 'error' events. The datagram is resent every 200 ms until an answer, an
  // error or the timeout, on the same socket (the same conntrack entry).
  function udpOpen(a: { src: string; dst: string; port: number; timeoutMs: number }): Promise<{ out: Out; kept?: Kept }> {
    const t0 = Date.now();
    const sock = dgram.createSocket({ type: a.dst.includes(':') ? 'udp6' : 'udp4' });
    let client = '';
    let waiter: ((r: string | Error) => void) | undefined;
    let closed = false;
    sock.on('message', (m) => {
      const w = waiter;
      waiter = undefined;
      w?.(String(m));
    });
    sock.on('error', (e) => {
      const w = waiter;
      waiter = undefined;
      w?.(e);
    });
    const exchange = (timeoutMs: number): Promise<Out> => {
      const t1 = Date.now();
      if (closed) return Promise.resolve({ kind: 'closed', client, ms: 0 });
      return new Promise((res) => {
        let resend: NodeJS.Timeout | undefined;
        const done = (o: Out) => {
          clearTimeout(timer);
          clearInterval(resend);
          waiter = undefined;
          res(o);
        };
        const timer = setTimeout(() => done({ kind: 'timeout', client, ms: Date.now() - t1 }), timeoutMs);
        const tag = `q${++seq}`;
        const wait = (r: string | Error) => {
          if (!(r instanceof Error) && tagOf(r) !== tag) return void (waiter = wait);
          if (r instanceof Error) {
            const code = (r as NodeJS.ErrnoException).code;
            done({ kind: classify(code), code, client, ms: Date.now() - t1 });
          } else done(parseAnswer(r, client, Date.now() - t1));
        };
        waiter = wait;
        const send = () => sock.send(`${tag}\n`, (e) => e && waiter?.(e));
        send();
        resend = setInterval(send, 200);
      });
    };
    const kept: Kept = {
      exchange,
      close: () => {
        closed = true;
        sock.close();
      },
    };
    return new Promise((resolve) => {
      sock.once('error', (e: NodeJS.ErrnoException) => {
        if (client) return;
        closed = true;
        try {
          sock.close();
        } catch {
          // already closed
        }
        resolve({ out: { kind: classify(e.code), code: e.code, ms: Date.now() - t0 } });
      });
      sock.bind({ address: a.src, port: 0 }, () => {
        sock.connect(a.port, a.dst, async () => {
          const l = sock.address();
          client = hostPort(l.address, l.port);
          const out = await exchange(a.timeoutMs);
          out.ms = Date.now() - t0;
          resolve({ out, kept: out.kind === 'answered' ? kept : undefined });
        });
      });
    });
  }

  // An SCTP association through the helper: the same outcomes as TCP's.
  let sctpIds = 0;
  async function sctpOpen(a: { src: string; dst: string; port: number; timeoutMs: number }): Promise<{ out: Out; kept?: Kept }> {
    const t0 = Date.now();
    const cid = `s${++sctpIds}`;
    const c = await sctp({ op: 'connect', cid, src: a.src, dst: a.dst, port: a.port, timeoutMs: a.timeoutMs });
    if (c.timeout) return { out: { kind: 'timeout', connected: false, ms: Date.now() - t0 } };
    if (c.code) return { out: { kind: classify(c.code), code: c.code, connected: false, ms: Date.now() - t0 } };
    const client: string = c.client;
    const exchange = async (timeoutMs: number): Promise<Out> => {
      const t1 = Date.now();
      const tag = `q${++seq}`;
      const r = await sctp({ op: 'exchange', cid, tag, timeoutMs });
      if (r.line) return parseAnswer(r.line, client, Date.now() - t1);
      if (r.timeout) return { kind: 'timeout', connected: true, client, ms: Date.now() - t1 };
      const closed = r.closed || r.code === 'CLOSED';
      return { kind: closed ? 'closed' : classify(r.code), code: r.code, connected: true, client, ms: closed && r.closed ? 0 : Date.now() - t1 };
    };
    const kept: Kept = { exchange, close: () => void sctp({ op: 'close', cid }).catch(() => {}) };
    const out = await exchange(Math.max(1, a.timeoutMs - (Date.now() - t0)));
    out.ms = Date.now() - t0;
    if (out.kind !== 'answered') kept.close();
    return { out, kept: out.kind === 'answered' ? kept : undefined };
  }

  const open = (a: { protocol: Proto; src: string; dst: string; port: number; timeoutMs: number }) =>
    a.protocol === 'UDP' ? udpOpen(a) : a.protocol === 'SCTP' ? sctpOpen(a) : tcpOpen(a);

  async function connectOnce(a: { protocol: Proto; src: string; dst: string; port: number; timeoutMs: number }): Promise<Out> {
    const { out, kept } = await open(a);
    kept?.close();
    return out;
  }

  // --- commands

  async function handle(req: Record<string, any>): Promise<unknown> {
    switch (req.op) {
      case 'ping':
        return name;
      case 'sysctl':
        for (const [k, v] of Object.entries(req.values as Record<string, string>)) fs.writeFileSync(`/proc/sys/${k.replace(/\./g, '/')}`, String(v));
        return null;
      case 'listen':
        await listen(req.protocol, req.host, req.port);
        return null;
      case 'unlisten':
        await unlisten(req.protocol, req.port, !!req.dropConnections);
        return null;
      case 'connect':
        return connectOnce(req as any);
      case 'burst':
        return Promise.all(Array.from({ length: Math.max(1, Math.min(1000, req.count)) }, () => connectOnce(req as any)));
      case 'open': {
        kept.get(req.cid)?.close();
        const { out, kept: k } = await open(req as any);
        if (k) kept.set(req.cid, k);
        return out;
      }
      case 'send': {
        const k = kept.get(req.cid);
        if (!k) return { kind: 'closed', code: 'NOCONN', ms: 0 };
        return k.exchange(req.timeoutMs);
      }
      case 'close':
        kept.get(req.cid)?.close();
        kept.delete(req.cid);
        return null;
      default:
        throw new Error(`unknown op ${req.op}`);
    }
  }

  let input = '';
  process.stdin.setEncoding('utf8');
  process.stdin.on('data', (d) => {
    input += d;
    let i: number;
    while ((i = input.indexOf('\n')) >= 0) {
      const line = input.slice(0, i);
      input = input.slice(i + 1);
      if (!line.trim()) continue;
      let req: Record<string, any>;
      try {
        req = JSON.parse(line);
      } catch {
        continue;
      }
      handle(req).then(
        (result) => write({ id: req.id, ok: true, result }),
        (e: Error) => write({ id: req.id, ok: false, error: e.message }),
      );
    }
  });
  // the lab went away: so do we (and our sockets with us; the SCTP helper sees its stdin end)
  process.stdin.on('end', () => process.exit(0));
  write({ ready: name });
}

/** The agent as a `node -e` script (esbuild's keepNames helper stubbed, the SCTP helper's source defined). */
export function agentScript(): string {
  return `"use strict";var __name=(t)=>t;var KPNG_SCTP_HELPER=${JSON.stringify(SCTP_HELPER_PY)};(${agentMain.toString()})();`;
}
