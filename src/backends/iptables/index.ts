// to-iptables: kube-proxy's iptables mode as a kpng backend.
import { Option } from 'commander';
import { DecoderSink } from '../../diff/decoder.js';
import { LocalSet } from '../../api/model.js';
import { registerBackend } from '../registry.js';
import { IptablesProxier } from './proxier.js';
import { cleanupIptables } from './cleanup.js';

registerBackend({
  name: 'iptables',
  description: "program this node with iptables (kube-proxy's iptables mode: KUBE-SERVICES, KUBE-SVC-*, KUBE-SEP-*, ...)",
  proxyMode: 'iptables',
  syncPeriodMs: (c) => c.iptables.syncPeriodMs,
  options(cmd) {
    cmd
      .option('--dry-run', 'print each iptables-restore input on stdout instead of applying it')
      .addOption(new Option('--iptables-mode <mode>', 'iptables-nft or iptables-legacy (default: the one the host uses, as iptables-wrappers detects it)').choices(['nft', 'legacy']))
      .option('--conntrack-path <path>', 'the conntrack binary', 'conntrack')
      .option('--no-health-checks', 'do not serve healthCheckNodePorts');
  },
  create(opts, ctx) {
    const proxier = new IptablesProxier({
      nodeName: ctx.nodeName,
      config: ctx.config,
      log: ctx.log,
      dryRun: !!opts.dryRun,
      once: !!opts.once,
      mode: opts.iptablesMode,
      conntrackPath: opts.conntrackPath,
      healthChecks: opts.healthChecks,
      report: ctx.report,
    });
    return {
      sink: new DecoderSink(proxier),
      sets: [LocalSet.NodesSet],
      close: () => proxier.close(),
    };
  },
  cleanup: (log) => cleanupIptables(log),
});

export { IptablesProxier };
