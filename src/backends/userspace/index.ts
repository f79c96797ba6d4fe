// to-userspace: kube-proxy's userspace mode as a kpng backend (docs/userspace.md).
import { LocalSet } from '../../api/model.js';
import { registerBackend } from '../registry.js';
import { addDataplaneFlags, dataplaneOptions, proxierInstance } from '../shared/backend.js';
import type { NftError } from '../shared/nftables/nft.js';

registerBackend({
  name: 'userspace',
  description: "proxy Service traffic in kpng itself (kube-proxy's userspace mode: listeners on the node, nftables redirects to them)",
  proxyMode: 'userspace',
  syncPeriodMs: (c) => c.nftables.syncPeriodMs,
  options(cmd) {
    addDataplaneFlags(cmd, 'each nft transaction')
      .option('--nft-path <path>', 'the nft binary', 'nft')
      .option('--udp-max-sessions <n>', 'UDP sessions per listener at most (the oldest is closed to make room)', (v) => Number.parseInt(v, 10), 4096);
  },
  // the implementation loads when the backend runs: other commands pay nothing for it
  async create(opts, ctx) {
    if (!Number.isInteger(opts.udpMaxSessions) || opts.udpMaxSessions < 1) throw new Error(`--udp-max-sessions: a positive integer, not ${JSON.stringify(opts.udpMaxSessions)}`);
    // the listeners are this process: with --once they go when it exits, and the redirects lead nowhere
    if (opts.once && !opts.dryRun) ctx.log.warn('to-userspace --once: the rules stay after kpng exits, but the listeners they redirect to go with it');
    const { UserspaceProxier } = await import('./proxier.js');
    const p = new UserspaceProxier({ ...dataplaneOptions(opts, ctx), nftPath: opts.nftPath, udpMaxSessions: opts.udpMaxSessions });
    return proxierInstance(p, [LocalSet.NodesSet, LocalSet.ServiceCIDRsSet]);
  },
  async cleanup(log) {
    const [{ runNft }, { TABLE }] = await Promise.all([import('../shared/nftables/nft.js'), import('./proxier.js')]);
    const report = { removed: [] as string[], kept: [] as string[], failed: [] as string[] };
    try {
      await runNft(['delete', 'table', 'inet', TABLE]);
      report.removed.push(`nftables table inet ${TABLE}`);
    } catch (e) {
      const err = e as NftError;
      if (err.code === -1 || err.isNotFound || /No such file or directory|Protocol not supported|Operation not supported/.test(err.stderr ?? '')) log.debug({ err: err.message }, `cleanup: no nftables table inet ${TABLE}`);
      else report.failed.push(`nftables table inet ${TABLE}: ${err.message}`);
    }
    return report;
  },
});

export type { UserspaceProxier } from './proxier.js';
