// kpng demo: the example cluster built out of network namespaces (this node,
// the other nodes, one namespace per pod, an outside world), kpng with to-nft (or --backend userspace)
// programming this node, real connections to a ClusterIP, a NodePort and a
// LoadBalancer IP, a live endpoint change, and what kpng programmed. Removes
// everything it made, also on Ctrl-C and on error.
import { mkdtempSync, readFileSync, renameSync, rmSync, writeFileSync, mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { yaml } from '../runtime/lazy.js';
import type { Logger } from '../runtime/log.js';
import { flattenObjects } from '../sources/objects.js';
import { canonicalIP, ipFamily, ipToBig, parseCIDR } from '../api/ip.js';
import { objGet } from '../backends/ebpf/libbpf.js';
import { readCounters } from '../backends/ebpf/maps.js';
import { Lab, LabCgroup, labCgroupUnsupported, labUnsupported, poll, seenSource, verdict, type KpngProcess, type LabProtocol, type Outcome } from '../lab/index.js';

export const EXAMPLE = fileURLToPath(new URL('../../examples/cluster.yaml', import.meta.url));

type Obj = Record<string, any>;

const EXTERNAL_CLIENT = '198.51.100.7';
const CONNECTIONS = 30;

interface Row {
  service: string;
  to: string;
  port: number;
  protocol: LabProtocol;
  from: string;
  fromLabel: string;
}

function v4Hosts(cidr: string, skip: Set<string>, from: number): string[] {
  const c = parseCIDR(cidr);
  if (!c || c.family !== 4) return [];
  const base = Number(ipToBig(c.ip));
  const size = 2 ** (32 - c.prefix);
  const out: string[] = [];
  for (let i = from; i < size - 1 && out.length < 4; i++) {
    const n = base + i;
    const ip = [24, 16, 8, 0].map((s) => (n >>> s) & 255).join('.');
    if (!skip.has(ip)) out.push(ip);
  }
  return out;
}

/** the backends the demo runs, and the table it shows of each */
const DEMO_BACKENDS: Record<string, { family: string; table: string }> = { nft: { family: 'ip', table: 'kpng' }, userspace: { family: 'inet', table: 'kpng-userspace' }, ebpf: { family: 'ip', table: 'kpng' } };

const say = (s = '') => console.log(s);

type Pod = { name: string; node: string; tcp: Set<number>; udp: Set<number> };

/** What the demo makes of the example: the lab's namespaces, kpng's configuration, the live change. */
interface DemoPlan {
  example: string;
  backend: string;
  shown: { family: string; table: string };
  ebpf: boolean;
  objects: Obj[];
  nodes: Obj[];
  services: Obj[];
  /** the node kpng runs on, and its addresses */
  me: string;
  myNode: Obj;
  myIPs: string[];
  /** every endpoint address, a pod on its node */
  pods: Map<string, Pod>;
  clientIP: string;
  /** the Service the live change scales, its slice, and the pod it gains */
  grow?: Obj;
  growSlice?: Obj;
  newIP: string;
  newName: string;
  /** the kube-proxy configuration kpng gets */
  config: string;
}

/** kpng, started in the lab's node on a directory that holds the example */
interface RunningKpng {
  kpng: KpngProcess;
  cg?: LabCgroup;
  stateSocket: string;
  /** writes the cluster kpng follows */
  writeState(items: Obj[]): void;
}

export async function runDemo(opts: { example?: string; node?: string; backend?: string }, _log: Logger, signal: AbortSignal): Promise<void> {
  const t0 = Date.now();
  const plan = readExample(opts);
  say(`kpng demo: ${plan.example}`);
  say(`  ${plan.nodes.length} nodes (${plan.me} runs kpng with ${plan.ebpf ? 'to-ebpf beside to-nft' : `to-${plan.backend}`}; the others sit behind it), ${plan.services.length} Services, ${plan.pods.size} pods, one network namespace each`);

  let lab: Lab | undefined;
  const run: Partial<RunningKpng> = {};
  const dir = mkdtempSync(join(tmpdir(), 'kpng-demo-'));
  // a second Ctrl-C must not cut the cleanup short
  const patience = () => console.error('kpng demo: cleaning up, one moment');
  process.on('SIGINT', patience);
  process.on('SIGTERM', patience);
  try {
    lab = await createLab(plan);
    await servePods(lab, plan);
    signal.throwIfAborted();
    startKpng(lab, plan, dir, run);
    await showTraffic(lab, plan, run as RunningKpng, signal);
    await showWhatKpngDid(lab, plan, run as RunningKpng, signal);
  } catch (e) {
    if (!signal.aborted) throw e;
    say();
    say('Interrupted.');
  } finally {
    const stopped = run.kpng ? await run.kpng.stop('SIGTERM', 5000) : undefined;
    const n = lab?.namespaces.length ?? 0;
    await lab?.close();
    run.cg?.close();
    rmSync(dir, { recursive: true, force: true });
    say();
    if (lab) say(`Cleaned up: ${stopped === undefined ? '' : `kpng stopped (exit ${stopped}), `}${n} network namespaces deleted (${((Date.now() - t0) / 1000).toFixed(1)} s in all).`);
    process.off('SIGINT', patience);
    process.off('SIGTERM', patience);
  }
}

/** The example read, and what the lab and kpng are to be; throws where the demo cannot run. */
function readExample(opts: { example?: string; node?: string; backend?: string }): DemoPlan {
  const backend = opts.backend ?? 'nft';
  const shown = DEMO_BACKENDS[backend];
  if (!shown) throw new Error(`kpng demo: --backend ${JSON.stringify(backend)}: one of ${Object.keys(DEMO_BACKENDS).join(', ')}`);
  const why = labUnsupported();
  if (why) throw new Error(`kpng demo builds a cluster out of network namespaces: ${why}`);
  const ebpf = backend === 'ebpf';
  const noCgroup = ebpf ? labCgroupUnsupported() : undefined;
  if (noCgroup) throw new Error(`kpng demo --backend ebpf: ${noCgroup}`);
  const example = opts.example ?? EXAMPLE;
  const objects = yaml().parseAllDocuments(readFileSync(example, 'utf8')).flatMap((d) => flattenObjects(d.toJS())) as Obj[];
  const of = (kind: string) => objects.filter((o) => o?.kind === kind);
  const nodes = of('Node');
  const services = of('Service');
  const slices = of('EndpointSlice');
  const me = opts.node ?? nodes[0]?.metadata?.name;
  const myNode = nodes.find((n) => n.metadata?.name === me);
  if (!myNode) throw new Error(`kpng demo: no Node ${me} in ${example}`);
  const pods = podsOf(slices, nodes, me);
  // a client pod, and the pod the scale-up adds, in this node's pod CIDR
  const myCIDR = (myNode.spec?.podCIDRs ?? [myNode.spec?.podCIDR]).find((c: string) => c && !c.includes(':')) ?? '10.244.1.0/24';
  const clientIP = v4Hosts(myCIDR, new Set(pods.keys()), 200)[0];
  const grow = services.find((s) => (s.spec?.type ?? 'ClusterIP') === 'ClusterIP' && slices.some((sl) => sl.metadata?.labels?.['kubernetes.io/service-name'] === s.metadata?.name && (sl.endpoints ?? []).length >= 2));
  const growSlice = grow && slices.find((sl) => sl.metadata?.labels?.['kubernetes.io/service-name'] === grow.metadata.name && sl.metadata?.namespace === grow.metadata?.namespace);
  const newIP = v4Hosts(myCIDR, new Set([...pods.keys(), clientIP]), 10)[0];
  const newName = growSlice ? `${grow!.metadata.name}-${1 + Math.max(0, ...growSlice.endpoints.map((e: Obj) => Number(/-(\d+)$/.exec(e.targetRef?.name ?? '')?.[1] ?? 0)))}` : 'new-pod';
  const kubeProxy = of('ConfigMap').find((c) => c.metadata?.name === 'kube-proxy')?.data?.['config.conf'];
  const config = kubeProxy ?? JSON.stringify({ apiVersion: 'kubeproxy.config.k8s.io/v1alpha1', kind: 'KubeProxyConfiguration', mode: 'nftables', clusterCIDR: myCIDR });
  return { example, backend, shown, ebpf, objects, nodes, services, me, myNode, myIPs: nodeIPs(myNode), pods, clientIP, grow, growSlice, newIP, newName, config };
}

const nodeIPs = (n: Obj): string[] => (n.status?.addresses ?? []).filter((a: Obj) => a.type === 'InternalIP').map((a: Obj) => canonicalIP(a.address)!).filter(Boolean);

/** every endpoint address of the slices, a pod on its node (on me when its node is not in the example) */
function podsOf(slices: Obj[], nodes: Obj[], me: string): Map<string, Pod> {
  const pods = new Map<string, Pod>();
  for (const s of slices) {
    for (const e of s.endpoints ?? []) {
      for (const a of e.addresses ?? []) {
        const ip = canonicalIP(a)!;
        const p = pods.get(ip) ?? { name: e.targetRef?.name ?? `pod-${ip}`, node: nodes.some((n) => n.metadata?.name === e.nodeName) ? e.nodeName : me, tcp: new Set(), udp: new Set() };
        pods.set(ip, p);
        for (const port of s.ports ?? []) (port.protocol === 'UDP' ? p.udp : p.tcp).add(port.port);
      }
    }
  }
  return pods;
}

/** The namespaces: this node, the other nodes, a pod each, the client and the pod to come. */
function createLab(plan: DemoPlan): Promise<Lab> {
  const { me, myNode, myIPs, pods, growSlice, newName, newIP } = plan;
  return Lab.create({
    tag: 'demo',
    node: { name: me, interfaces: [{ name: 'eth0', addresses: myIPs.map((ip) => `${ip}/${ipFamily(ip) === 4 ? 24 : 64}`) }] },
    peers: plan.nodes.filter((n) => n !== myNode).map((n) => ({ name: n.metadata.name, ips: nodeIPs(n) })),
    pods: [
      ...[...pods].map(([ip, p]) => ({ name: p.name, ips: [ip], node: p.node === me ? undefined : p.node })),
      { name: 'client', ips: [plan.clientIP] },
      ...(growSlice ? [{ name: newName, ips: [newIP] }] : []),
    ],
  });
}

/** Each pod serves its ports. */
async function servePods(lab: Lab, plan: DemoPlan): Promise<void> {
  const { pods, growSlice, newName } = plan;
  await Promise.all([
    ...[...pods.values()].map((p) => lab.serve(p.name, { tcp: [...p.tcp], udp: [...p.udp] })),
    ...(growSlice ? [lab.serve(newName, { tcp: (growSlice.ports ?? []).filter((p: Obj) => p.protocol !== 'UDP').map((p: Obj) => p.port) })] : []),
  ]);
  say(`  lab built in ${lab.buildMs} ms: namespaces ${lab.stem}-*`);
}

/** kpng in the node's namespace, following a directory that holds the example (and, later, its changes); into run as it is made (for the cleanup). */
function startKpng(lab: Lab, plan: DemoPlan, dir: string, run: Partial<RunningKpng>): void {
  const stateDir = join(dir, 'state');
  mkdirSync(stateDir);
  const writeState = (items: Obj[]) => {
    writeFileSync(join(dir, 'state.tmp'), yaml().stringify({ apiVersion: 'v1', kind: 'List', items }));
    renameSync(join(dir, 'state.tmp'), join(stateDir, 'cluster.yaml'));
  };
  writeState(plan.objects);
  writeFileSync(join(dir, 'kube-proxy.yaml'), plan.config);
  const stateSocket = join(dir, 'node.sock');
  const cfg = join(dir, 'kube-proxy.yaml');
  const local = ['file', '--input', stateDir, 'to-local', '--state-socket', `unix://${stateSocket}`];
  let args = [...local, `to-${plan.backend}`, '--node-name', plan.me, '--config', cfg];
  run.stateSocket = stateSocket;
  run.writeState = writeState;
  if (plan.ebpf) {
    // the client pod's sockets are the programs' (a cgroup of the demo's own); outside traffic stays to-nft's
    const cg = (run.cg = LabCgroup.create('demo'));
    cg.place(lab.agent('client').pid!);
    args = [...local, 'to-ebpf', '--cgroup-path', cg.path, '--bpffs', join(cg.bpffs, 'kpng'), '--node-name', plan.me, '--config', cfg, 'to-nft', '--config', cfg];
  }
  say(`  running: kpng ${args.join(' ').replaceAll(dir, '$TMP')}   (in ${plan.me}'s namespace)`);
  run.kpng = lab.startKpng(args);
}

/** traffic: ClusterIPs from a pod, NodePorts from outside, LB IPs from both */
function trafficRows(plan: DemoPlan): Row[] {
  const rows: Row[] = [];
  for (const s of plan.services) {
    const sp = s.spec ?? {};
    const name = s.metadata?.name;
    for (const p of sp.ports ?? []) {
      const protocol = (p.protocol ?? 'TCP') as LabProtocol;
      if (protocol !== 'TCP' && protocol !== 'UDP') continue;
      const type = sp.type ?? 'ClusterIP';
      const lbs = (s.status?.loadBalancer?.ingress ?? []).map((i: Obj) => i.ip).filter(Boolean);
      if (type === 'ClusterIP') rows.push({ service: name, to: sp.clusterIP, port: p.port, protocol, from: plan.clientIP, fromLabel: `pod client` });
      else if (type === 'NodePort' || (type === 'LoadBalancer' && !lbs.length)) rows.push({ service: name, to: plan.myIPs[0], port: p.nodePort, protocol, from: EXTERNAL_CLIENT, fromLabel: 'outside' });
      if (type === 'LoadBalancer') for (const lb of lbs) rows.push({ service: name, to: lb, port: p.port, protocol, from: EXTERNAL_CLIENT, fromLabel: 'outside' }, { service: name, to: lb, port: p.port, protocol, from: plan.clientIP, fromLabel: 'pod client' });
    }
  }
  if (!rows.length) throw new Error('kpng demo: the example has no Service to send traffic to');
  return rows;
}

/** Once kpng answers, connections to every Service, then the live change and what follows it. */
async function showTraffic(lab: Lab, plan: DemoPlan, run: RunningKpng, signal: AbortSignal): Promise<void> {
  const rows = trafficRows(plan);
  await programmed(lab, rows, run.kpng, signal);
  say();
  say(`Traffic (${CONNECTIONS} new connections each):`);
  await trafficTable(lab, rows);
  signal.throwIfAborted();
  if (plan.grow && plan.growSlice) await liveChange(lab, plan, rows.find((r) => r.service === plan.grow!.metadata.name)!, run, signal);
  signal.throwIfAborted();
}

/** Waits until kpng has programmed the node: a connection from inside and one from outside are answered. */
async function programmed(lab: Lab, rows: Row[], kpng: KpngProcess, signal: AbortSignal): Promise<void> {
  // one row from inside and one from outside: with --backend ebpf the pod
  // client is served by eBPF and outside traffic by to-nft, which may sync later
  const firsts = rows.filter((r, i) => rows.findIndex((x) => x.fromLabel === r.fromLabel) === i);
  const ready = await poll(
    () => {
      if (kpng.process.exitCode !== null) throw new Error(`kpng exited (${kpng.process.exitCode}):\n${kpng.stderr.slice(-3000)}`);
      return Promise.all(firsts.map((r) => lab.connect({ from: r.from, to: r.to, port: r.port, protocol: r.protocol })));
    },
    (os) => os.every((o) => o.kind === 'answered'),
    { timeoutMs: 30_000, everyMs: 100, signal },
  );
  if (!ready.ok) throw new Error(`kpng did not program ${firsts.map((r) => `${r.to}:${r.port}`).join(' and ')} within 30 s\n${kpng.stderr.slice(-3000)}`);
  say(`  kpng programmed the node ${ready.ms} ms after it started`);
}

const measure = (lab: Lab, r: Row) => lab.burst({ from: r.from, to: r.to, port: r.port, protocol: r.protocol, count: CONNECTIONS });

async function trafficTable(lab: Lab, rs: Row[]): Promise<void> {
  const results = await Promise.all(rs.map((r) => measure(lab, r)));
  const cells = rs.map((r, i) => [r.service, `${r.to}:${r.port}/${r.protocol}`, `${r.fromLabel} ${r.from}`, spreadText(results[i], r), sawText(results[i], r, lab)]);
  printTable(['Service', 'to', 'from', `answered by (of ${CONNECTIONS} connections)`, 'endpoint saw'], cells);
}

/** One Service scales: the endpoint a kept connection uses leaves, a new pod joins; new connections follow, the kept one stays. */
async function liveChange(lab: Lab, plan: DemoPlan, row: Row, run: RunningKpng, signal: AbortSignal): Promise<void> {
  const { grow, growSlice, newIP, newName } = plan as Required<DemoPlan>;
  const podName = (ip: string) => plan.pods.get(ip)?.name ?? ip;
  const held = await lab.open({ from: row.from, to: row.to, port: row.port, protocol: row.protocol });
  const heldIP = verdict(held.first, row.to, row.port).replace(/:\d+$/, '');
  const keep = growSlice.endpoints.filter((e: Obj) => !(e.addresses ?? []).map((a: string) => canonicalIP(a)).includes(heldIP));
  const added = { addresses: [newIP], conditions: { ready: true, serving: true, terminating: false }, nodeName: plan.me, targetRef: { kind: 'Pod', name: newName, namespace: grow.metadata.namespace } };
  growSlice.endpoints = [...keep, added];
  say();
  say(`Live change: ${grow.metadata.name} scales down (${podName(heldIP)} leaves its EndpointSlice) and ${newName} (${newIP}) joins;`);
  say(`a connection opened to ${podName(heldIP)} before the change stays open.`);
  run.writeState(plan.objects);
  const want = new Set([...keep.flatMap((e: Obj) => e.addresses.map((a: string) => canonicalIP(a))), newIP]);
  const moved = await poll(() => measure(lab, row), (out) => out.every((o) => o.kind === 'answered' && want.has(verdict(o, row.to, row.port).replace(/:\d+$/, ''))) && out.some((o) => verdict(o, row.to, row.port).startsWith(`${newIP}:`)), { timeoutMs: 30_000, everyMs: 100, signal });
  if (!moved.ok) throw new Error(`traffic did not follow the change within 30 s\n${run.kpng.stderr.slice(-3000)}`);
  say(`  new connections follow ${moved.ms} ms after the file changed:`);
  await trafficTable(lab, [row]);
  const again = await held.send();
  const still = again.kind === 'answered' && verdict(again, row.to, row.port).startsWith(`${heldIP}:`);
  say(`  the connection opened before the change ${still ? `is still answered by ${podName(heldIP)}` : `ended (${again.kind})`}`);
  await held.close();
}

/** What kpng programmed (eBPF's counters, the nftables table), what it does for each Service, and where one packet goes. */
async function showWhatKpngDid(lab: Lab, plan: DemoPlan, run: RunningKpng, signal: AbortSignal): Promise<void> {
  const { me, shown } = plan;
  if (plan.ebpf && run.cg) showEbpfCounters(run.cg);
  const listed = await lab.exec(me, ['nft', 'list', 'table', shown.family, shown.table]);
  const lines = listed.stdout.split('\n').filter((l) => l.trim());
  say();
  say(`What kpng programmed on ${me} (nft list table ${shown.family} ${shown.table}: ${lines.length} lines, ${lines.filter((l) => /^\s*chain /.test(l)).length} chains, ${lines.filter((l) => /^\s*(map|set) /.test(l)).length} maps and sets):`);
  for (const l of trimNft(lines, 45, `${shown.family} ${shown.table}`)) say(`  ${l}`);
  signal.throwIfAborted();

  // what an operator asks a node: what it does for each Service, and where one packet goes
  const get = await lab.runKpng(['get', 'services', '--socket', run.stateSocket], 20_000);
  say();
  say(`What kpng on ${me} does for each Service (kpng get services, from its state socket; INTERNAL/EXTERNAL: endpoints used of all):`);
  say(indent(get.code === 0 ? get.stdout : `kpng get failed (${get.code}): ${get.stderr}`));
  // kpng trace reads nftables and iptables rules: the backends that DNAT in the kernel
  if (plan.backend === 'userspace') return;
  const rows = trafficRows(plan);
  const probe = rows.find((r) => r.fromLabel === 'outside' && plan.services.some((s) => s.metadata?.name === r.service && s.spec?.type === 'LoadBalancer')) ?? rows[0];
  const traceArgs = ['trace', '--src', probe.from, '--dst', probe.to, '--dport', String(probe.port), '--proto', probe.protocol.toLowerCase()];
  const traced = await lab.runKpng(traceArgs, 20_000);
  say();
  say(`Where a packet goes (kpng ${traceArgs.join(' ')}, in ${me}'s namespace: kpng's rules read back from the kernel):`);
  say(indent(traced.code === 0 ? traced.stdout : `kpng trace failed (${traced.code}): ${traced.stderr}`));
}

function showEbpfCounters(cg: LabCgroup): void {
  let counts = '(not readable)';
  const fd = objGet(join(cg.bpffs, 'kpng', 'kpng_counters'));
  if (fd) {
    try {
      counts = Object.entries(readCounters(fd.fd)).map(([k, v]) => `${k} ${v}`).join(', ');
    } finally {
      fd.close();
    }
  }
  say();
  say(`eBPF at the client pod's sockets (kpng_counters): ${counts}`);
  say(`  the pod's connections were pointed at endpoints when they connected; the "outside" rows went through to-nft`);
}

function spreadText(out: Outcome[], r: Row): string {
  const counts = new Map<string, number>();
  for (const o of out) {
    const k = o.kind === 'answered' ? o.by : verdict(o, r.to, r.port);
    counts.set(k, (counts.get(k) ?? 0) + 1);
  }
  return [...counts]
    .sort((a, b) => a[0].localeCompare(b[0]))
    .map(([k, n]) => `${k} ${n}`)
    .join(', ');
}

function sawText(out: Outcome[], r: Row, lab: Lab): string {
  const seen = new Set(out.map(seenSource).filter(Boolean) as string[]);
  return [...seen]
    .map((ip) => (ip === r.from ? `the client (${ip})` : lab.isNodeAddress(ip) ? `${lab.nodeName} (${ip}, masqueraded)` : ip))
    .join(', ');
}

function printTable(head: string[], rows: string[][]) {
  const w = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)));
  const line = (cells: string[]) => '  ' + cells.map((c, i) => c.padEnd(w[i])).join('  ').trimEnd();
  console.log(line(head));
  console.log(line(w.map((n) => '-'.repeat(n))));
  for (const r of rows) console.log(line(r));
}

const indent = (text: string) => text.trimEnd().replace(/^/gm, '  ');

/** The table's first lines, then how many more there are. */
function trimNft(lines: string[], max: number, table: string): string[] {
  if (lines.length <= max) return lines;
  return [...lines.slice(0, max), `... ${lines.length - max} more lines (all of it: nft list table ${table}, in the node's namespace)`];
}
