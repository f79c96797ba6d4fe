// to-nft: the nftables backend.
import { DecoderSink } from '../../diff/decoder.js';
import { LocalSet } from '../../api/model.js';
import { registerBackend } from '../registry.js';
import { NftProxier } from './proxier.js';

registerBackend({
  name: 'nft',
  description: "program this node with nftables (kube-proxy's nftables mode semantics)",
  options(cmd) {
    cmd
      .option('--dry-run', 'print each nft transaction on stdout instead of applying it')
      .option('--nft-path <path>', 'the nft binary', 'nft')
      .option('--conntrack-path <path>', 'the conntrack binary', 'conntrack')
      .option('--no-health-checks', 'do not serve healthCheckNodePorts');
  },
  create(opts, ctx) {
    const proxier = new NftProxier({
      nodeName: ctx.nodeName,
      config: ctx.config,
      log: ctx.log,
      dryRun: !!opts.dryRun,
      once: !!opts.once,
      nftPath: opts.nftPath,
      conntrackPath: opts.conntrackPath,
      healthChecks: opts.healthChecks,
    });
    return {
      sink: new DecoderSink(proxier),
      sets: [LocalSet.NodesSet, LocalSet.ServiceCIDRsSet],
      close: () => proxier.close(),
    };
  },
});

export { NftProxier };
