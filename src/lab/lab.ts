// The lab: a small cluster made of network namespaces, to send real packets
// through what kpng programs.
//
//   world ──(uplink)── node ──pod0── pod
//   (anyone outside)   (kpng)  ──pod1── pod
//                              ──peer0── peer node ──pod0── pod
//
// - node: the node kpng runs on, with the interfaces and addresses it is
//   given; it routes between everything (forwarding on), so every reply
//   goes through it again (un-DNAT, un-SNAT).
// - pods: one namespace per pod, a /32 (/128) address behind its own veth, a
//   default route to the node (like Calico). The node's side of every pod
//   link carries the node's pod-network address (169.254.1.1 and
//   fd00:6b70:6e67::1): that is the source an endpoint sees when the node
//   masquerades, distinct from every node address a client can use.
// - peers: other nodes, each behind its own link, with their own pods.
// - world: everything outside. Its clients may use any source address (an
//   external client, or an LB IP as a source), and anything the node routes
//   out is delivered to it locally ("AnyIP": a local default route), so a
//   packet kpng did not touch still gets an answer, from the address it was
//   sent to.
//
// Every namespace except the node answers a port nobody listens on with ICMP
// admin-prohibited (an `inet lab` nft table), so "connection refused" can only
// be kpng's REJECT. SCTP (real SCTP: the agent's Python helper) where the
// kernel has it; an SCTP request fails where it has not. The root namespace is never changed: links are created
// from inside the namespaces.
import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { canonicalIP, ipFamily, parseCIDR, cidrContains } from '../api/ip.js';
import { AGENT_MARGIN_MS, Agent } from './agent-client.js';
import type { LabProtocol, Outcome } from './agent.js';
import { deleteNamespacesSync, ipBatch, labStem, must, pidsIn, removeLeftovers, run, type RunResult } from './netns.js';

/** the signals QEMU's emulation kills node with now and then (see startKpng) */
export const EMULATION_FAULTS: readonly NodeJS.Signals[] = ['SIGILL', 'SIGSEGV'];

export const KPNG_BIN = fileURLToPath(new URL('../../bin/kpng.js', import.meta.url));

/** The node's address on its pod links: what a masqueraded connection shows. */
export const POD_GATEWAY = { 4: '169.254.1.1', 6: 'fd00:6b70:6e67::1' } as const;
const PEER_POD_GATEWAY = { 4: '169.254.3.1', 6: 'fe80::3' } as const;
const UPLINK = { node4: '169.254.0.1', world4: '169.254.0.2', node6: 'fe80::1', world6: 'fe80::2' } as const;
const PEER_LINK = { peer4: '169.254.2.2', node6: 'fe80::1', peer6: 'fe80::2' } as const;
const RESERVED = ['169.254.0.0/16', 'fd00:6b70:6e67::/48'].map((c) => parseCIDR(c)!);

export interface LabInterface {
  name: string;
  /** CIDR notation; a bare address is a /32 or /128 */
  addresses: string[];
}

export interface LabSpec {
  /** names this lab's namespaces: kpng-<tag>-<pid>-<random>-<role> */
  tag: string;
  node: {
    /** the Kubernetes node name; also the node agent's name */
    name: string;
    /** lo and others; the first one that is not lo links to the world. Default: eth0 with 192.168.0.2/24 */
    interfaces?: LabInterface[];
  };
  pods?: { name: string; ips: string[]; /** a peer's name; default: the lab node */ node?: string }[];
  peers?: { name: string; ips: string[] }[];
}

export interface ConnectOptions {
  /** the client's source address: the namespace that owns it sends (the world for any other) */
  from: string;
  to: string;
  port: number;
  protocol?: LabProtocol;
  /** how long to wait for an answer; no answer by then is a timeout (DROP) */
  timeoutMs?: number;
  /** send from this agent instead of the source's owner */
  via?: string;
}

export interface LabConnection {
  /** the first exchange (the connection is kept only if it was answered) */
  readonly first: Outcome;
  /** another exchange on the same connection (TCP) or socket (UDP: the same conntrack entry) */
  send(timeoutMs?: number): Promise<Outcome>;
  close(): Promise<void>;
}

export interface KpngProcess {
  readonly process: ChildProcess;
  readonly stdout: string;
  readonly stderr: string;
  readonly exited: Promise<number | null>;
  /** waits for exit (for --once); throws on timeout */
  wait(timeoutMs?: number): Promise<number | null>;
  /** polls cond until true; throws on timeout (default 20 s) or if kpng exits first */
  until(what: string, cond: () => boolean, opts?: { timeoutMs?: number }): Promise<void>;
  /** sends signal (TERM by default), SIGKILL after graceMs */
  stop(signal?: NodeJS.Signals, graceMs?: number): Promise<number | null>;
}

const open = new Set<Lab>();
let exitHook = false;

function hostOf(cidr: string): string {
  const ip = canonicalIP(cidr.split('/')[0]);
  if (!ip) throw new Error(`lab: ${JSON.stringify(cidr)} is not an address`);
  return ip;
}

function withPrefix(a: string): string {
  return a.includes('/') ? a : `${a}/${ipFamily(hostOf(a)) === 4 ? 32 : 128}`;
}

function addrCmd(cidr: string, dev: string, extra = ''): string {
  const a = withPrefix(cidr);
  return `addr add ${a} dev ${dev}${ipFamily(hostOf(a)) === 6 ? ' nodad' : ''}${extra}`;
}

const sysctlsAll: Record<string, string> = {
  'net.ipv4.conf.all.rp_filter': '0',
  'net.ipv4.conf.default.rp_filter': '0',
  'net.ipv4.conf.all.accept_redirects': '0',
  'net.ipv4.conf.default.accept_redirects': '0',
  'net.ipv6.conf.all.accept_redirects': '0',
  'net.ipv6.conf.default.accept_redirects': '0',
  'net.ipv6.conf.all.accept_dad': '0',
  'net.ipv6.conf.default.accept_dad': '0',
};
const sysctlsRouter: Record<string, string> = {
  ...sysctlsAll,
  'net.ipv4.ip_forward': '1',
  'net.ipv6.conf.all.forwarding': '1',
  'net.ipv6.conf.default.forwarding': '1',
  // hairpin traffic leaves by the link it came in on: no redirects to pods
  'net.ipv4.conf.all.send_redirects': '0',
  'net.ipv4.conf.default.send_redirects': '0',
};

// A port nobody listens on answers ICMP admin-prohibited (EHOSTUNREACH /
// EACCES) instead of RST / port-unreachable (ECONNREFUSED): "refused" then
// means kpng's REJECT only. After kpng's filter chains (priority filter+10).
// The socket expression knows no SCTP: the lab lists its SCTP servers in sets
// and refuses only INITs to others (the rest belongs to associations).
const LAB_TABLE = `table inet lab {
  set sctp4 { type ipv4_addr . inet_service; }
  set sctp6 { type ipv6_addr . inet_service; }
  chain input {
    type filter hook input priority filter + 10; policy accept;
    meta l4proto { tcp, udp } socket transparent 0 accept
    meta l4proto { tcp, udp } reject with icmpx type admin-prohibited
    ip daddr . sctp dport @sctp4 accept
    ip6 daddr . sctp dport @sctp6 accept
    sctp chunk init exists reject with icmpx type admin-prohibited
  }
}
`;

interface Member {
  role: 'node' | 'world' | 'pod' | 'peer';
  name: string;
  ns: string;
  ips: string[];
  agent: Agent;
}

export class Lab {
  readonly nodeName: string;
  readonly stem: string;
  private readonly members = new Map<string, Member>();
  private readonly owners = new Map<string, string>();
  private readonly kpngs = new Set<KpngProcess>();
  private cids = 0;
  private closed = false;
  /** how long building took */
  buildMs = 0;
  /** closed ports answer admin-prohibited, not port-unreachable (so "refused" is kpng's REJECT only) */
  closedPortsMarked = false;

  private constructor(readonly spec: LabSpec) {
    this.nodeName = spec.node.name;
    this.stem = labStem(spec.tag);
  }

  /** Builds the lab. On failure everything made so far is removed. */
  static async create(spec: LabSpec): Promise<Lab> {
    const lab = new Lab(spec);
    removeLeftovers(spec.tag);
    open.add(lab);
    if (!exitHook) {
      exitHook = true;
      process.on('exit', () => {
        for (const l of open) l.closeSync();
      });
    }
    const t0 = Date.now();
    try {
      await lab.build();
    } catch (e) {
      await lab.close();
      throw e;
    }
    lab.buildMs = Date.now() - t0;
    return lab;
  }

  get namespaces(): string[] {
    return [...this.members.values()].map((m) => m.ns);
  }

  /** The namespace of an agent ("world", the node name, a pod or peer name). */
  ns(name: string): string {
    return this.member(name).ns;
  }

  agent(name: string): Agent {
    return this.member(name).agent;
  }

  get nodeNs(): string {
    return this.member(this.nodeName).ns;
  }

  /** The addresses of an agent (the node: its interface addresses). */
  addresses(name: string): string[] {
    return [...this.member(name).ips];
  }

  /** Which agent sends from (and owns) an address: the world for any address nobody in the lab has. */
  ownerOf(ip: string): string {
    return this.owners.get(canonicalIP(ip) ?? ip) ?? 'world';
  }

  /** True if the address is the node's: one of its own or its pod-network address (masquerading). */
  isNodeAddress(ip: string): boolean {
    const c = canonicalIP(ip) ?? ip;
    return this.ownerOf(c) === this.nodeName || c === POD_GATEWAY[4] || c === POD_GATEWAY[6];
  }

  private member(name: string): Member {
    const m = this.members.get(name);
    if (!m) throw new Error(`lab: no agent ${name} (have ${[...this.members.keys()].join(', ')})`);
    return m;
  }

  private add(role: Member['role'], name: string, suffix: string, ips: string[]): Member {
    if (this.members.has(name)) throw new Error(`lab: two members named ${name}`);
    const m: Member = { role, name, ns: `${this.stem}-${suffix}`, ips, agent: new Agent(name, `${this.stem}-${suffix}`) };
    this.members.set(name, m);
    for (const ip of ips) {
      if (RESERVED.some((c) => cidrContains(c, ip))) throw new Error(`lab: ${ip} (${name}) is in a range the lab uses for its links`);
      if (!this.owners.has(ip)) this.owners.set(ip, name);
    }
    return m;
  }

  private async build(): Promise<void> {
    const spec = this.spec;
    const ifaces = spec.node.interfaces ?? [{ name: 'lo', addresses: ['127.0.0.1/8', '::1/128'] }, { name: 'eth0', addresses: ['192.168.0.2/24'] }];
    const uplink = ifaces.find((i) => i.name !== 'lo')?.name ?? 'eth0';
    const nodeIPs = [...new Set(ifaces.flatMap((i) => i.addresses.map(hostOf)))];
    const node = this.add('node', spec.node.name, 'node', [...nodeIPs, '127.0.0.1', '::1']);
    const world = this.add('world', 'world', 'world', []);
    const peers = (spec.peers ?? []).map((p, i) => this.add('peer', p.name, `peer${i}`, p.ips.map(hostOf)));
    // an address the node has is served by the node (host-network pods)
    const pods = (spec.pods ?? []).map((p, i) => {
      const ips = p.ips.map(hostOf);
      if (ips.every((ip) => nodeIPs.includes(ip))) return undefined;
      return { spec: p, m: this.add('pod', p.name, `pod${i}`, ips.filter((ip) => !nodeIPs.includes(ip))) };
    });
    for (const p of pods) if (p?.spec.node && !peers.some((q) => q.name === p.spec.node)) throw new Error(`lab: pod ${p.spec.name} is on unknown peer ${p.spec.node}`);

    const all = [...this.members.values()];
    await must('ip', ['-batch', '-'], { input: all.map((m) => `netns add ${m.ns}`).join('\n') + '\n' });
    await Promise.all(all.map((m) => m.agent.start()));
    await Promise.all(all.map((m) => m.agent.request({ op: 'sysctl', values: m.role === 'node' || m.role === 'peer' ? sysctlsRouter : m.role === 'world' ? { ...sysctlsAll, 'net.ipv6.ip_nonlocal_bind': '1' } : sysctlsAll })));

    // node: uplink to the world, extra interfaces, pod and peer links
    const nb: string[] = ['link set lo up', `link add ${uplink} type veth peer name w0 netns ${world.ns}`];
    for (const i of ifaces) {
      if (i.name !== 'lo' && i.name !== uplink) nb.push(`link add ${i.name} type dummy`);
      if (i.name !== 'lo') nb.push(`link set ${i.name} up`);
      for (const a of i.addresses) {
        if (i.name === 'lo' && ['127.0.0.1', '::1'].includes(hostOf(a))) continue;
        nb.push(addrCmd(a, i.name));
      }
    }
    nb.push(
      `addr add ${UPLINK.node4}/32 dev ${uplink} scope link`,
      `addr add ${UPLINK.node6}/64 dev ${uplink} nodad`,
      `route add default via ${UPLINK.world4} dev ${uplink} onlink`,
      `route add default via ${UPLINK.world6} dev ${uplink}`,
    );
    const gateway = (dev: string) => [`link set ${dev} up`, `addr add ${POD_GATEWAY[4]}/32 dev ${dev}`, `addr add ${POD_GATEWAY[6]}/128 dev ${dev} nodad`, `addr add ${UPLINK.node6}/64 dev ${dev} nodad`];
    const hostRoute = (ip: string, dev: string, via?: { 4: string; 6: string }) =>
      `route add ${withPrefix(ip)} ${via ? `via ${via[ipFamily(ip)]} ` : ''}dev ${dev}${via && ipFamily(ip) === 4 ? ' onlink' : ''}`;
    const podLines = (m: Member, gw: { 4: string; 6: string }) => [
      'link set lo up',
      'link set eth0 up',
      ...m.ips.map((ip) => addrCmd(ip, 'eth0')),
      `route add default via ${gw[4]} dev eth0 onlink`,
      `route add default via ${gw[6]} dev eth0`,
    ];
    const batches: Promise<unknown>[] = [];
    pods.forEach((p, i) => {
      if (!p || p.spec.node) return;
      nb.push(`link add pod${i} type veth peer name eth0 netns ${p.m.ns}`, ...gateway(`pod${i}`), ...p.m.ips.map((ip) => hostRoute(ip, `pod${i}`)));
    });
    peers.forEach((q, i) => {
      nb.push(`link add peer${i} type veth peer name eth0 netns ${q.ns}`, ...gateway(`peer${i}`), ...q.ips.map((ip) => hostRoute(ip, `peer${i}`)));
      for (const p of pods) if (p?.spec.node === q.name) nb.push(...p.m.ips.map((ip) => hostRoute(ip, `peer${i}`, { 4: PEER_LINK.peer4, 6: PEER_LINK.peer6 })));
    });
    await ipBatch(node.ns, nb);

    batches.push(
      ipBatch(world.ns, [
        'link set lo up',
        'link set w0 up',
        `addr add ${UPLINK.world4}/32 dev w0 scope link`,
        `addr add ${UPLINK.world6}/64 dev w0 nodad`,
        `route add default via ${UPLINK.node4} dev w0 onlink`,
        `route add default via ${UPLINK.node6} dev w0`,
        // AnyIP: whatever reaches the world is local to it; what the world
        // sends itself goes out (its own rule, before the local table)
        'route add local 0.0.0.0/0 dev lo table local',
        'route add local ::/0 dev lo table local',
      ]).then(() =>
        Promise.all(
          ([4, 6] as const).map((f) => ipBatch(world.ns, ['rule add pref 10 iif lo lookup main', 'rule add pref 100 lookup local', 'rule del pref 0'], f)),
        ),
      ),
    );
    for (const p of pods) if (p && !p.spec.node) batches.push(ipBatch(p.m.ns, podLines(p.m, { 4: POD_GATEWAY[4], 6: UPLINK.node6 })));
    peers.forEach((q) => {
      const lines = [
        'link set lo up',
        'link set eth0 up',
        `addr add ${PEER_LINK.peer4}/32 dev eth0 scope link`,
        `addr add ${PEER_LINK.peer6}/64 dev eth0 nodad`,
        ...q.ips.map((ip) => addrCmd(ip, 'eth0')),
        `route add default via ${POD_GATEWAY[4]} dev eth0 onlink`,
        `route add default via ${PEER_LINK.node6} dev eth0`,
      ];
      const mine = pods.filter((p) => p?.spec.node === q.name);
      mine.forEach((p, j) => {
        lines.push(
          `link add pod${j} type veth peer name eth0 netns ${p!.m.ns}`,
          `link set pod${j} up`,
          `addr add ${PEER_POD_GATEWAY[4]}/32 dev pod${j} scope link`,
          `addr add ${PEER_POD_GATEWAY[6]}/64 dev pod${j} nodad`,
          ...p!.m.ips.map((ip) => hostRoute(ip, `pod${j}`)),
        );
      });
      batches.push(ipBatch(q.ns, lines).then(() => Promise.all(mine.map((p) => ipBatch(p!.m.ns, podLines(p!.m, PEER_POD_GATEWAY))))));
    });
    await Promise.all(batches);
    // best effort (it needs the kernel's nft_socket): without it a closed
    // port answers ECONNREFUSED like kpng's REJECT, and the lab is less exact
    const marked = await Promise.all(all.filter((m) => m.role !== 'node').map((m) => run('ip', ['netns', 'exec', m.ns, 'nft', '-f', '-'], { input: LAB_TABLE })));
    this.closedPortsMarked = marked.every((r) => r.code === 0);
  }

  // --- servers

  /** Starts a server in an agent (TCP, UDP or SCTP on host:port; SCTP on one address, not the wildcard). */
  async listen(agent: string, protocol: LabProtocol, port: number, host: string): Promise<void> {
    await this.agent(agent).request({ op: 'listen', protocol, host, port });
    if (protocol === 'SCTP') await this.markSctp(agent, [[host, port]], 'add');
  }

  /**
   * Serves ports in an agent: TCP on every address (0.0.0.0 and ::), UDP and
   * SCTP on each of its own addresses (UDP answers must come from the address
   * that was asked; an SCTP server sees the address it was reached at only
   * when bound to it), or on udpHosts (the world: any address).
   */
  async serve(agent: string, ports: { tcp?: number[]; udp?: number[]; sctp?: number[]; udpHosts?: string[] }): Promise<void> {
    const m = this.member(agent);
    const hosts = ports.udpHosts ?? m.ips.filter((ip) => ip !== '127.0.0.1' && ip !== '::1');
    const jobs: Promise<void>[] = [];
    const sctp: [string, number][] = [];
    for (const port of new Set(ports.tcp ?? [])) for (const h of ['0.0.0.0', '::']) jobs.push(this.listen(agent, 'TCP', port, h));
    for (const port of new Set(ports.udp ?? [])) for (const h of new Set(hosts)) jobs.push(this.listen(agent, 'UDP', port, h));
    for (const port of new Set(ports.sctp ?? [])) for (const h of new Set(hosts)) sctp.push([h, port]);
    const agentOf = this.agent(agent);
    jobs.push(...sctp.map(([host, port]) => agentOf.request({ op: 'listen', protocol: 'SCTP', host, port }).then(() => undefined)));
    await Promise.all(jobs);
    await this.markSctp(agent, sctp, 'add');
  }

  /** Stops an agent's servers (on a port, or all); dropConnections also ends their open TCP and SCTP connections. */
  async unserve(agent: string, opts: { protocol?: LabProtocol; port?: number; dropConnections?: boolean } = {}): Promise<void> {
    await this.agent(agent).request({ op: 'unlisten', ...opts });
    if (!opts.protocol || opts.protocol === 'SCTP') {
      const mine = this.sctpServed.get(agent) ?? new Map<string, [string, number]>();
      await this.markSctp(agent, [...mine.values()].filter(([, p]) => opts.port === undefined || p === opts.port), 'delete');
    }
  }

  // The lab table's SCTP sets (see LAB_TABLE): what an agent serves is let in, other SCTP is admin-prohibited.
  private readonly sctpServed = new Map<string, Map<string, [string, number]>>();
  private async markSctp(agent: string, servers: [string, number][], op: 'add' | 'delete'): Promise<void> {
    const m = this.member(agent);
    const mine = this.sctpServed.get(agent) ?? new Map<string, [string, number]>();
    this.sctpServed.set(agent, mine);
    const todo = servers.filter(([h, p]) => mine.has(`${h} ${p}`) === (op === 'delete'));
    for (const [h, p] of todo) (op === 'add' ? mine.set(`${h} ${p}`, [h, p]) : mine.delete(`${h} ${p}`));
    if (m.role === 'node' || !this.closedPortsMarked || !todo.length) return;
    const lines = todo.map(([h, p]) => `${op} element inet lab ${ipFamily(h) === 4 ? 'sctp4' : 'sctp6'} { ${h} . ${p} }`);
    await must('ip', ['netns', 'exec', m.ns, 'nft', '-f', '-'], { input: lines.join('\n') + '\n' });
  }

  // --- clients

  private client(o: ConnectOptions) {
    const from = canonicalIP(o.from);
    const to = canonicalIP(o.to);
    if (!from || !to) throw new Error(`lab: bad address in ${o.from} -> ${o.to}`);
    const agent = this.agent(o.via ?? this.ownerOf(from));
    return { agent, args: { protocol: o.protocol ?? 'TCP', src: from, dst: to, port: o.port, timeoutMs: o.timeoutMs ?? 1500 } as const };
  }

  /** One new connection (one exchange), from o.from's namespace. */
  connect(o: ConnectOptions): Promise<Outcome> {
    const { agent, args } = this.client(o);
    return agent.request<Outcome>({ op: 'connect', ...args }, args.timeoutMs + AGENT_MARGIN_MS);
  }

  /** count new connections at once (each its own source port). */
  burst(o: ConnectOptions & { count: number }): Promise<Outcome[]> {
    const { agent, args } = this.client(o);
    return agent.request<Outcome[]>({ op: 'burst', count: o.count, ...args }, args.timeoutMs + 20_000);
  }

  /** A connection kept open for more exchanges later. */
  async open(o: ConnectOptions): Promise<LabConnection> {
    const { agent, args } = this.client(o);
    const cid = `c${++this.cids}`;
    const first = await agent.request<Outcome>({ op: 'open', cid, ...args }, args.timeoutMs + AGENT_MARGIN_MS);
    return {
      first,
      send: (timeoutMs = args.timeoutMs) => agent.request<Outcome>({ op: 'send', cid, timeoutMs }, timeoutMs + AGENT_MARGIN_MS),
      close: () => agent.request({ op: 'close', cid }).then(() => undefined),
    };
  }

  // --- commands and kpng

  /** Runs a command inside an agent's namespace. */
  exec(agent: string, argv: string[], opts: { input?: string; timeoutMs?: number } = {}): Promise<RunResult> {
    return run('ip', ['netns', 'exec', this.ns(agent), ...argv], opts);
  }

  /** Starts kpng in the node's namespace: `kpng <args>`. Stopped by close(). */
  startKpng(args: string[], opts: { env?: NodeJS.ProcessEnv } = {}): KpngProcess {
    let stdout = '';
    let stderr = '';
    const cap = (s: string) => (s.length > 400_000 ? s.slice(-200_000) : s);
    // its own process group, as the agents': only the lab's owner decides when it stops
    const spawnKpng = () => {
      const c = spawn('ip', ['netns', 'exec', this.nodeNs, process.execPath, KPNG_BIN, ...args], { env: { ...process.env, ...opts.env }, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
      c.stdout!.on('data', (d) => (stdout = cap(stdout + d)));
      c.stderr!.on('data', (d) => (stderr = cap(stderr + d)));
      return c;
    };
    let p = spawnKpng();
    let done = false;
    // in the kernel lab, node dies now and then of SIGILL or SIGSEGV with
    // nothing on its stderr: QEMU's emulation (TCG) failing on V8's generated
    // code (docs/kernel-lab.md), not kpng's doing. kpng is started again once,
    // in place, as a restarted node agent (kpng's runs are idempotent).
    let mayRestart = !!process.env.KPNG_VMLAB;
    const exited = new Promise<number | null>((resolve) => {
      const follow = (c: ChildProcess) =>
        c.on('close', (code, signal) => {
          if (mayRestart && signal && EMULATION_FAULTS.includes(signal)) {
            mayRestart = false;
            const line = `# lab: kpng ${args.join(' ')} died of ${signal} in QEMU's emulation; started again`;
            console.log(line);
            stderr = cap(`${stderr}${line}\n`);
            follow((p = spawnKpng()));
            return;
          }
          done = true;
          resolve(code ?? (signal ? -1 : null));
        });
      follow(p);
    });
    const lab = this;
    const k: KpngProcess = {
      get process() {
        return p;
      },
      get stdout() {
        return stdout;
      },
      get stderr() {
        return stderr;
      },
      exited,
      async wait(timeoutMs = 60_000) {
        let timer: NodeJS.Timeout | undefined;
        const t = new Promise<'timeout'>((r) => (timer = setTimeout(() => r('timeout'), timeoutMs)));
        const r = await Promise.race([exited, t]);
        clearTimeout(timer);
        if (r === 'timeout') {
          mayRestart = false;
          p.kill('SIGKILL');
          throw new Error(`kpng did not exit within ${timeoutMs} ms\nstderr:\n${stderr.slice(-4000)}`);
        }
        return r;
      },
      async until(what, cond, { timeoutMs = 20_000 } = {}) {
        const end = Date.now() + timeoutMs;
        while (!cond()) {
          if (done) throw new Error(`kpng exited (${p.exitCode ?? p.signalCode}) before ${what}\nstderr:\n${stderr.slice(-4000)}`);
          if (Date.now() > end) throw new Error(`timed out waiting for ${what}\nstderr:\n${stderr.slice(-4000)}`);
          await new Promise((r) => setTimeout(r, 25));
        }
      },
      async stop(signal = 'SIGTERM', graceMs = 5000) {
        if (!done) {
          mayRestart = false; // stopped: never started again
          p.kill(signal);
          const t = setTimeout(() => p.kill('SIGKILL'), graceMs);
          await exited;
          clearTimeout(t);
        }
        lab.kpngs.delete(k);
        return exited;
      },
    };
    this.kpngs.add(k);
    return k;
  }

  /** Runs `kpng <args>` to completion (e.g. with --once). */
  async runKpng(args: string[], timeoutMs = 60_000): Promise<{ code: number | null; signal: NodeJS.Signals | null; stdout: string; stderr: string }> {
    const k = this.startKpng(args);
    const code = await k.wait(timeoutMs);
    this.kpngs.delete(k);
    return { code, signal: k.process.signalCode, stdout: k.stdout, stderr: k.stderr };
  }

  // --- teardown

  /** Stops kpng and the agents, deletes every namespace. Idempotent. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await Promise.all([...this.kpngs].map((k) => k.stop('SIGTERM', 3000)));
    await Promise.all([...this.members.values()].map((m) => m.agent.stop()));
    this.removeNamespaces();
    open.delete(this);
  }

  private removeNamespaces() {
    const mine = this.namespaces;
    // anything still inside (a process kpng started, say) goes first
    for (const ns of mine) {
      for (const pid of pidsIn(ns)) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          // gone
        }
      }
    }
    deleteNamespacesSync(mine);
  }

  /** For exit handlers: kill, delete, no waiting. */
  closeSync(): void {
    if (this.closed) return;
    this.closed = true;
    for (const k of this.kpngs) k.process.kill('SIGKILL');
    for (const m of this.members.values()) m.agent.killSync();
    this.removeNamespaces();
    open.delete(this);
  }
}
