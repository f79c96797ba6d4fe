// to-nft: the nftables backend.
import { addDataplaneFlags, dataplaneOptions, proxierInstance } from '../shared/backend.js';
import { LocalSet } from '../../api/model.js';
import { registerBackend } from '../registry.js';
import type { NftError } from '../shared/nftables/nft.js';

registerBackend({
  name: 'nft',
  description: "program this node with nftables (kube-proxy's nftables mode semantics)",
  proxyMode: 'nftables',
  syncPeriodMs: (c) => c.nftables.syncPeriodMs,
  options(cmd) {
    addDataplaneFlags(cmd, 'each nft transaction').option('--nft-path <path>', 'the nft binary', 'nft');
  },
  // the implementation loads when the backend runs: other commands pay nothing for it
  async create(opts, ctx) {
    const { NftProxier } = await import('./proxier.js');
    return proxierInstance(new NftProxier({ ...dataplaneOptions(opts, ctx), nftPath: opts.nftPath }), [LocalSet.NodesSet, LocalSet.ServiceCIDRsSet]);
  },
  async cleanup(log) {
    const [{ runNft }, { TABLE }, { LOCALHOST_TABLE }] = await Promise.all([import('../shared/nftables/nft.js'), import('./ruleset.js'), import('../shared/userspace/localhost.js')]);
    const report = { removed: [] as string[], kept: [] as string[], failed: [] as string[] };
    for (const family of ['ip', 'ip6']) {
      try {
        await runNft(['delete', 'table', family, TABLE]);
        report.removed.push(`nftables table ${family} ${TABLE}`);
      } catch (e) {
        // no table, no nft, no nf_tables: nothing of ours there; anything else is reported (and the other family still cleaned)
        const err = e as NftError;
        if (err.code === -1 || /No such file or directory|Protocol not supported|Operation not supported/.test(err.stderr ?? '')) log.debug({ err: err.message }, `cleanup: no nftables table ${family} ${TABLE}`);
        else report.failed.push(`nftables table ${family} ${TABLE}: ${err.message}`);
      }
    }
    // localhost NodePorts (KEP-6032): the userspace proxy's redirect table
    try {
      await runNft(['delete', 'table', 'inet', LOCALHOST_TABLE]);
      report.removed.push(`nftables table inet ${LOCALHOST_TABLE}`);
    } catch (e) {
      const err = e as NftError;
      if (!(err.code === -1 || err.isNotFound || /No such file or directory|Protocol not supported|Operation not supported/.test(err.stderr ?? ''))) report.failed.push(`nftables table inet ${LOCALHOST_TABLE}: ${err.message}`);
    }
    return report;
  },
});

export type { NftProxier } from './proxier.js';
