// The iptables backend in tests: a proxier fed by a store through the real
// diff stream (dry run, or against iptables inside a throwaway namespace),
// iptables-save in that namespace. (The lab's to-iptables command line and
// skips are with the other backends' in lab-kpng.ts.)
import { spawnSync } from 'node:child_process';
import { pino } from 'pino';
import { LocalSet } from '../../src/api/model.js';
import type { Family } from '../../src/api/ip.js';
import { IptablesProxier } from '../../src/backends/iptables/proxier.js';
import { parseSave, toolName, type IptablesMode, type SavedTable } from '../../src/backends/iptables/iptables.js';
import type { KubeProxyConfiguration } from '../../src/backends/shared/config.js';
import type { Store } from '../../src/store/store.js';
import type { TestNetns } from './netns.js';
import { skipOrFailInCI } from './ci.js';
import { node, service, slice } from './k8s.js';
import { driveProxier, printed, testConfig } from './proxier-harness.js';
import { ConntrackNetlink } from '../../src/kernel/conntrack.js';

export const MODES: readonly IptablesMode[] = ['nft', 'legacy'];

/** Why iptables (this mode) cannot be used in a namespace here, or undefined. */
export function iptablesUnsupported(mode?: IptablesMode): string | undefined {
  if (process.getuid?.() !== 0) return skipOrFailInCI('needs root (network namespaces)');
  for (const tool of ['ip', 'sysctl', ...(mode ? [toolName(4, mode, 'restore'), toolName(6, mode, 'save')] : ['iptables-nft-restore', 'iptables-legacy-restore'])]) {
    if (spawnSync('which', [tool]).status !== 0) return skipOrFailInCI(`needs ${tool} (apt-get install ${tool === 'sysctl' ? 'procps' : 'iptables'})`);
  }
  return undefined;
}

export interface Harness {
  readonly proxier: IptablesProxier;
  /** what the last sync printed (dry run) */
  readonly out: string[];
  /** sends the pending ops; returns the dry-run output */
  sync(): Promise<string>;
  /** a new kpng process: fresh memory, same kernel */
  restart(): void;
}

/** A proxier fed by a store through the real diff stream; with ns, against iptables in that namespace. */
export function harness(store: Store, opts: { ns?: TestNetns; mode?: IptablesMode; config?: KubeProxyConfiguration; families?: Family[]; node?: string; interfaces?: string[] } = {}): Harness {
  const { out, sink } = printed();
  const node = opts.node ?? 'n1';
  const make = () =>
    new IptablesProxier({
      nodeName: node,
      config: opts.config ?? testConfig(),
      log: pino({ level: 'silent' }),
      dryRun: !opts.ns,
      once: true,
      out: sink,
      mode: opts.mode ?? 'nft',
      tool: opts.ns ? (t) => opts.ns!.wrapper(t) : undefined,
      conntrack: opts.ns ? new ConntrackNetlink(opts.ns.name) : false,
      healthChecks: false,
      families: opts.families,
      interfaceAddresses: opts.interfaces ? () => opts.interfaces! : undefined,
    });
  return Object.assign(driveProxier(store, make, { nodeName: node, sets: [LocalSet.NodesSet], printed: out }), { out });
}

/** iptables-save in a namespace, parsed: table -> chain -> rules */
export function saveIn(ns: TestNetns, family: Family, mode: IptablesMode): Map<string, SavedTable> {
  return parseSave(ns.exec(toolName(family, mode, 'save'), []));
}

/** The chains of one table (kube's only), as "chain: rules" lines sorted by chain: comparable across runs. */
export function kubeChains(t: SavedTable | undefined): Record<string, string[]> {
  const out: Record<string, string[]> = {};
  for (const [name, rules] of [...(t?.chains ?? new Map<string, string[]>())].sort(([a], [b]) => (a < b ? -1 : 1))) {
    if (name.startsWith('KUBE-')) out[name] = rules;
  }
  return out;
}

/** The Services and EndpointSlices of upstream TestOverallIPTablesRules. */
export const overall = () => [
  node('test-node', undefined, ['192.168.0.2']),
  service('ns1', 'svc1', { clusterIP: '172.30.0.41', ports: [{ name: 'p80', port: 80, protocol: 'TCP' }] }),
  slice('ns1', 'svc1-1', 'svc1', [{ ip: '10.180.0.1' }], [{ name: 'p80', port: 80 }]),
  service(
    'ns2',
    'svc2',
    { type: 'LoadBalancer', externalTrafficPolicy: 'Local', clusterIP: '172.30.0.42', ports: [{ name: 'p80', port: 80, protocol: 'TCP', nodePort: 3001 }], externalIPs: ['192.168.99.22'], healthCheckNodePort: 30000 },
    { status: { loadBalancer: { ingress: [{ ip: '1.2.3.4' }] } } },
  ),
  // no nodeName: not local, so eTP=Local has no local endpoint
  slice('ns2', 'svc2-1', 'svc2', [{ ip: '10.180.0.2' }], [{ name: 'p80', port: 80 }]),
  service('ns3', 'svc3', { type: 'NodePort', clusterIP: '172.30.0.43', ports: [{ name: 'p80', port: 80, protocol: 'TCP', nodePort: 3003 }] }),
  slice('ns3', 'svc3-1', 'svc3', [{ ip: '10.180.0.3' }], [{ name: 'p80', port: 80 }]),
  service('ns4', 'svc4', { type: 'NodePort', clusterIP: '172.30.0.44', externalIPs: ['192.168.99.33'], ports: [{ name: 'p80', port: 80, protocol: 'TCP', targetPort: 80 }] }),
  slice('ns4', 'svc4-1', 'svc4', [{ ip: '10.180.0.4' }, { ip: '10.180.0.5', node: 'test-node' }], [{ name: 'p80', port: 80 }]),
  service(
    'ns5',
    'svc5',
    {
      type: 'LoadBalancer',
      externalTrafficPolicy: 'Cluster',
      clusterIP: '172.30.0.45',
      ports: [{ name: 'p80', port: 80, protocol: 'TCP', nodePort: 3002 }],
      healthCheckNodePort: 30000,
      loadBalancerSourceRanges: [' 203.0.113.0/25'],
      sessionAffinity: 'ClientIP',
      sessionAffinityConfig: { clientIP: { timeoutSeconds: 10800 } },
    },
    { status: { loadBalancer: { ingress: [{ ip: '5.6.7.8' }] } } },
  ),
  slice('ns5', 'svc5-1', 'svc5', [{ ip: '10.180.0.3' }], [{ name: 'p80', port: 80 }]),
  service('ns6', 'svc6', { clusterIP: '172.30.0.46', ports: [{ name: 'p80', port: 80, protocol: 'TCP', targetPort: 80 }] }),
];

