// to-iptables: kube-proxy's iptables mode as a kpng backend.
import { Option } from 'commander';
import { addDataplaneFlags, dataplaneOptions, proxierInstance } from '../shared/backend.js';
import { LocalSet } from '../../api/model.js';
import { registerBackend } from '../registry.js';

registerBackend({
  name: 'iptables',
  description: "program this node with iptables (kube-proxy's iptables mode: KUBE-SERVICES, KUBE-SVC-*, KUBE-SEP-*, ...)",
  proxyMode: 'iptables',
  syncPeriodMs: (c) => c.iptables.syncPeriodMs,
  options(cmd) {
    addDataplaneFlags(cmd, 'each iptables-restore input').addOption(
      new Option('--iptables-mode <mode>', 'iptables-nft or iptables-legacy (default: the one the host uses, as iptables-wrappers detects it)').choices(['nft', 'legacy']),
    );
  },
  // the implementation loads when the backend runs: other commands pay nothing for it
  async create(opts, ctx) {
    const { IptablesProxier } = await import('./proxier.js');
    return proxierInstance(new IptablesProxier({ ...dataplaneOptions(opts, ctx), mode: opts.iptablesMode }), [LocalSet.NodesSet]);
  },
  async cleanup(log) {
    const { cleanupIptables } = await import('./cleanup.js');
    return cleanupIptables(log);
  },
});

export type { IptablesProxier } from './proxier.js';
