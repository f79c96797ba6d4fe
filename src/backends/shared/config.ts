// kube-proxy's configuration file (KubeProxyConfiguration,
// kubeproxy.config.k8s.io/v1alpha1) and its matching flags. Unknown or
// invalid fields are refused with their path instead of being silently
// ignored (upstream #98302). Flags given on the command line override the file.
import { readFileSync } from 'node:fs';
import { Option, type Command } from 'commander';
import { yaml } from '../../runtime/lazy.js';
import { canonicalIP, parseCIDR, formatCIDR } from '../../api/ip.js';
import { parseBindAddress } from '../../runtime/health.js';
import { ConfigError } from '../../runtime/errors.js';

export type DetectLocalMode = 'ClusterCIDR' | 'NodeCIDR' | 'BridgeInterface' | 'InterfaceNamePrefix';

export interface SyncPeriods {
  syncPeriodMs: number;
  minSyncPeriodMs: number;
}

export interface KubeProxyConfiguration {
  featureGates: Record<string, boolean>;
  clientConnection: { kubeconfig: string; acceptContentTypes: string; contentType: string; qps: number; burst: number };
  hostnameOverride: string;
  bindAddress: string;
  healthzBindAddress: string;
  metricsBindAddress: string;
  bindAddressHardFail: boolean;
  enableProfiling: boolean;
  showHiddenMetricsForVersion: string;
  mode: string;
  iptables: SyncPeriods & { masqueradeBit: number; masqueradeAll: boolean; localhostNodePorts: boolean };
  ipvs: SyncPeriods & { scheduler: string; excludeCIDRs: string[]; strictARP: boolean; tcpTimeoutMs: number; tcpFinTimeoutMs: number; udpTimeoutMs: number };
  nftables: SyncPeriods & { masqueradeBit: number; masqueradeAll: boolean };
  detectLocalMode: DetectLocalMode;
  detectLocal: { bridgeInterface: string; interfaceNamePrefix: string };
  /** parsed from the comma-separated clusterCIDR */
  clusterCIDRs: string[];
  /** CIDRs and/or the keywords "primary", "all", "localhost"; [] = unset */
  nodePortAddresses: string[];
  oomScoreAdj: number;
  conntrack: {
    maxPerCore: number;
    min: number;
    tcpEstablishedTimeoutMs: number;
    tcpCloseWaitTimeoutMs: number;
    tcpBeLiberal: boolean;
    udpTimeoutMs: number;
    udpStreamTimeoutMs: number;
  };
  configSyncPeriodMs: number;
  portRange: string;
  /** the userspace proxy's UDP session idle timeout (kube-proxy's udpIdleTimeout, default 250ms) */
  udpIdleTimeoutMs: number;
  /** kpng: only Services labelled service.kubernetes.io/service-proxy-name=<this> */
  serviceProxyName: string;
}

export function defaultConfig(): KubeProxyConfiguration {
  return {
    featureGates: {},
    clientConnection: { kubeconfig: '', acceptContentTypes: '', contentType: 'application/vnd.kubernetes.protobuf', qps: 5, burst: 10 },
    hostnameOverride: '',
    bindAddress: '0.0.0.0',
    healthzBindAddress: '0.0.0.0:10256',
    metricsBindAddress: '127.0.0.1:10249',
    bindAddressHardFail: false,
    enableProfiling: false,
    showHiddenMetricsForVersion: '',
    mode: '',
    iptables: { masqueradeBit: 14, masqueradeAll: false, localhostNodePorts: true, syncPeriodMs: 30_000, minSyncPeriodMs: 1_000 },
    ipvs: { scheduler: '', excludeCIDRs: [], strictARP: false, tcpTimeoutMs: 0, tcpFinTimeoutMs: 0, udpTimeoutMs: 0, syncPeriodMs: 30_000, minSyncPeriodMs: 0 },
    nftables: { masqueradeBit: 14, masqueradeAll: false, syncPeriodMs: 30_000, minSyncPeriodMs: 1_000 },
    detectLocalMode: 'ClusterCIDR',
    detectLocal: { bridgeInterface: '', interfaceNamePrefix: '' },
    clusterCIDRs: [],
    nodePortAddresses: [],
    oomScoreAdj: -999,
    conntrack: {
      maxPerCore: 32768,
      min: 131072,
      tcpEstablishedTimeoutMs: 24 * 3600_000,
      tcpCloseWaitTimeoutMs: 3600_000,
      tcpBeLiberal: false,
      udpTimeoutMs: 0,
      udpStreamTimeoutMs: 0,
    },
    configSyncPeriodMs: 15 * 60_000,
    portRange: '',
    udpIdleTimeoutMs: 250,
    serviceProxyName: '',
  };
}

/** Go duration ("30s", "1h0m0s", "500ms", "-1s") to milliseconds. */
export function parseDuration(s: string, field: string): number {
  const t = s.trim();
  const sign = t.startsWith('-') ? -1 : 1;
  const body = t.replace(/^[-+]/, '');
  if (body === '0') return 0;
  const re = /(\d+(?:\.\d+)?)(ns|us|µs|μs|ms|s|m|h)/gy;
  let total = 0;
  let matched = 0;
  let m: RegExpExecArray | null;
  while ((m = re.exec(body))) {
    const n = Number(m[1]);
    total += n * { ns: 1e-6, us: 1e-3, µs: 1e-3, μs: 1e-3, ms: 1, s: 1000, m: 60_000, h: 3_600_000 }[m[2] as 'ms'];
    matched = re.lastIndex;
  }
  if (!body || matched !== body.length) throw new ConfigError(field, `${JSON.stringify(s)} is not a duration (like "30s" or "1h0m0s")`);
  return sign * total;
}

type Obj = Record<string, unknown>;
type FieldReader = (v: unknown, field: string) => void;

/** Reads a YAML or JSON KubeProxyConfiguration file. Throws ConfigError. */
export function loadConfigFile(path: string, base = defaultConfig()): KubeProxyConfiguration {
  let doc: unknown;
  try {
    doc = yaml().parse(readFileSync(path, 'utf8'));
  } catch (e) {
    throw new ConfigError(path, `cannot read: ${(e as Error).message}`);
  }
  return parseConfig(doc, base);
}

export function parseConfig(doc: unknown, base = defaultConfig()): KubeProxyConfiguration {
  const c = structuredClone(base);
  if (!isObj(doc)) throw new ConfigError('(document)', 'must be a KubeProxyConfiguration object');
  if (doc.kind !== undefined && doc.kind !== 'KubeProxyConfiguration') throw new ConfigError('kind', `must be KubeProxyConfiguration, not ${JSON.stringify(doc.kind)}`);
  if (doc.apiVersion !== undefined && doc.apiVersion !== 'kubeproxy.config.k8s.io/v1alpha1') {
    throw new ConfigError('apiVersion', `must be kubeproxy.config.k8s.io/v1alpha1, not ${JSON.stringify(doc.apiVersion)}`);
  }
  const str = (set: (v: string) => void): FieldReader => (v, f) => set(asString(v, f));
  const boolean = (set: (v: boolean) => void): FieldReader => (v, f) => {
    if (typeof v !== 'boolean') throw new ConfigError(f, `must be true or false, not ${JSON.stringify(v)}`);
    set(v);
  };
  const integer = (set: (v: number) => void, min = -Infinity, max = Infinity): FieldReader => (v, f) => {
    if (typeof v !== 'number' || !Number.isInteger(v)) throw new ConfigError(f, `must be an integer, not ${JSON.stringify(v)}`);
    if (v < min || v > max) throw new ConfigError(f, `${v} is out of range (${min}-${max})`);
    set(v);
  };
  const number = (set: (v: number) => void): FieldReader => (v, f) => {
    if (typeof v !== 'number') throw new ConfigError(f, `must be a number, not ${JSON.stringify(v)}`);
    set(v);
  };
  // no duration kube-proxy reads may be negative (upstream's validation)
  const duration = (set: (ms: number) => void): FieldReader => (v, f) => set(nonNegative(parseDuration(asString(v, f), f), f));
  const strings = (set: (v: string[]) => void): FieldReader => (v, f) => {
    if (v === null) return set([]);
    if (!Array.isArray(v)) throw new ConfigError(f, `must be a list of strings, not ${JSON.stringify(v)}`);
    set(v.map((x, i) => asString(x, `${f}[${i}]`)));
  };
  const any: FieldReader = () => {};
  const section = (fields: Record<string, FieldReader>): FieldReader => (v, f) => readObject(v, f, fields);

  readObject(doc, '', {
    apiVersion: any,
    kind: any,
    featureGates: (v, f) => {
      for (const [k, x] of Object.entries(asObj(v, f))) {
        if (typeof x !== 'boolean') throw new ConfigError(`${f}.${k}`, `must be true or false, not ${JSON.stringify(x)}`);
        c.featureGates[k] = x;
      }
    },
    clientConnection: section({
      kubeconfig: str((v) => (c.clientConnection.kubeconfig = v)),
      acceptContentTypes: str((v) => (c.clientConnection.acceptContentTypes = v)),
      contentType: str((v) => (c.clientConnection.contentType = v)),
      qps: number((v) => (c.clientConnection.qps = v)),
      burst: integer((v) => (c.clientConnection.burst = v), 0),
    }),
    logging: any,
    hostnameOverride: str((v) => (c.hostnameOverride = v.trim())),
    bindAddress: str((v) => (c.bindAddress = v)),
    healthzBindAddress: str((v) => (c.healthzBindAddress = v)),
    metricsBindAddress: str((v) => (c.metricsBindAddress = v)),
    bindAddressHardFail: boolean((v) => (c.bindAddressHardFail = v)),
    enableProfiling: boolean((v) => (c.enableProfiling = v)),
    showHiddenMetricsForVersion: str((v) => (c.showHiddenMetricsForVersion = v)),
    mode: (v, f) => {
      const m = asString(v, f);
      if (!['', 'iptables', 'ipvs', 'nftables', 'kernelspace', 'userspace'].includes(m)) throw new ConfigError(f, `unknown mode ${JSON.stringify(m)}`);
      c.mode = m;
    },
    iptables: section({
      masqueradeBit: integer((v) => (c.iptables.masqueradeBit = v), 0, 31),
      masqueradeAll: boolean((v) => (c.iptables.masqueradeAll = v)),
      localhostNodePorts: boolean((v) => (c.iptables.localhostNodePorts = v)),
      syncPeriod: duration((v) => (c.iptables.syncPeriodMs = v)),
      minSyncPeriod: duration((v) => (c.iptables.minSyncPeriodMs = v)),
    }),
    ipvs: section({
      syncPeriod: duration((v) => (c.ipvs.syncPeriodMs = v)),
      minSyncPeriod: duration((v) => (c.ipvs.minSyncPeriodMs = v)),
      scheduler: str((v) => (c.ipvs.scheduler = v)),
      excludeCIDRs: strings((v) => (c.ipvs.excludeCIDRs = v)),
      strictARP: boolean((v) => (c.ipvs.strictARP = v)),
      tcpTimeout: duration((v) => (c.ipvs.tcpTimeoutMs = v)),
      tcpFinTimeout: duration((v) => (c.ipvs.tcpFinTimeoutMs = v)),
      udpTimeout: duration((v) => (c.ipvs.udpTimeoutMs = v)),
    }),
    nftables: section({
      masqueradeBit: integer((v) => (c.nftables.masqueradeBit = v), 0, 31),
      masqueradeAll: boolean((v) => (c.nftables.masqueradeAll = v)),
      syncPeriod: duration((v) => (c.nftables.syncPeriodMs = v)),
      minSyncPeriod: duration((v) => (c.nftables.minSyncPeriodMs = v)),
    }),
    winkernel: any,
    windowsRunAsService: boolean(() => {}),
    detectLocalMode: (v, f) => {
      const m = asString(v, f);
      if (m === '') return;
      if (!['ClusterCIDR', 'NodeCIDR', 'BridgeInterface', 'InterfaceNamePrefix'].includes(m)) throw new ConfigError(f, `unknown mode ${JSON.stringify(m)}`);
      c.detectLocalMode = m as DetectLocalMode;
    },
    detectLocal: section({
      bridgeInterface: str((v) => (c.detectLocal.bridgeInterface = v)),
      interfaceNamePrefix: str((v) => (c.detectLocal.interfaceNamePrefix = v)),
    }),
    clusterCIDR: (v, f) => (c.clusterCIDRs = parseCIDRList(asString(v, f), f)),
    nodePortAddresses: strings((v) => (c.nodePortAddresses = v.map((a, i) => checkNodePortAddress(a, `nodePortAddresses[${i}]`)))),
    oomScoreAdj: (v, f) => {
      if (v === null) return;
      integer((x) => (c.oomScoreAdj = x), -1000, 1000)(v, f);
    },
    conntrack: section({
      maxPerCore: (v, f) => v !== null && integer((x) => (c.conntrack.maxPerCore = x), 0)(v, f),
      min: (v, f) => v !== null && integer((x) => (c.conntrack.min = x), 0)(v, f),
      tcpEstablishedTimeout: (v, f) => v !== null && duration((x) => (c.conntrack.tcpEstablishedTimeoutMs = x))(v, f),
      tcpCloseWaitTimeout: (v, f) => v !== null && duration((x) => (c.conntrack.tcpCloseWaitTimeoutMs = x))(v, f),
      tcpBeLiberal: boolean((v) => (c.conntrack.tcpBeLiberal = v)),
      udpTimeout: duration((v) => (c.conntrack.udpTimeoutMs = v)),
      udpStreamTimeout: duration((v) => (c.conntrack.udpStreamTimeoutMs = v)),
    }),
    configSyncPeriod: duration((v) => (c.configSyncPeriodMs = v)),
    portRange: str((v) => (c.portRange = v)),
    udpIdleTimeout: duration((v) => (c.udpIdleTimeoutMs = v)),
    serviceProxyName: str((v) => (c.serviceProxyName = v)),
  });
  validate(c);
  return c;
}

/** The sections whose periods drive a backend's sync loop. */
const SYNC_SECTIONS = ['iptables', 'ipvs', 'nftables'] as const;

/**
 * What kube-proxy's validation refuses, among the fields kpng reads, each
 * refusal naming its field (or, through `names`, the flag that set it).
 */
function validate(c: KubeProxyConfiguration, names: Readonly<Record<string, string>> = {}) {
  const name = (f: string) => names[f] ?? f;
  if (c.detectLocalMode === 'BridgeInterface' && !c.detectLocal.bridgeInterface) {
    throw new ConfigError(name('detectLocal.bridgeInterface'), 'required with detectLocalMode BridgeInterface');
  }
  if (c.detectLocalMode === 'InterfaceNamePrefix' && !c.detectLocal.interfaceNamePrefix) {
    throw new ConfigError(name('detectLocal.interfaceNamePrefix'), 'required with detectLocalMode InterfaceNamePrefix');
  }
  const fams = c.clusterCIDRs.map((x) => (x.includes(':') ? 6 : 4));
  if (new Set(fams).size !== fams.length) throw new ConfigError(name('clusterCIDR'), 'at most one CIDR per IP family');
  // a period of 0 is a sync loop that never rests; minSyncPeriod above syncPeriod, one that never drifts back
  for (const s of SYNC_SECTIONS) {
    const p = c[s];
    const sync = name(`${s}.syncPeriod`);
    const min = name(`${s}.minSyncPeriod`);
    positive(p.syncPeriodMs, sync);
    nonNegative(p.minSyncPeriodMs, min);
    if (p.minSyncPeriodMs > p.syncPeriodMs) throw new ConfigError(sync, `${formatDuration(p.syncPeriodMs)} must be greater than or equal to ${min} (${formatDuration(p.minSyncPeriodMs)})`);
  }
  c.ipvs.excludeCIDRs.forEach((x, i) => {
    if (!parseCIDR(x)) throw new ConfigError(name(`ipvs.excludeCIDRs[${i}]`), `${JSON.stringify(x)} is not a CIDR`);
  });
  positive(c.udpIdleTimeoutMs, name('udpIdleTimeout'));
  positive(c.configSyncPeriodMs, name('configSyncPeriod'));
  checkBindAddress(c.healthzBindAddress, name('healthzBindAddress'));
  checkBindAddress(c.metricsBindAddress, name('metricsBindAddress'));
}

function positive(ms: number, field: string): void {
  if (!(ms > 0)) throw new ConfigError(field, `${formatDuration(ms)} must be greater than 0`);
}

function nonNegative(ms: number, field: string): number {
  if (ms < 0) throw new ConfigError(field, `${formatDuration(ms)} must be greater than or equal to 0`);
  return ms;
}

/** milliseconds as a Go duration, for messages: 30s, 250ms, 1ns */
function formatDuration(ms: number): string {
  if (ms === 0) return '0s';
  if (Math.abs(ms) >= 1000) return `${ms / 1000}s`;
  if (Math.abs(ms) >= 1) return `${ms}ms`;
  return `${Math.round(ms * 1e6)}ns`;
}

/** "IP:port" ("[IPv6]:port"; an empty host is every address), or '' (not served) */
function checkBindAddress(addr: string, field: string): void {
  if (addr === '') return;
  let a: { host: string; port: number };
  try {
    a = parseBindAddress(addr)!;
  } catch {
    throw new ConfigError(field, `${JSON.stringify(addr)} is not IP:port`);
  }
  const { host, port } = a;
  if (!canonicalIP(host)) throw new ConfigError(field, `${JSON.stringify(host)} is not an IP address`);
  if (!(port >= 1 && port <= 65535)) throw new ConfigError(field, `${port} is not a port (1-65535)`);
}

function parseCIDRList(s: string, field: string): string[] {
  return s
    .split(',')
    .map((x) => x.trim())
    .filter(Boolean)
    .map((x) => {
      const cidr = parseCIDR(x);
      if (!cidr) throw new ConfigError(field, `${JSON.stringify(x)} is not a CIDR`);
      return formatCIDR(cidr);
    });
}

function checkNodePortAddress(a: string, field: string): string {
  const t = a.trim();
  if (t === 'primary' || t === 'all' || t === 'localhost') return t;
  const cidr = parseCIDR(t);
  if (!cidr) throw new ConfigError(field, `${JSON.stringify(a)} is not a CIDR or one of primary, all, localhost`);
  return formatCIDR(cidr);
}

function isObj(v: unknown): v is Obj {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function asObj(v: unknown, f: string): Obj {
  if (v === null || v === undefined) return {};
  if (!isObj(v)) throw new ConfigError(f, `must be an object, not ${JSON.stringify(v)}`);
  return v;
}

function asString(v: unknown, f: string): string {
  if (v === null) return '';
  if (typeof v !== 'string') throw new ConfigError(f, `must be a string, not ${JSON.stringify(v)}`);
  return v;
}

function readObject(v: unknown, prefix: string, fields: Record<string, FieldReader>) {
  const o = asObj(v, prefix || '(document)');
  for (const [k, x] of Object.entries(o)) {
    const f = prefix ? `${prefix}.${k}` : k;
    const reader = fields[k];
    if (!reader) throw new ConfigError(f, 'unknown field');
    if (x === undefined) continue;
    reader(x, f);
  }
}

// --- flags: kube-proxy's names, for what kpng's backends use

export function addConfigFlags(cmd: Command): void {
  cmd
    .option('--config <file>', "kube-proxy's configuration file (KubeProxyConfiguration, YAML or JSON)")
    .option('--hostname-override <name>', 'node name to use instead of the hostname')
    .option('--cluster-cidr <cidrs>', 'pod CIDRs, comma-separated (for --detect-local-mode ClusterCIDR)')
    .addOption(new Option('--detect-local-mode <mode>', 'how to tell pod traffic').choices(['ClusterCIDR', 'NodeCIDR', 'BridgeInterface', 'InterfaceNamePrefix']))
    .option('--pod-bridge-interface <name>', 'bridge of the pods (--detect-local-mode BridgeInterface)')
    .option('--pod-interface-name-prefix <prefix>', 'interface name prefix of the pods (--detect-local-mode InterfaceNamePrefix)')
    .option('--nodeport-addresses <list>', 'CIDRs, or primary/all, where NodePorts are served (comma-separated)')
    .option('--masquerade-all', 'masquerade all traffic to cluster IPs')
    .option('--healthz-bind-address <addr>', 'address:port of /healthz, /readyz and /livez')
    .option('--metrics-bind-address <addr>', 'address:port of /metrics')
    .option('--conntrack-tcp-be-liberal', 'set nf_conntrack_tcp_be_liberal')
    .option('--min-sync-period <duration>', 'minimum time between two syncs (e.g. 1s)')
    .option('--sync-period <duration>', 'retry period after a failed sync (e.g. 30s)');
}

/** Defaults, then the --config file, then the flags that were given. */
export function configFromFlags(opts: Record<string, any>): KubeProxyConfiguration {
  const c = opts.config ? loadConfigFile(String(opts.config)) : defaultConfig();
  if (opts.hostnameOverride !== undefined) c.hostnameOverride = String(opts.hostnameOverride).trim();
  if (opts.clusterCidr !== undefined) c.clusterCIDRs = parseCIDRList(String(opts.clusterCidr), '--cluster-cidr');
  if (opts.detectLocalMode !== undefined) c.detectLocalMode = opts.detectLocalMode;
  if (opts.podBridgeInterface !== undefined) c.detectLocal.bridgeInterface = String(opts.podBridgeInterface);
  if (opts.podInterfaceNamePrefix !== undefined) c.detectLocal.interfaceNamePrefix = String(opts.podInterfaceNamePrefix);
  if (opts.nodeportAddresses !== undefined) {
    c.nodePortAddresses = String(opts.nodeportAddresses)
      .split(',')
      .map((x) => x.trim())
      .filter(Boolean)
      .map((a) => checkNodePortAddress(a, '--nodeport-addresses'));
  }
  if (opts.masqueradeAll) c.iptables.masqueradeAll = c.nftables.masqueradeAll = true;
  if (opts.healthzBindAddress !== undefined) c.healthzBindAddress = String(opts.healthzBindAddress);
  if (opts.metricsBindAddress !== undefined) c.metricsBindAddress = String(opts.metricsBindAddress);
  if (opts.conntrackTcpBeLiberal) c.conntrack.tcpBeLiberal = true;
  // the flags set the iptables and nftables sections (ipvs keeps its own)
  const names: Record<string, string> = {};
  if (opts.minSyncPeriod !== undefined) {
    c.nftables.minSyncPeriodMs = c.iptables.minSyncPeriodMs = parseDuration(String(opts.minSyncPeriod), '--min-sync-period');
    names['nftables.minSyncPeriod'] = names['iptables.minSyncPeriod'] = '--min-sync-period';
  }
  if (opts.syncPeriod !== undefined) {
    c.nftables.syncPeriodMs = c.iptables.syncPeriodMs = parseDuration(String(opts.syncPeriod), '--sync-period');
    names['nftables.syncPeriod'] = names['iptables.syncPeriod'] = '--sync-period';
  }
  if (opts.healthzBindAddress !== undefined) names.healthzBindAddress = '--healthz-bind-address';
  if (opts.metricsBindAddress !== undefined) names.metricsBindAddress = '--metrics-bind-address';
  validate(c, names);
  return c;
}
