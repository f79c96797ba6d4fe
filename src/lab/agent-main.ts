// The lab agent's process (agent.ts says what it does and how it is run):
// servers that answer, clients that report, commanded over stdin/stdout JSON
// lines. Run as a file by a plain node, so it imports node's own modules
// only; the SCTP helper's Python source comes in KPNG_SCTP_HELPER.
import { spawn } from 'node:child_process';
import { createSocket } from 'node:dgram';
import { existsSync, writeFileSync } from 'node:fs';
import { connect, createServer, type Socket } from 'node:net';
import type { AgentRequest, LabProtocol } from './agent.js';

type Out = Record<string, unknown> & { kind: string; ms: number };

/** A connection kept open: one exchange at a time, until closed. */
interface Kept {
  exchange(timeoutMs: number): Promise<Out>;
  close(): void;
}

interface Target {
  src: string;
  dst: string;
  port: number;
  timeoutMs: number;
}

/** the name it answers with (pod name, node name, "world"): its last argument */
const name = process.argv[process.argv.length - 1];
const servers = new Map<string, { close(): void; conns: Set<Socket>; sctp?: boolean }>();
const kept = new Map<string, Kept>();
/** the tag of the last request a client sent */
let seq = 0;

const hostPort = (ip: string | undefined, port: number | undefined) => (ip && ip.includes(':') ? `[${ip}]:${port}` : `${ip}:${port}`);
// the request's tag is echoed, so a late answer to an earlier request is not taken for this one
const answer = (local: string, remote: string, tag: string) => `${local} ${remote} ${name} ${tag.trim().slice(0, 32)}\n`;
const write = (o: unknown) => process.stdout.write(JSON.stringify(o) + '\n');
const nextTag = () => `q${++seq}`;
const tagOf = (line: string) => line.trim().split(' ')[3];

function classify(code: string | undefined): string {
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
}

function parseAnswer(line: string, client: string, ms: number): Out {
  const [local, remote, by] = line.trim().split(' ');
  return { kind: 'answered', by, local, remote, client, ms };
}

/** Calls each for every whole line that comes, keeping a partial one for later. */
function lines(each: (line: string) => void): (data: Buffer | string) => void {
  let buf = '';
  return (d) => {
    buf += d;
    let i: number;
    while ((i = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, i);
      buf = buf.slice(i + 1);
      each(line);
    }
  };
}

// --- SCTP: the Python helper, started once; a kernel without SCTP fails every SCTP request

type SctpSend = (req: Record<string, unknown>) => Promise<any>;
let sctpHelper: Promise<SctpSend> | undefined;

function startSctpHelper(): Promise<SctpSend> {
  return new Promise((resolve, reject) => {
    const py = existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3';
    const p = spawn(py, ['-u', '-c', process.env.KPNG_SCTP_HELPER ?? '', name], { stdio: ['pipe', 'pipe', 'pipe'] });
    const waiting = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();
    let ids = 0;
    let stderr = '';
    let ready = false;
    const send: SctpSend = (r) =>
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
    p.stdout!.on(
      'data',
      lines((line) => {
        const msg = JSON.parse(line);
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
      }),
    );
  });
}

function sctp(req: Record<string, unknown>): Promise<any> {
  sctpHelper ??= startSctpHelper();
  return sctpHelper.then((send) => send(req));
}

// --- servers

function listen(protocol: LabProtocol, host: string, port: number): Promise<void> {
  const key = `${protocol} ${host} ${port}`;
  if (servers.has(key)) return Promise.resolve();
  if (protocol === 'SCTP') {
    // one address per socket: the helper refuses nothing, but a wildcard would misreport the local address
    if (host === '0.0.0.0' || host === '::') return Promise.reject(new Error(`listen ${key}: SCTP serves one address at a time, not the wildcard`));
    return sctp({ op: 'listen', host, port }).then(() => void servers.set(key, { close: () => {}, conns: new Set(), sctp: true }));
  }
  return protocol === 'TCP' ? listenTcp(key, host, port) : listenUdp(key, host, port);
}

function listenTcp(key: string, host: string, port: number): Promise<void> {
  return new Promise((resolve, reject) => {
    const conns = new Set<Socket>();
    const srv = createServer((s) => {
      conns.add(s);
      s.on('close', () => conns.delete(s));
      s.on('error', () => {});
      s.on(
        'data',
        lines((tag) => s.write(answer(hostPort(s.localAddress, s.localPort), hostPort(s.remoteAddress, s.remotePort), tag))),
      );
    });
    srv.once('error', (e: NodeJS.ErrnoException) => reject(new Error(`listen ${key}: ${e.code ?? e.message}`)));
    srv.listen({ host, port, ipv6Only: host.includes(':'), exclusive: true }, () => {
      servers.set(key, { close: () => srv.close(), conns });
      resolve();
    });
  });
}

function listenUdp(key: string, host: string, port: number): Promise<void> {
  return new Promise((resolve, reject) => {
    const sock = createSocket({ type: host.includes(':') ? 'udp6' : 'udp4', ipv6Only: host.includes(':') });
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
  });
}

async function unlisten(protocol: LabProtocol | undefined, port: number | undefined, drop: boolean): Promise<void> {
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

function tcpOpen(a: Target): Promise<{ out: Out; kept?: Kept }> {
  const t0 = Date.now();
  return new Promise((resolve) => {
    const s = connect({ host: a.dst, port: a.port, localAddress: a.src, family: a.dst.includes(':') ? 6 : 4 });
    let connected = false;
    let client = '';
    let waiter: ((line: string | Error) => void) | undefined;
    let failure: Error | undefined;
    const deliver = (r: string | Error) => {
      const w = waiter;
      waiter = undefined;
      w?.(r);
    };
    s.on('data', lines(deliver));
    const fail = (e: Error) => {
      failure ??= e;
      deliver(e);
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
        const tag = nextTag();
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
    const keep: Kept = { exchange, close: () => s.destroy() };
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
      resolve({ out, kept: out.kind === 'answered' ? keep : undefined });
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
function udpOpen(a: Target): Promise<{ out: Out; kept?: Kept }> {
  const t0 = Date.now();
  const sock = createSocket({ type: a.dst.includes(':') ? 'udp6' : 'udp4' });
  let client = '';
  let waiter: ((r: string | Error) => void) | undefined;
  let closed = false;
  const deliver = (r: string | Error) => {
    const w = waiter;
    waiter = undefined;
    w?.(r);
  };
  sock.on('message', (m) => deliver(String(m)));
  sock.on('error', deliver);
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
      const tag = nextTag();
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
  const keep: Kept = {
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
        resolve({ out, kept: out.kind === 'answered' ? keep : undefined });
      });
    });
  });
}

// An SCTP association through the helper: the same outcomes as TCP's.
let sctpIds = 0;
async function sctpOpen(a: Target): Promise<{ out: Out; kept?: Kept }> {
  const t0 = Date.now();
  const cid = `s${++sctpIds}`;
  const c = await sctp({ op: 'connect', cid, src: a.src, dst: a.dst, port: a.port, timeoutMs: a.timeoutMs });
  if (c.timeout) return { out: { kind: 'timeout', connected: false, ms: Date.now() - t0 } };
  if (c.code) return { out: { kind: classify(c.code), code: c.code, connected: false, ms: Date.now() - t0 } };
  const client: string = c.client;
  const exchange = async (timeoutMs: number): Promise<Out> => {
    const t1 = Date.now();
    const r = await sctp({ op: 'exchange', cid, tag: nextTag(), timeoutMs });
    if (r.line) return parseAnswer(r.line, client, Date.now() - t1);
    if (r.timeout) return { kind: 'timeout', connected: true, client, ms: Date.now() - t1 };
    const closed = r.closed || r.code === 'CLOSED';
    return { kind: closed ? 'closed' : classify(r.code), code: r.code, connected: true, client, ms: closed && r.closed ? 0 : Date.now() - t1 };
  };
  const keep: Kept = { exchange, close: () => void sctp({ op: 'close', cid }).catch(() => {}) };
  const out = await exchange(Math.max(1, a.timeoutMs - (Date.now() - t0)));
  out.ms = Date.now() - t0;
  if (out.kind !== 'answered') keep.close();
  return { out, kept: out.kind === 'answered' ? keep : undefined };
}

const open = (a: Target & { protocol: LabProtocol }) => (a.protocol === 'UDP' ? udpOpen(a) : a.protocol === 'SCTP' ? sctpOpen(a) : tcpOpen(a));

async function connectOnce(a: Target & { protocol: LabProtocol }): Promise<Out> {
  const { out, kept: k } = await open(a);
  k?.close();
  return out;
}

// --- commands

async function handle(req: AgentRequest): Promise<unknown> {
  switch (req.op) {
    case 'ping':
      return name;
    case 'sysctl':
      for (const [k, v] of Object.entries(req.values)) writeFileSync(`/proc/sys/${k.replace(/\./g, '/')}`, String(v));
      return null;
    case 'listen':
      await listen(req.protocol, req.host, req.port);
      return null;
    case 'unlisten':
      await unlisten(req.protocol, req.port, !!req.dropConnections);
      return null;
    case 'connect':
      return connectOnce(req);
    case 'burst':
      return Promise.all(Array.from({ length: Math.max(1, Math.min(1000, req.count)) }, () => connectOnce(req)));
    case 'open': {
      kept.get(req.cid)?.close();
      const { out, kept: k } = await open(req);
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
      throw new Error(`unknown op ${(req as { op: string }).op}`);
  }
}

process.stdin.setEncoding('utf8');
process.stdin.on(
  'data',
  lines((line) => {
    if (!line.trim()) return;
    let req: AgentRequest;
    try {
      req = JSON.parse(line);
    } catch {
      return;
    }
    handle(req).then(
      (result) => write({ id: req.id, ok: true, result }),
      (e: Error) => write({ id: req.id, ok: false, error: e.message }),
    );
  }),
);
// the lab went away: so do we (and our sockets with us; the SCTP helper sees its stdin end)
process.stdin.on('end', () => process.exit(0));
write({ ready: name });
