// kpng in a lab: the backends (to-nft; to-iptables with iptables-nft or
// iptables-legacy) and why one cannot run here, state files, the
// KubeProxyConfiguration, running kpng in the node's namespace (once, or
// following a state directory the test rewrites), and bounded polling on real
// traffic.
import { describe } from 'node:test';
import { existsSync, mkdirSync, mkdtempSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { Lab, LabCgroup, describeOutcome, labUnsupported, poll, type LabSpec, type KpngProcess, type Outcome } from '../../src/lab/index.js';
import type { IptablesMode } from '../../src/backends/iptables/iptables.js';
import { iptablesUnsupported } from './iptables.js';
import { skipOrFailInCI } from './ci.js';

type Obj = Record<string, any>;

let caps: { fileNodeName: boolean; backends: string[]; error?: string } | undefined;

/** What this checkout's kpng offers: its command tree, built in-process (cheaper than spawning --help). */
export async function kpngCapabilities(): Promise<{ fileNodeName: boolean; backends: string[]; error?: string }> {
  if (caps) return caps;
  try {
    const { buildProgram } = await import('../../src/cli/main.js');
    const program = buildProgram(async () => {});
    const file = program.commands.find((c) => c.name() === 'file');
    const local = file?.commands.find((c) => c.name() === 'to-local');
    caps = {
      fileNodeName: !!file?.options.some((o) => o.long === '--node-name'),
      backends: (local?.commands ?? []).map((c) => c.name().replace(/^to-/, '')),
    };
  } catch (e) {
    caps = { fileNodeName: false, backends: [], error: (e as Error).message };
  }
  return caps;
}

/**
 * A backend kpng programs in a lab: to-nft, to-iptables with iptables-nft or
 * iptables-legacy, to-ipvs (kernel lab only), to-userspace, or to-ebpf beside
 * to-nft (its programs on a cgroup the test made, pinned in a bpffs mount of its own).
 */
export type LabBackend = { name: 'nft' } | { name: 'iptables'; mode: IptablesMode } | { name: 'ipvs' } | { name: 'userspace' } | EbpfNftBackend;

/** `to-local to-ebpf --cgroup-path C --bpffs B to-nft` */
export interface EbpfNftBackend {
  readonly name: 'ebpf+nft';
  readonly cgroupPath: string;
  readonly bpffs: string;
}

/** The backends this machine's kernel runs. */
export type HostBackend = Exclude<LabBackend, { name: 'ipvs' } | { name: 'userspace' } | EbpfNftBackend>;

/** Every backend the shared lab cases run for on the host (to-ipvs needs the kernel lab: test/vm). */
export const BACKENDS: readonly HostBackend[] = [{ name: 'nft' }, { name: 'iptables', mode: 'nft' }, { name: 'iptables', mode: 'legacy' }];

/** nftables, iptables-nft, iptables-legacy */
export const backendLabel = (b: LabBackend): string => (b.name === 'iptables' ? `iptables-${b.mode}` : b.name === 'nft' ? 'nftables' : b.name === 'ebpf+nft' ? 'ebpf+nftables' : b.name);

/** A short lab tag suffix (namespace names are kpng-<tag>-...): nft, iptn, iptl */
export const backendTag = (b: LabBackend): string => (b.name === 'iptables' ? `ipt${b.mode[0]}` : b.name === 'ebpf+nft' ? 'ebpf' : b.name);

/** The KubeProxyConfiguration `mode` (and config section) of a backend. */
export function proxyMode(b: Exclude<LabBackend, { name: 'userspace' }>): Exclude<ProxyMode, 'userspace'>;
export function proxyMode(b: LabBackend): ProxyMode;
export function proxyMode(b: LabBackend): ProxyMode {
  return b.name === 'nft' || b.name === 'ebpf+nft' ? 'nftables' : b.name;
}

export type ProxyMode = 'nftables' | 'iptables' | 'ipvs' | 'userspace';

/** Why this kernel cannot run IPVS (this machine's has none: the kernel lab's has), or undefined. */
export function ipvsUnsupported(): string | undefined {
  if (existsSync('/proc/net/ip_vs')) return undefined;
  spawnSync('modprobe', ['ip_vs'], { stdio: 'ignore' });
  return existsSync('/proc/net/ip_vs') ? undefined : 'this kernel has no IPVS (the kernel lab has: test/vm)';
}

/** Why lab tests of this backend cannot run here, or undefined. */
export async function backendLabUnsupported(b: LabBackend): Promise<string | undefined> {
  const why = skipOrFailInCI(labUnsupported()) ?? (b.name === 'iptables' ? iptablesUnsupported(b.mode) : b.name === 'ipvs' ? skipOrFailInCI(ipvsUnsupported()) : undefined);
  if (why) return why;
  const c = await kpngCapabilities();
  if (c.error) return skipOrFailInCI(`kpng's command line does not load: ${c.error}`);
  for (const name of b.name === 'ebpf+nft' ? ['ebpf', 'nft'] : [b.name])
    if (!c.backends.includes(name)) return skipOrFailInCI(`the to-${name} backend is not available in this checkout (kpng file to-local has no to-${name})`);
  return undefined;
}

/**
 * One suite per backend under `title`: backends two at a time (2 cores), the
 * cases of one backend one at a time (they share its lab). A backend that
 * cannot run here is skipped with the reason.
 */
export async function describeBackends<B extends LabBackend = HostBackend>(title: string, body: (b: B) => void, backends: readonly B[] = BACKENDS as readonly B[]): Promise<void> {
  const skips = await Promise.all(backends.map(backendLabUnsupported));
  describe(title, { concurrency: 2 }, () => {
    backends.forEach((b, i) => describe(backendLabel(b), { skip: skips[i], concurrency: 1 }, () => body(b)));
  });
}

/**
 * `kpng [PRE] file --input STATE --node-name NODE to-local to-nft --config CONFIG [--once] [EXTRA]`,
 * or `... to-local to-iptables --iptables-mode MODE --config CONFIG [--once] [EXTRA]`.
 * (While the file source has no --node-name, the flag goes to the backend,
 * which has it; known once backendLabUnsupported or kpngCapabilities ran.)
 */
export function kpngArgs(b: LabBackend, state: string, node: string, config: string, opts: { once?: boolean; pre?: string[]; extra?: string[]; local?: string[] } = {}): string[] {
  const backend = b.name === 'iptables' ? ['to-iptables', '--iptables-mode', b.mode] : b.name === 'ebpf+nft' ? ['to-ebpf', '--cgroup-path', b.cgroupPath, '--bpffs', b.bpffs] : [`to-${b.name}`];
  // to-ebpf's flags, then to-nft beside it with the same configuration
  const beside = b.name === 'ebpf+nft' ? ['to-nft', '--config', config] : [];
  const tail = ['--config', config, ...(opts.once ? ['--once'] : []), ...(opts.extra ?? []), ...beside];
  // each lab's kpng its own state socket (and node lock beside it) and tenant socket: labs run side by
  // side on one host; opts.local's flags come after, and win
  const own = (name: string) => `unix://${join(dirname(state), name)}`;
  const local = ['to-local', '--state-socket', own('node.sock'), '--rules-socket', own('rules.sock'), ...(opts.local ?? [])];
  return caps?.fileNodeName
    ? [...(opts.pre ?? []), 'file', '--input', state, '--node-name', node, ...local, ...backend, ...tail]
    : [...(opts.pre ?? []), 'file', '--input', state, ...local, ...backend, '--node-name', node, ...tail];
}

export function list(items: Obj[]): Obj {
  return { apiVersion: 'v1', kind: 'List', metadata: { resourceVersion: '' }, items };
}

export interface ProxyConfigOptions {
  clusterCIDR?: string;
  nodePortAddresses?: string[];
  masqueradeAll?: boolean;
  syncPeriod?: string;
  minSyncPeriod?: string;
  /** iptables only */
  localhostNodePorts?: boolean;
}

export function kubeProxyConfig(c: ProxyConfigOptions & { mode?: ProxyMode; ipvs?: Obj } = {}): Obj {
  const mode = c.mode ?? 'nftables';
  // ipvs mode takes masquerading from the iptables section, as kube-proxy
  const periods = { ...(c.syncPeriod ? { syncPeriod: c.syncPeriod } : {}), ...(c.minSyncPeriod ? { minSyncPeriod: c.minSyncPeriod } : {}) };
  return {
    apiVersion: 'kubeproxy.config.k8s.io/v1alpha1',
    kind: 'KubeProxyConfiguration',
    mode,
    clusterCIDR: c.clusterCIDR ?? '',
    detectLocalMode: 'ClusterCIDR',
    ...(c.nodePortAddresses?.length ? { nodePortAddresses: c.nodePortAddresses } : {}),
    // ipvs takes masquerading from iptables, userspace its periods from nftables (it has no section)
    [mode === 'ipvs' ? 'iptables' : mode === 'userspace' ? 'nftables' : mode]: {
      masqueradeAll: c.masqueradeAll ?? false,
      masqueradeBit: 14,
      ...(mode === 'ipvs' ? {} : periods),
      ...(mode === 'iptables' && c.localhostNodePorts !== undefined ? { localhostNodePorts: c.localhostNodePorts } : {}),
    },
    ...(mode === 'ipvs' ? { ipvs: { ...periods, ...c.ipvs } } : {}),
  };
}

/** The KubeProxyConfiguration for a backend: its mode and that mode's section. */
export function backendConfig(b: LabBackend, c: ProxyConfigOptions = {}): Obj {
  return kubeProxyConfig({ ...c, mode: proxyMode(b) });
}

/** Polls fn until ok(result) or the deadline; returns the last result (check it). */
export function pollUntil<T>(fn: () => Promise<T>, ok: (t: T) => boolean, timeoutMs = 15_000, everyMs = 100): Promise<{ value: T; ok: boolean; ms: number }> {
  return poll(fn, ok, { timeoutMs, everyMs });
}

/** A lab with kpng (one backend) following a state directory. */
export class KpngLab {
  kpng?: KpngProcess;
  private constructor(
    readonly backend: LabBackend,
    readonly lab: Lab,
    readonly dir: string,
    readonly statePath: string,
    readonly configPath: string,
  ) {}

  static async create(backend: LabBackend, spec: LabSpec, objects: Obj[], config: Obj): Promise<KpngLab> {
    const dir = mkdtempSync(join(tmpdir(), 'kpng-lab-'));
    const stateDir = join(dir, 'state');
    const configPath = join(dir, 'config.json');
    writeFileSync(configPath, JSON.stringify(config, null, 2));
    let lab: Lab | undefined;
    try {
      lab = await Lab.create(spec);
      const kl = new KpngLab(backend, lab, dir, stateDir, configPath);
      mkdirSync(stateDir);
      kl.setState(objects);
      return kl;
    } catch (e) {
      await lab?.close();
      rmSync(dir, { recursive: true, force: true });
      throw e;
    }
  }

  /** Replaces the state (atomically: write, then rename, as config tools do). */
  setState(objects: Obj[]): void {
    const tmp = join(this.dir, 'state.json.tmp');
    writeFileSync(tmp, JSON.stringify(list(objects), null, 1));
    renameSync(tmp, join(this.statePath, 'state.json'));
  }

  /** Starts kpng following the state directory (pre: global options such as --log-level; local: to-local's flags; extra: after the backend's). */
  start(opts: { pre?: string[]; extra?: string[]; local?: string[] } = {}): KpngProcess {
    this.kpng = this.lab.startKpng(kpngArgs(this.backend, this.statePath, this.lab.nodeName, this.configPath, opts));
    return this.kpng;
  }

  /**
   * Starts kpng and waits until probe is answered by an endpoint, not by the
   * world (a ClusterIP not programmed yet is routed there); throws if never.
   */
  async startAndWait(probe: () => Promise<Outcome>, opts: { pre?: string[]; extra?: string[]; local?: string[]; timeoutMs?: number } = {}): Promise<KpngProcess> {
    const kpng = this.start(opts);
    const ready = await pollUntil(probe, (o) => o.kind === 'answered' && o.by !== 'world', opts.timeoutMs ?? 20_000);
    if (!ready.ok) throw new Error(`kpng never programmed the Service: ${describeOutcome(ready.value)}\n${kpng.stderr.slice(-3000)}`);
    return kpng;
  }

  async close(): Promise<void> {
    try {
      await this.lab.close();
    } finally {
      rmSync(this.dir, { recursive: true, force: true });
    }
  }
}

/** to-ebpf beside to-nft in a lab, with a cgroup and a bpffs of the test's own. */
export interface EbpfLab {
  readonly kl: KpngLab;
  readonly cg: LabCgroup;
  readonly backend: EbpfNftBackend;
  /** removes the lab, then the cgroup and bpffs, whatever happened */
  close(): Promise<void>;
}

/** Makes an EbpfLab and readies it (places clients in the cgroup, starts kpng...); on failure removes all and throws. */
export async function createEbpfLab(spec: LabSpec, objects: Obj[], config: Obj, ready: (lab: EbpfLab) => Promise<void>): Promise<EbpfLab> {
  const cg = LabCgroup.create(spec.tag);
  const backend: EbpfNftBackend = { name: 'ebpf+nft', cgroupPath: cg.path, bpffs: join(cg.bpffs, 'kpng') };
  let kl: KpngLab | undefined;
  const close = async () => {
    try {
      await kl?.close();
    } finally {
      cg.close();
    }
  };
  try {
    kl = await KpngLab.create(backend, spec, objects, config);
    const lab = { kl, cg, backend, close };
    await ready(lab);
    return lab;
  } catch (e) {
    await close();
    throw e;
  }
}

/** Starts to-ebpf's kpng again (debug log) and says what it found pinned when it loaded: maps and links adopted, programs attached anew. */
export async function restartEbpf(kl: KpngLab): Promise<{ k: KpngProcess; loaded: { adoptedMaps: number; adoptedLinks: number; attached: number } }> {
  const k = kl.start({ pre: ['--log-level', 'debug'] });
  await k.until('to-ebpf loaded', () => /eBPF programs loaded/.test(k.stdout + k.stderr));
  const line = (k.stdout + k.stderr).split('\n').find((l) => l.includes('eBPF programs loaded'))!;
  const n = (field: string) => Number(new RegExp(`${field}=(\\d+)`).exec(line)?.[1] ?? NaN);
  return { k, loaded: { adoptedMaps: n('adoptedMaps'), adoptedLinks: n('adoptedLinks'), attached: n('attached') } };
}

/** Applies objects once (kpng --once, this backend) in a lab; throws with kpng's stderr on failure (or after timeoutMs). */
export async function applyOnce(backend: LabBackend, lab: Lab, objects: Obj[], config: Obj, timeoutMs = 60_000): Promise<number> {
  const dir = mkdtempSync(join(tmpdir(), 'kpng-lab-'));
  try {
    writeFileSync(join(dir, 'state.json'), JSON.stringify(list(objects)));
    writeFileSync(join(dir, 'config.json'), JSON.stringify(config));
    const t0 = Date.now();
    const r = await lab.runKpng(kpngArgs(backend, join(dir, 'state.json'), lab.nodeName, join(dir, 'config.json'), { once: true }), timeoutMs);
    if (r.code !== 0) throw new Error(`kpng --once failed (${r.signal ? `killed by ${r.signal}` : `status ${r.code}`}):\n${r.stderr.slice(-4000)}`);
    return Date.now() - t0;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** The endpoints (ip:port) that answered, sorted and distinct. */
export function answeredBy(outcomes: Outcome[]): string[] {
  return [...new Set(outcomes.map((o) => (o.kind === 'answered' ? o.local : o.kind.toUpperCase())))].sort();
}
