// kpng in a lab: state files, the KubeProxyConfiguration, running to-nft in
// the node's namespace (once, or following a state directory the test
// rewrites), and bounded polling on real traffic.
import { mkdirSync, mkdtempSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Lab, labUnsupported, poll, type LabSpec, type KpngProcess, type Outcome } from '../../src/lab/index.js';

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

/** Why lab tests of to-nft cannot run here, or undefined. */
export async function nftLabUnsupported(): Promise<string | undefined> {
  const why = labUnsupported();
  if (why) return why;
  const c = await kpngCapabilities();
  if (c.error) return `kpng's command line does not load: ${c.error}`;
  if (!c.backends.includes('nft')) return 'the to-nft backend is not available in this checkout yet (kpng file to-local has no to-nft)';
  return undefined;
}

/**
 * `kpng file --input STATE --node-name NODE to-local to-nft --config CONFIG [--once]`.
 * (While the file source has no --node-name, the flag goes to to-nft, which
 * has it; known once nftLabUnsupported or kpngCapabilities ran.)
 */
export function nftArgs(state: string, node: string, config: string, opts: { once?: boolean; extra?: string[] } = {}): string[] {
  const tail = ['--config', config, ...(opts.once ? ['--once'] : []), ...(opts.extra ?? [])];
  return caps?.fileNodeName
    ? ['file', '--input', state, '--node-name', node, 'to-local', 'to-nft', ...tail]
    : ['file', '--input', state, 'to-local', 'to-nft', '--node-name', node, ...tail];
}

export function list(items: Obj[]): Obj {
  return { apiVersion: 'v1', kind: 'List', metadata: { resourceVersion: '' }, items };
}

export function kubeProxyConfig(
  c: { mode?: 'nftables' | 'iptables'; clusterCIDR?: string; nodePortAddresses?: string[]; masqueradeAll?: boolean; minSyncPeriod?: string; localhostNodePorts?: boolean } = {},
): Obj {
  const mode = c.mode ?? 'nftables';
  return {
    apiVersion: 'kubeproxy.config.k8s.io/v1alpha1',
    kind: 'KubeProxyConfiguration',
    mode,
    clusterCIDR: c.clusterCIDR ?? '',
    detectLocalMode: 'ClusterCIDR',
    ...(c.nodePortAddresses?.length ? { nodePortAddresses: c.nodePortAddresses } : {}),
    [mode]: {
      masqueradeAll: c.masqueradeAll ?? false,
      masqueradeBit: 14,
      ...(c.minSyncPeriod ? { minSyncPeriod: c.minSyncPeriod } : {}),
      ...(mode === 'iptables' && c.localhostNodePorts !== undefined ? { localhostNodePorts: c.localhostNodePorts } : {}),
    },
  };
}

/** Polls fn until ok(result) or the deadline; returns the last result (check it). */
export function pollUntil<T>(fn: () => Promise<T>, ok: (t: T) => boolean, timeoutMs = 15_000, everyMs = 100): Promise<{ value: T; ok: boolean; ms: number }> {
  return poll(fn, ok, { timeoutMs, everyMs });
}

/** A lab with kpng (to-nft) following a state directory. */
export class KpngLab {
  kpng?: KpngProcess;
  private constructor(
    readonly lab: Lab,
    readonly dir: string,
    readonly statePath: string,
    readonly configPath: string,
  ) {}

  static async create(spec: LabSpec, objects: Obj[], config: Obj): Promise<KpngLab> {
    const dir = mkdtempSync(join(tmpdir(), 'kpng-lab-'));
    const stateDir = join(dir, 'state');
    const configPath = join(dir, 'config.json');
    writeFileSync(configPath, JSON.stringify(config, null, 2));
    let lab: Lab | undefined;
    try {
      lab = await Lab.create(spec);
      const kl = new KpngLab(lab, dir, stateDir, configPath);
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

  /** Starts kpng following the state directory. */
  start(extra: string[] = []): KpngProcess {
    this.kpng = this.lab.startKpng(nftArgs(this.statePath, this.lab.nodeName, this.configPath, { extra }));
    return this.kpng;
  }

  async close(): Promise<void> {
    try {
      await this.lab.close();
    } finally {
      rmSync(this.dir, { recursive: true, force: true });
    }
  }
}

/** Applies objects once (kpng --once) in a lab; throws with kpng's stderr on failure. */
export async function applyOnce(lab: Lab, objects: Obj[], config: Obj): Promise<number> {
  const dir = mkdtempSync(join(tmpdir(), 'kpng-lab-'));
  try {
    writeFileSync(join(dir, 'state.json'), JSON.stringify(list(objects)));
    writeFileSync(join(dir, 'config.json'), JSON.stringify(config));
    const t0 = Date.now();
    const r = await lab.runKpng(nftArgs(join(dir, 'state.json'), lab.nodeName, join(dir, 'config.json'), { once: true }));
    if (r.code !== 0) throw new Error(`kpng --once failed (${r.code}):\n${r.stderr.slice(-4000)}`);
    return Date.now() - t0;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** The endpoints (ip:port) that answered, sorted and distinct. */
export function answeredBy(outcomes: Outcome[]): string[] {
  return [...new Set(outcomes.map((o) => (o.kind === 'answered' ? o.local : o.kind.toUpperCase())))].sort();
}
