// Drift repair as kpng runs it (not --once): a proxier that checks its
// dataplane every syncPeriod, in a test's network namespace, fed by a store
// through the real diff stream; the one Service the drift tests change from
// outside; and a foreign writer whose pid, in a pid namespace of its own, is
// one the test chooses.
import { spawnSync } from 'node:child_process';
import type { Logger } from 'pino';
import { NftProxier } from '../../src/backends/nft/proxier.js';
import { IptablesProxier } from '../../src/backends/iptables/proxier.js';
import type { IptablesMode } from '../../src/backends/iptables/iptables.js';
import { defaultConfig } from '../../src/backends/shared/config.js';
import type { SyncResult } from '../../src/backends/shared/runner.js';
import type { Store } from '../../src/store/store.js';
import { LocalSet } from '../../src/api/model.js';
import { driveProxier } from './proxier-harness.js';
import { node, service, slice } from './k8s.js';
import { ConntrackNetlink } from '../../src/kernel/conntrack.js';

export const VIP = '172.30.0.10';
export const ENDPOINT = '10.1.0.1';

/** node n1, Service ns/web (VIP:80/TCP) with one endpoint on n1 */
export const driftCluster = () => [node('n1', undefined, ['192.168.0.2']), service('ns', 'web', { clusterIP: VIP }), slice('ns', 'web-1', 'web', [{ ip: ENDPOINT, node: 'n1' }])];

/** the nft command (as `nft` arguments) that deletes the Service's element of service-ips */
export const DELETE_SERVICE_IP = ['delete', 'element', 'ip', 'kpng', 'service-ips', `{ ${VIP} . tcp . 80 }`];

export interface WatchingOptions {
  /** the test's network namespace (netlink, the drift watch) */
  readonly netns: string;
  /** tools that run in it */
  readonly tool: (name: string) => string;
  readonly syncPeriodMs: number;
  readonly log: Logger;
  readonly report?: (r: SyncResult) => void;
}

/** to-nft with the drift check every syncPeriod (IPv4 and IPv6 tables) */
export function watchingNft(store: Store, o: WatchingOptions) {
  const config = defaultConfig();
  config.clusterCIDRs = ['10.0.0.0/8'];
  config.nftables = { ...config.nftables, syncPeriodMs: o.syncPeriodMs, minSyncPeriodMs: 0 };
  const proxier = new NftProxier({ nodeName: 'n1', config, log: o.log, nftPath: o.tool('nft'), conntrack: new ConntrackNetlink(o.netns), healthChecks: false, netns: o.netns, report: o.report });
  return driveProxier(store, proxier);
}

/** to-iptables with the drift check every syncPeriod (IPv4) */
export function watchingIptables(store: Store, mode: IptablesMode, o: WatchingOptions) {
  const config = defaultConfig();
  config.clusterCIDRs = ['10.0.0.0/8'];
  config.iptables = { ...config.iptables, syncPeriodMs: o.syncPeriodMs, minSyncPeriodMs: 0 };
  const proxier = new IptablesProxier({ nodeName: 'n1', config, log: o.log, mode, tool: o.tool, conntrack: new ConntrackNetlink(o.netns), healthChecks: false, netns: o.netns, families: [4], report: o.report });
  return driveProxier(store, proxier, { sets: [LocalSet.NodesSet] });
}

/**
 * Runs argv as the process numbered `pid` in a new pid namespace (the pid
 * namespace's last pid set to pid - 1, then one fork): another container's
 * process that happens to have a pid kpng's own pid namespace used.
 * Returns the pid it ran as, and its output.
 */
export function runAsPid(pid: number, argv: string[]): { pid: number; status: number | null; output: string } {
  const quoted = argv.map((a) => `'${a.replace(/'/g, `'\\''`)}'`).join(' ');
  const script = `echo ${pid - 1} > /proc/sys/kernel/ns_last_pid && { ${quoted} & child=$!; wait $child; s=$?; echo "pid $child"; exit $s; }`;
  const r = spawnSync('unshare', ['--pid', '--fork', 'sh', '-c', script], { encoding: 'utf8', timeout: 30_000 });
  const m = /^pid (\d+)$/m.exec(r.stdout);
  return { pid: m ? Number(m[1]) : -1, status: r.status, output: `${r.stdout}${r.stderr}` };
}
