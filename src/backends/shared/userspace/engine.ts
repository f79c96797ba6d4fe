// The userspace proxy engine: kpng itself accepts each connection (TCP) or
// datagram (UDP) on the node and relays it to an endpoint it picked. Used by
// to-userspace (every Service address redirected to it) and by to-nft for
// localhost NodePorts (127.0.0.1 / ::1, which nftables cannot DNAT).
//
// Listeners follow the Services (open, close); an endpoint change only
// replaces the list a listener picks from: connections already relayed keep
// their endpoint.
// Memory stays bounded: TCP is piped with pause/resume (a slow side stops the
// other at the streams' high-water marks), UDP sessions are bounded in number
// and expire when idle, queued datagrams are bounded per session.
// Open files stay bounded too: the sockets of relayed connections and UDP
// sessions may take the process's open files limit only up to a reserve kept
// for the rest of kpng (its nft and netlink sockets, servers, the processes
// it starts), so that a flood of clients never starves the syncs, /healthz
// or /metrics. Past it, new clients are refused (counted, reason
// "capacity"); they are served again as soon as others close.
import { readFileSync } from 'node:fs';
import { createServer, connect, type Server, type Socket } from 'node:net';
import { createSocket, type Socket as UdpSocket, type RemoteInfo } from 'node:dgram';
import { networkInterfaces } from 'node:os';
import type { Family } from '../../../api/ip.js';
import type { Logger } from '../../../runtime/log.js';
import { metrics } from '../../../runtime/metrics.js';
import { reportSockets, userspaceMetrics } from './metrics.js';

export interface EngineTarget {
  readonly ip: string;
  readonly port: number;
}

/** What one listener serves. */
export interface ListenerSpec {
  /** stable id: the same key keeps the same listener (and port) */
  readonly key: string;
  /** ns/name, for metrics and logs */
  readonly service: string;
  readonly protocol: 'tcp' | 'udp';
  readonly family: Family;
  /** the endpoints for clients outside the node */
  readonly endpoints: readonly EngineTarget[];
  /** the endpoints for clients on the node (its addresses, loopback, pods); default: endpoints */
  readonly localEndpoints?: readonly EngineTarget[];
  /** ClientIP affinity timeout (s), 0 without */
  readonly affinitySeconds: number;
  /** listeners with the same affinity key share their clients' endpoints (a service port's ClusterIP and NodePort) */
  readonly affinityKey?: string;
  /** the address to listen on (default: every address of the family) */
  readonly host?: string;
}

export interface EngineOptions {
  readonly log: Logger;
  /** a UDP session without traffic this long is closed (kube-proxy's udpIdleTimeout: 250ms) */
  readonly udpIdleMs?: number;
  /** at most this many UDP sessions per listener: the oldest is closed to make room */
  readonly udpMaxSessions?: number;
  /** true for a client address that is a pod of this node (detect-local) */
  readonly isPodClient?: (ip: string) => boolean;
  /** attempts at other endpoints when one refuses a TCP connection or does not answer */
  readonly connectAttempts?: number;
  /** per attempt, how long an endpoint may take to accept (tests) */
  readonly connectTimeoutsMs?: readonly number[];
  /** the process's open files limit (default: its RLIMIT_NOFILE; tests) */
  readonly openFilesLimit?: number;
}

/** datagrams queued for an endpoint while its socket connects */
const UDP_QUEUE = 64;
/** how long each attempt at an endpoint may take to accept (longer each time): a dead endpoint must not hold the client for the kernel's minutes of SYN retries */
const CONNECT_TIMEOUTS_MS = [1000, 2000, 4000];
/**
 * TCP keepalive on both sides of a relayed connection, as Go's listeners and
 * dialers (kube-proxy's userspace proxy) set it: a side gone without a word
 * (its node lost, its pod's namespace deleted) is noticed after this much
 * silence and libuv's 10 probes a second apart, and both sockets are freed.
 */
const KEEPALIVE_MS = 15_000;
/** open files kept for the rest of kpng, at most (a quarter of a small limit) */
const RESERVED_FILES = 256;
/** the accept queue asked for: the kernel caps it at net.core.somaxconn, as Go's listeners ask for that */
const LISTEN_BACKLOG = 65_535;
/** at most one line this often about clients refused at capacity */
const CAPACITY_LOG_MS = 10_000;

/** The process's open files limit (the soft RLIMIT_NOFILE), Infinity where unknown. */
function openFilesLimit(): number {
  try {
    const m = /^Max open files\s+(\d+)/m.exec(readFileSync('/proc/self/limits', 'utf8'));
    return m ? Number(m[1]) : Infinity;
  } catch {
    return Infinity;
  }
}

interface Affinity {
  readonly clients: Map<string, { target: string; until: number }>;
  users: number;
}

interface UdpSession {
  readonly sock: UdpSocket;
  /** its endpoint (ip|port) */
  readonly target: string;
  /** the listener socket it came in on: replies leave from it */
  readonly via: UdpSocket;
  readonly client: RemoteInfo;
  last: number;
  queue: Buffer[] | undefined;
}

const tkey = (t: EngineTarget) => `${t.ip}|${t.port}`;

class Listener {
  spec: ListenerSpec;
  port = 0;
  server?: Server;
  /** UDP: one socket per local address, all on the same port (see openUdp) */
  readonly udp = new Map<string, UdpSocket>();
  readonly sessions = new Map<string, UdpSession>();
  /** relayed connections: client -> endpoint side */
  readonly tcp = new Map<Socket, Socket>();
  private next = 0;
  private nextLocal = 0;

  constructor(
    spec: ListenerSpec,
    public affinity: Affinity | undefined,
  ) {
    this.spec = spec;
  }

  /** round-robin, with ClientIP affinity first; undefined: no endpoint for this client */
  pick(client: string, local: boolean, skip?: ReadonlySet<string>): EngineTarget | undefined {
    const list = local && this.spec.localEndpoints ? this.spec.localEndpoints : this.spec.endpoints;
    const usable = skip?.size ? list.filter((t) => !skip.has(tkey(t))) : list;
    if (!usable.length) return undefined;
    const now = Date.now();
    const aff = this.spec.affinitySeconds > 0 ? this.affinity : undefined;
    if (aff) {
      const a = aff.clients.get(client);
      if (a && a.until > now) {
        const t = usable.find((x) => tkey(x) === a.target);
        if (t) {
          a.until = now + this.spec.affinitySeconds * 1000;
          return t;
        }
      }
    }
    let t: EngineTarget;
    if (local && this.spec.localEndpoints) t = usable[this.nextLocal++ % usable.length];
    else t = usable[this.next++ % usable.length];
    if (this.next > 1e9) this.next = 0;
    if (this.nextLocal > 1e9) this.nextLocal = 0;
    aff?.clients.set(client, { target: tkey(t), until: now + this.spec.affinitySeconds * 1000 });
    return t;
  }
}

export interface EngineStats {
  listeners: number;
  tcpOpen: number;
  udpSessions: number;
  /** sockets of relayed connections (both ends) and UDP sessions, open now */
  sockets: number;
  /** at most this many (what the open files limit leaves after listeners and kpng's reserve) */
  maxSockets: number;
}

export class UserspaceEngine {
  private readonly listeners = new Map<string, Listener>();
  private readonly affinities = new Map<string, Affinity>();
  private readonly udpIdleMs: number;
  private readonly udpMax: number;
  private readonly attempts: number;
  private nodeAddrs = new Set<string>();
  private sweeper?: NodeJS.Timeout;
  private closed = false;
  /** open files the engine may hold: the limit less kpng's reserve */
  private readonly files: number;
  /** sockets of relays and UDP sessions open now (each one open file) */
  private sockets = 0;
  /** open files the listeners hold (counted at each update) */
  private listenerFiles = 0;
  private refusedSinceLog = 0;
  private lastCapacityLog = -Infinity;
  private readonly unreport: () => void;

  constructor(private readonly o: EngineOptions) {
    this.udpIdleMs = o.udpIdleMs ?? 250;
    this.udpMax = o.udpMaxSessions ?? 4096;
    this.attempts = o.connectAttempts ?? 3;
    const limit = o.openFilesLimit ?? openFilesLimit();
    this.files = limit - Math.min(RESERVED_FILES, Math.floor(limit / 4));
    this.refreshNodeAddresses();
    this.unreport = reportSockets(() => this.stats);
  }

  /** the port a listener got, once open */
  portOf(key: string): number | undefined {
    return this.listeners.get(key)?.port || undefined;
  }

  get stats(): EngineStats {
    let tcpOpen = 0;
    let udpSessions = 0;
    for (const l of this.listeners.values()) {
      tcpOpen += l.tcp.size;
      udpSessions += l.sessions.size;
    }
    return { listeners: this.listeners.size, tcpOpen, udpSessions, sockets: this.sockets, maxSockets: Math.max(0, this.files - this.listenerFiles) };
  }

  /**
   * Makes the listeners these specs: opens the new ones, closes the ones no
   * longer wanted, and gives the others their new endpoints (nothing is
   * reopened). A listener that cannot open is left out with one log line;
   * returns the keys of those.
   */
  async update(specs: Iterable<ListenerSpec>): Promise<string[]> {
    if (this.closed) return [];
    this.refreshNodeAddresses();
    const want = new Map<string, ListenerSpec>();
    for (const s of specs) want.set(s.key, s);
    for (const [key, l] of this.listeners) {
      const s = want.get(key);
      if (!s || s.protocol !== l.spec.protocol || s.family !== l.spec.family || s.host !== l.spec.host || (s.affinityKey ?? s.key) !== (l.spec.affinityKey ?? l.spec.key)) this.closeListener(key, l);
    }
    const failed: string[] = [];
    const opening: Promise<void>[] = [];
    for (const [key, s] of want) {
      const l = this.listeners.get(key);
      if (l) {
        // affinity turned on or off: the listener stays, its table comes or goes
        if (!!s.affinitySeconds !== !!l.affinity) {
          this.releaseAffinity(l);
          l.affinity = this.affinityFor(s);
        }
        l.spec = s;
        this.dropSessionsOfGoneEndpoints(l);
        opening.push(this.followAddresses(l));
        continue;
      }
      const nl = new Listener(s, this.affinityFor(s));
      this.listeners.set(key, nl);
      opening.push(
        this.open(nl).catch((e) => {
          this.o.log.error({ service: s.service, key, err: (e as Error).message }, `userspace proxy: cannot listen for ${s.service} (${s.protocol}, IPv${s.family}); left out`);
          this.closeListener(key, nl);
          failed.push(key);
        }),
      );
    }
    await Promise.all(opening);
    this.listenerFiles = 0;
    for (const l of this.listeners.values()) this.listenerFiles += (l.server ? 1 : 0) + l.udp.size;
    this.sweeper ??= setInterval(() => this.sweep(), Math.max(50, Math.min(this.udpIdleMs / 2, 10_000))).unref();
    return failed;
  }

  async close(): Promise<void> {
    this.closed = true;
    this.unreport();
    if (this.sweeper) clearInterval(this.sweeper);
    for (const [key, l] of this.listeners) this.closeListener(key, l, true);
  }

  // --- listeners

  private affinityFor(s: ListenerSpec): Affinity | undefined {
    if (!s.affinitySeconds) return undefined;
    const k = s.affinityKey ?? s.key;
    let a = this.affinities.get(k);
    if (!a) this.affinities.set(k, (a = { clients: new Map(), users: 0 }));
    a.users++;
    return a;
  }

  private open(l: Listener): Promise<void> {
    const s = l.spec;
    const host = s.host ?? (s.family === 4 ? '0.0.0.0' : '::');
    if (s.protocol === 'udp') return this.openUdp(l);
    return new Promise((resolve, reject) => {
      const server = createServer({ allowHalfOpen: true, pauseOnConnect: true }, (c) => this.onTcp(l, c));
      l.server = server;
      server.once('error', reject);
      server.listen({ host, port: 0, ipv6Only: s.family === 6, backlog: LISTEN_BACKLOG }, () => {
        server.off('error', reject);
        server.on('error', (e) => this.o.log.warn({ service: s.service, err: e.message }, 'userspace proxy: listener error'));
        l.port = (server.address() as { port: number }).port;
        resolve();
      });
    });
  }

  /**
   * UDP listens on each local address of its family rather than on the
   * wildcard: a reply must leave from the address the client's datagram was
   * redirected to (or its NAT entry does not match and the client never sees
   * it), and Node cannot choose a reply's source address on a wildcard socket.
   */
  private async openUdp(l: Listener): Promise<void> {
    const addrs = l.spec.host ? [l.spec.host] : this.addressesOf(l.spec.family);
    for (let attempt = 0; ; attempt++) {
      let port = 0;
      let clash = false;
      for (const a of addrs) {
        try {
          const got = await this.bindUdp(l, a, port);
          port ||= got;
        } catch (e) {
          closeQuietly(l.udp.get(a));
          l.udp.delete(a);
          // another socket holds the port on this address: all again on another port
          if ((e as NodeJS.ErrnoException).code === 'EADDRINUSE' && port) {
            clash = true;
            break;
          }
          // an address that cannot be bound (still tentative, going away): without it; the next sync tries again
          this.o.log.debug({ service: l.spec.service, address: a, err: (e as Error).message }, 'userspace proxy: UDP listener skips an address');
        }
      }
      if (!clash && port) {
        l.port = port;
        return;
      }
      for (const sock of l.udp.values()) closeQuietly(sock);
      l.udp.clear();
      if (!clash || attempt >= 5) throw new Error(clash ? 'no port free on every node address' : 'no node address to listen on');
    }
  }

  private bindUdp(l: Listener, addr: string, port: number): Promise<number> {
    return new Promise((resolve, reject) => {
      const sock = createSocket({ type: l.spec.family === 4 ? 'udp4' : 'udp6', ipv6Only: l.spec.family === 6 });
      l.udp.set(addr, sock);
      sock.once('error', reject);
      sock.on('message', (msg, rinfo) => this.onDatagram(l, sock, msg, rinfo));
      sock.bind(port, addr, () => {
        sock.off('error', reject);
        sock.on('error', (e) => this.o.log.warn({ service: l.spec.service, err: e.message }, 'userspace proxy: UDP listener error'));
        resolve(sock.address().port);
      });
    });
  }

  /** a UDP listener follows the node's addresses: sockets for new ones, none for those gone */
  private async followAddresses(l: Listener): Promise<void> {
    if (l.spec.protocol !== 'udp' || l.spec.host || !l.port) return;
    const addrs = new Set(this.addressesOf(l.spec.family));
    for (const [a, sock] of l.udp) {
      if (addrs.has(a)) continue;
      l.udp.delete(a);
      closeQuietly(sock);
    }
    for (const a of addrs) {
      if (l.udp.has(a)) continue;
      await this.bindUdp(l, a, l.port).catch((e) => {
        closeQuietly(l.udp.get(a));
        l.udp.delete(a);
        // tried again at the next sync: not worth a warning each time
        this.o.log.debug({ service: l.spec.service, address: a, err: (e as Error).message }, 'userspace proxy: cannot listen on a new node address');
      });
    }
  }

  /** the node's addresses of a family, as bind takes them (link-local ones with their interface) */
  private addressesOf(family: Family): string[] {
    const out = new Set<string>();
    for (const [name, list] of Object.entries(networkInterfaces())) {
      for (const a of list ?? []) {
        if (a.family !== (family === 4 ? 'IPv4' : 'IPv6')) continue;
        out.add(family === 6 && a.scopeid ? `${a.address}%${name}` : a.address);
      }
    }
    return [...out];
  }

  /** A listener goes (its Service or port went): it stops accepting; relayed connections end on their own (all, at close). */
  private closeListener(key: string, l: Listener, all = false): void {
    if (this.listeners.get(key) === l) this.listeners.delete(key);
    l.server?.close();
    for (const s of l.sessions.values()) closeQuietly(s.sock);
    l.sessions.clear();
    for (const sock of l.udp.values()) closeQuietly(sock);
    l.udp.clear();
    // the relay ends abruptly: both sides see a reset, not an orderly end
    if (all) for (const [client, up] of l.tcp) client.resetAndDestroy(), up.resetAndDestroy();
    this.releaseAffinity(l);
  }

  private releaseAffinity(l: Listener): void {
    if (l.affinity && --l.affinity.users <= 0) this.affinities.delete(l.spec.affinityKey ?? l.spec.key);
    l.affinity = undefined;
  }

  /** client addresses of the node itself: its interfaces' addresses (refreshed at each update) */
  private refreshNodeAddresses(): void {
    const s = new Set<string>();
    for (const list of Object.values(networkInterfaces())) for (const a of list ?? []) s.add(a.address.toLowerCase());
    this.nodeAddrs = s;
  }

  private isLocalClient(ip: string): boolean {
    const a = ip.startsWith('::ffff:') ? ip.slice(7) : ip.toLowerCase();
    return this.nodeAddrs.has(a) || a.startsWith('127.') || a === '::1' || !!this.o.isPodClient?.(a);
  }

  // --- open files

  /** counts a socket of a relay or session until it closes */
  private track<T extends Socket | UdpSocket>(sock: T): T {
    this.sockets++;
    sock.once('close', () => this.sockets--);
    return sock;
  }

  /** true (counted, logged now and then) when `more` sockets would go past what the engine may hold */
  private atCapacity(more: number, labels: { service: string; protocol: string }): boolean {
    if (this.sockets + more + this.listenerFiles <= this.files) return false;
    userspaceMetrics.userspaceErrors.inc({ ...labels, reason: 'capacity' });
    this.refusedSinceLog++;
    const now = Date.now();
    if (now - this.lastCapacityLog >= CAPACITY_LOG_MS) {
      this.o.log.warn(
        { refused: this.refusedSinceLog, sockets: this.sockets, listenerFiles: this.listenerFiles, openFilesForEngine: this.files },
        'userspace proxy: at capacity (the open files limit, less what kpng keeps for itself); refusing new connections until others close',
      );
      this.lastCapacityLog = now;
      this.refusedSinceLog = 0;
    }
    return true;
  }

  // --- TCP

  private onTcp(l: Listener, client: Socket): void {
    const s = l.spec;
    const labels = { service: s.service, protocol: 'tcp' };
    this.track(client);
    client.on('error', () => {}); // errors end in close, handled below
    // its endpoint side will need a socket too
    if (this.atCapacity(1, labels)) return void client.resetAndDestroy();
    userspaceMetrics.userspaceConnections.inc(labels);
    client.setKeepAlive(true, KEEPALIVE_MS);
    const clientIP = client.remoteAddress ?? '';
    const local = this.isLocalClient(clientIP);
    const tried = new Set<string>();
    let attempts = 0;
    const attempt = () => {
      // each endpoint once, then (every one tried) again with the longer timeouts, as kube-proxy's
      // userspace proxy did: a lone endpoint that is slow to accept (its SYN lost once) gets another chance
      const t = l.pick(clientIP, local, tried) ?? (tried.size ? l.pick(clientIP, local) : undefined);
      if (!t) {
        userspaceMetrics.userspaceErrors.inc({ ...labels, reason: 'no_endpoints' });
        // refused: the client sees a reset, as from a REJECT
        if (!client.destroyed) client.resetAndDestroy();
        return;
      }
      tried.add(tkey(t));
      attempts++;
      const up = this.track(connect({ host: t.ip, port: t.port, allowHalfOpen: true }));
      let connected = false;
      up.setTimeout(this.o.connectTimeoutsMs?.[attempts - 1] ?? CONNECT_TIMEOUTS_MS[Math.min(attempts - 1, CONNECT_TIMEOUTS_MS.length - 1)], () => {
        if (!connected) up.destroy(Object.assign(new Error(`no answer from ${t.ip}:${t.port}`), { code: 'ETIMEDOUT' }));
      });
      up.once('connect', () => {
        connected = true;
        up.setTimeout(0);
        up.setKeepAlive(true, KEEPALIVE_MS);
        if (client.destroyed) return void up.resetAndDestroy();
        l.tcp.set(client, up);
        this.relay(l, client, up);
      });
      up.once('error', (e: NodeJS.ErrnoException) => {
        if (connected) return;
        this.o.log.debug({ service: s.service, endpoint: `${t.ip}:${t.port}`, err: e.message }, 'userspace proxy: endpoint refused');
        up.destroy();
        if (client.destroyed) return;
        // kpng, not the endpoint, is out of open files: no other endpoint would do better
        if (e.code === 'EMFILE' || e.code === 'ENFILE') {
          userspaceMetrics.userspaceErrors.inc({ ...labels, reason: 'capacity' });
          return void client.resetAndDestroy();
        }
        if (attempts < this.attempts) attempt();
        else {
          userspaceMetrics.userspaceErrors.inc({ ...labels, reason: 'endpoint_refused' });
          client.resetAndDestroy();
        }
      });
      client.once('close', () => {
        if (!connected) up.destroy();
      });
    };
    attempt();
  }

  /**
   * Both directions piped (pause/resume at the high-water marks: bounded
   * memory); an end is passed on as an end (half-close), an error or reset
   * on one side resets the other.
   */
  private relay(l: Listener, client: Socket, up: Socket): void {
    const labels = { service: l.spec.service, protocol: 'tcp' };
    up.setNoDelay(true);
    client.setNoDelay(true);
    client.pipe(up);
    up.pipe(client);
    let done = false;
    const reset = (other: Socket) => (e: NodeJS.ErrnoException) => {
      if (e.code !== 'ECONNRESET' && e.code !== 'EPIPE') userspaceMetrics.userspaceErrors.inc({ ...labels, reason: 'io' });
      if (!other.destroyed) other.resetAndDestroy();
    };
    client.on('error', reset(up));
    up.on('error', reset(client));
    const finish = () => {
      if (done || !client.destroyed || !up.destroyed) return;
      done = true;
      l.tcp.delete(client);
      userspaceMetrics.userspaceBytes.inc({ ...labels, direction: 'to_endpoint' }, client.bytesRead);
      userspaceMetrics.userspaceBytes.inc({ ...labels, direction: 'to_client' }, up.bytesRead);
    };
    // a side fully closed without error: end the other once it has written everything
    client.on('close', (hadError) => {
      if (!hadError && !up.destroyed && up.writableEnded && up.readableEnded) up.destroy();
      finish();
    });
    up.on('close', (hadError) => {
      if (!hadError && !client.destroyed && client.writableEnded && client.readableEnded) client.destroy();
      finish();
    });
    client.resume();
  }

  // --- UDP

  private onDatagram(l: Listener, via: UdpSocket, msg: Buffer, rinfo: RemoteInfo): void {
    const id = `${rinfo.address}|${rinfo.port}`;
    let s = l.sessions.get(id);
    const now = Date.now();
    if (s) {
      s.last = now;
      // most recently used last: the oldest is the first to go at the bound
      l.sessions.delete(id);
      l.sessions.set(id, s);
    } else {
      s = this.newSession(l, via, rinfo);
      if (!s) return;
      l.sessions.set(id, s);
    }
    userspaceMetrics.userspaceBytes.inc({ service: l.spec.service, protocol: 'udp', direction: 'to_endpoint' }, msg.length);
    if (s.queue) {
      if (s.queue.length < UDP_QUEUE) s.queue.push(msg);
      return;
    }
    s.sock.send(msg);
  }

  private newSession(l: Listener, via: UdpSocket, rinfo: RemoteInfo): UdpSession | undefined {
    const labels = { service: l.spec.service, protocol: 'udp' };
    const t = l.pick(rinfo.address, this.isLocalClient(rinfo.address));
    if (!t) {
      // no ICMP from userspace: kpng's rules reject a Service without endpoints before it gets here
      userspaceMetrics.userspaceErrors.inc({ ...labels, reason: 'no_endpoints' });
      return undefined;
    }
    if (this.atCapacity(1, labels)) return undefined;
    while (l.sessions.size >= this.udpMax) {
      const [oldId, old] = l.sessions.entries().next().value as [string, UdpSession];
      l.sessions.delete(oldId);
      closeQuietly(old.sock);
      userspaceMetrics.userspaceErrors.inc({ ...labels, reason: 'udp_session_evicted' });
    }
    userspaceMetrics.userspaceConnections.inc(labels);
    const sock = this.track(createSocket({ type: l.spec.family === 4 ? 'udp4' : 'udp6' }));
    const s: UdpSession = { sock, target: tkey(t), via, client: rinfo, last: Date.now(), queue: [] };
    sock.on('error', () => userspaceMetrics.userspaceErrors.inc({ ...labels, reason: 'io' }));
    sock.on('message', (reply) => {
      s.last = Date.now();
      userspaceMetrics.userspaceBytes.inc({ ...labels, direction: 'to_client' }, reply.length);
      try {
        via.send(reply, rinfo.port, rinfo.address);
      } catch {
        // its address went away with the listener socket
        userspaceMetrics.userspaceErrors.inc({ ...labels, reason: 'io' });
      }
    });
    sock.connect(t.port, t.ip, () => {
      const q = s.queue ?? [];
      s.queue = undefined;
      for (const m of q) sock.send(m);
    });
    return s;
  }

  /**
   * UDP sessions whose endpoint left the Service are closed: the client's
   * next datagram opens a session to an endpoint still there (kube-proxy
   * deletes such flows' conntrack entries for the same reason: a client that
   * keeps sending would never go idle, and never reach a live endpoint).
   */
  private dropSessionsOfGoneEndpoints(l: Listener): void {
    if (l.spec.protocol !== 'udp' || !l.sessions.size) return;
    const live = new Set([...l.spec.endpoints, ...(l.spec.localEndpoints ?? [])].map(tkey));
    for (const [id, s] of l.sessions) {
      if (live.has(s.target)) continue;
      l.sessions.delete(id);
      closeQuietly(s.sock);
    }
  }

  /** closes idle UDP sessions and expired affinity entries */
  private sweep(): void {
    const now = Date.now();
    for (const l of this.listeners.values()) {
      for (const [id, s] of l.sessions) {
        if (now - s.last < this.udpIdleMs) continue;
        l.sessions.delete(id);
        closeQuietly(s.sock);
      }
    }
    for (const a of this.affinities.values()) for (const [c, e] of a.clients) if (e.until <= now) a.clients.delete(c);
  }
}

/** a UDP socket closed whatever its state (not bound yet, failed, closed already) */
function closeQuietly(sock: UdpSocket | undefined): void {
  try {
    sock?.close();
  } catch {
    // closed already
  }
}
