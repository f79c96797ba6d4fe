// to-ebpf: socket-level load balancing with eBPF (cgroup sock_addr programs).
import { addDataplaneFlags, dataplaneOptions, proxierInstance } from '../shared/backend.js';
import { LocalSet } from '../../api/model.js';
import { registerBackend } from '../registry.js';
import { DEFAULT_BPFFS, DEFAULT_MAX_ENDPOINTS, DEFAULT_MAX_SERVICE_PORTS } from './defaults.js';
import type { Datapath } from './datapath.js';

const positive = (flag: string) => (v: string) => {
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1 || n > 16_777_216) throw new Error(`${flag}: a whole number from 1 to 16777216, not ${JSON.stringify(v)}`);
  return n;
};

registerBackend({
  name: 'ebpf',
  description: 'balance every connection made on this node when its socket connects (eBPF cgroup programs); beside to-nft for traffic from outside',
  proxyMode: 'ebpf',
  syncPeriodMs: (c) => c.nftables.syncPeriodMs,
  options(cmd) {
    addDataplaneFlags(cmd, 'nothing (the maps are not written)')
      .option('--cgroup-path <dir>', 'the cgroup v2 directory the programs attach to (default: the cgroup2 root from /proc/mounts)')
      .option('--bpffs <dir>', 'where maps and links are pinned (on a bpf filesystem)', DEFAULT_BPFFS)
      .option('--max-service-ports <n>', 'size of the Service address map', positive('--max-service-ports'), DEFAULT_MAX_SERVICE_PORTS)
      .option('--max-endpoints <n>', 'size of the endpoint map', positive('--max-endpoints'), DEFAULT_MAX_ENDPOINTS);
  },
  // the implementation loads when the backend runs: other commands pay nothing for it
  async create(opts, ctx) {
    const [{ EbpfProxier }, { Datapath, cgroup2Root }, { ebpfMetrics, setCounterSource }] = await Promise.all([import('./proxier.js'), import('./datapath.js'), import('./metrics.js')]);
    const cgroupPath: string | undefined = opts.cgroupPath ?? cgroup2Root();
    if (!cgroupPath) throw new Error('to-ebpf: no cgroup v2 mount in /proc/mounts; give --cgroup-path');
    let datapath: Datapath | undefined;
    const proxier = new EbpfProxier({
      ...dataplaneOptions(opts, ctx),
      // healthCheckNodePorts answer load balancers outside the node: the backend beside (to-nft) serves them
      healthChecks: false,
      // opened at the first sync: a failure there is a failed sync, retried, not a crash
      maps: () => {
        datapath ??= Datapath.open({ bpffs: opts.bpffs, cgroupPath, maxServicePorts: opts.maxServicePorts, maxEndpoints: opts.maxEndpoints, log: ctx.log });
        const r = datapath.report;
        ctx.log.info({ bpffs: opts.bpffs, cgroup: cgroupPath, adoptedMaps: r.adoptedMaps.length, adoptedLinks: r.adoptedLinks.length, attached: r.attached.length }, 'eBPF programs loaded');
        return datapath.maps;
      },
      drift: () => {
        const why = Datapath.missing(opts.bpffs);
        if (why) {
          datapath?.close();
          datapath = undefined;
        }
        return why;
      },
    });
    ebpfMetrics.capacity.set({ map: 'services' }, opts.maxServicePorts);
    ebpfMetrics.capacity.set({ map: 'endpoints' }, opts.maxEndpoints);
    setCounterSource(() => proxier.counters());
    const inst = proxierInstance(proxier, [LocalSet.NodesSet]);
    return {
      ...inst,
      async close() {
        await inst.close?.();
        datapath?.close();
      },
    };
  },
  async cleanup(log) {
    const dir = process.env.KPNG_EBPF_BPFFS || DEFAULT_BPFFS;
    try {
      const { cleanupPins } = await import('./datapath.js');
      return cleanupPins(dir);
    } catch (e) {
      log.debug({ err: (e as Error).message }, `cleanup: eBPF pins under ${dir}`);
      return { removed: [], kept: [], failed: [`eBPF pins under ${dir}: ${(e as Error).message}`] };
    }
  },
});

export type { EbpfProxier } from './proxier.js';
