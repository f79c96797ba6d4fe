// to-ipvs: kube-proxy's IPVS mode as a kpng backend (docs/ipvs.md).
import { LocalSet } from '../../api/model.js';
import { registerBackend } from '../registry.js';
import { addDataplaneFlags, dataplaneOptions, proxierInstance } from '../shared/backend.js';
import type { NftError } from '../shared/nftables/nft.js';
import type { Ipvs } from './ipvs.js';

registerBackend({
  name: 'ipvs',
  description: "program this node with IPVS (kube-proxy's IPVS mode: virtual servers, kube-ipvs0; nftables around it)",
  proxyMode: 'ipvs',
  syncPeriodMs: (c) => c.ipvs.syncPeriodMs,
  options(cmd) {
    addDataplaneFlags(cmd, 'each nft transaction and IPVS operation').option('--nft-path <path>', 'the nft binary', 'nft');
  },
  // the implementation loads when the backend runs: other commands pay nothing for it
  async create(opts, ctx) {
    const { IpvsProxier } = await import('./proxier.js');
    return proxierInstance(new IpvsProxier({ ...dataplaneOptions(opts, ctx), nftPath: opts.nftPath }), [LocalSet.NodesSet, LocalSet.ServiceCIDRsSet]);
  },
  async cleanup(log) {
    const [{ runNft }, { Ipvs, vsKey }, { DUMMY, TABLE }, { ToolNode }] = await Promise.all([
      import('../shared/nftables/nft.js'),
      import('./ipvs.js'),
      import('./ruleset.js'),
      import('./node.js'),
    ]);
    const report = { removed: [] as string[], kept: [] as string[], failed: [] as string[] };
    // kpng's virtual servers: on an address of kube-ipvs0, or a NodePort server its table recorded
    const node = new ToolNode();
    const bound = await node.addresses();
    const recorded = new Set<string>();
    for (const family of ['ip', 'ip6'] as const) {
      try {
        const out = JSON.parse(await runNft(['-j', 'list', 'set', family, TABLE, 'nodeport-servers'])) as { nftables: { set?: { elem?: { concat: (string | number)[] }[] } }[] };
        for (const o of out.nftables) for (const e of o.set?.elem ?? []) recorded.add(e.concat.join(' . '));
      } catch {
        // no table: nothing recorded
      }
    }
    let ipvs: Ipvs | undefined;
    try {
      ipvs = new Ipvs();
      const mine = ipvs.services().filter((v) => bound.has(v.address) || recorded.has(`${v.address} . ${v.protocol} . ${v.port}`));
      const results = ipvs.apply(mine.map((vs) => ({ op: 'del-service' as const, vs })));
      results.forEach((r, i) => (r ? report.failed.push(`IPVS virtual server ${vsKey(mine[i])}: ${r.message}`) : undefined));
      if (mine.length) report.removed.push(`${mine.length - results.filter(Boolean).length} IPVS virtual servers`);
    } catch (e) {
      log.debug({ err: (e as Error).message }, 'cleanup: no IPVS here');
    } finally {
      ipvs?.close();
    }
    for (const family of ['ip', 'ip6']) {
      try {
        await runNft(['delete', 'table', family, TABLE]);
        report.removed.push(`nftables table ${family} ${TABLE}`);
      } catch (e) {
        if (!(e as NftError).isNotFound && (e as NftError).code !== -1) report.failed.push(`nftables table ${family} ${TABLE}: ${(e as Error).message}`);
      }
    }
    try {
      if (await node.remove()) report.removed.push(`interface ${DUMMY}`);
    } catch (e) {
      report.failed.push(`interface ${DUMMY}: ${(e as Error).message}`);
    }
    return report;
  },
});

export type { IpvsProxier } from './proxier.js';
