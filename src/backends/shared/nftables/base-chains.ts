// The base chains of kpng's nftables tables (to-nft's `kube-proxy`-shaped
// table and to-ipvs's kpng-ipvs): name -> declaration, with kube-proxy's names
// and priorities (dstnat - 10, filter, dstnat, srcnat), written as numbers
// because nft 1.0.6 accepts the symbolic "dstnat" only on prerouting.
// docs/aggregator.md lists them for tenants that order their own chains
// around kpng's.
export const BASE_CHAINS: Readonly<Record<string, string>> = {
  // source ranges are checked before the externalTrafficPolicy Local short-circuit rewrites the address (as kube-proxy's nftables mode)
  'filter-prerouting-pre-dnat': 'type filter hook prerouting priority -110 ;',
  'filter-output-pre-dnat': 'type filter hook output priority -110 ;',
  // (to-ipvs: before IPVS, which takes packets at LOCAL_IN priority 98)
  'filter-input': 'type filter hook input priority 0 ;',
  'filter-forward': 'type filter hook forward priority 0 ;',
  'filter-output': 'type filter hook output priority 0 ;',
  'nat-prerouting': 'type nat hook prerouting priority -100 ;',
  'nat-output': 'type nat hook output priority -100 ;',
  'nat-postrouting': 'type nat hook postrouting priority 100 ;',
};
