// What kpng's rules mean in Kubernetes' words, from the names kpng gives its
// chains and maps (src/backends/nft/ruleset.ts) and the comments it writes
// (src/backends/iptables/rules.ts, upstream's). A rule without a meaning here
// is still shown in the path, just without words.

interface Ctx {
  /** the chain the rule is in */
  chain: string;
  /** the rule as listed */
  text: string;
}

const count = (name: string | undefined) => Number(/-(\d+)$/.exec(name ?? '')?.[1] ?? 0);
const endpointsWord = (n: number) => `${n} endpoint${n === 1 ? '' : 's'}`;
const svc = (comment?: string) => (comment ? `${comment}: ` : '');

/** where a load-balancing chain (lb-<kind>-<proto>-<n>) or an affinity chain sends the packet */
function lbWords(target: string | undefined): string {
  if (!target) return '';
  const n = count(target);
  if (target.startsWith('lb-local-')) return `internalTrafficPolicy: Local: this node's ${endpointsWord(n)} only`;
  if (target.startsWith('lb-nodeport-local-')) return `externalTrafficPolicy: Local: this node's ${endpointsWord(n)} only, the client's address kept`;
  if (target.startsWith('lb-')) return n === 1 ? 'its only endpoint' : `one of ${endpointsWord(n)} at random`;
  if (target.startsWith('affinity-')) return 'sessionAffinity: ClientIP: a client keeps its endpoint';
  return '';
}

export const nftWhy = {
  mark(ctx: Ctx, mark: number): string | undefined {
    if (!mark) return undefined;
    if (ctx.chain === 'services') return ctx.text.includes('saddr !=') ? 'to a cluster IP from outside the pod network: to be masqueraded' : 'masqueradeAll: to be masqueraded';
    if (ctx.chain.endsWith('policy-cluster')) return 'externalTrafficPolicy: Cluster: to be masqueraded (the endpoint may be on another node)';
    if (ctx.chain.endsWith('policy-local')) return 'externalTrafficPolicy: Local, but from the node itself: to be masqueraded';
    return undefined;
  },
  masquerade(ctx: Ctx): string {
    return ctx.text.includes('@hairpin') ? 'the endpoint is the client itself (hairpin): masqueraded to a node address' : 'masqueraded: the endpoint sees a node address';
  },
  dnat(ctx: Ctx, to: string): string {
    if (ctx.chain.startsWith('affinity-')) return `DNAT to ${to} (sessionAffinity: ClientIP)`;
    return `DNAT to ${to}`;
  },
  vmap(ctx: Ctx, map: string, verdict: string, target: string | undefined, comment: string | undefined, env: { p: { src: string } }): string | undefined {
    const s = svc(comment);
    switch (map) {
      case 'service-ips':
      case 'service-nodeports': {
        const what = map === 'service-nodeports' ? 'NodePort' : target?.startsWith('external-policy') ? 'external or load-balancer IP' : 'cluster IP';
        if (target === 'external-policy-cluster' || target === 'nodeport-policy-cluster') return `${s}${what}, externalTrafficPolicy: Cluster`;
        if (target === 'external-policy-local' || target === 'nodeport-policy-local') return `${s}${what}, externalTrafficPolicy: Local`;
        return `${s}${what}: ${lbWords(target)}`;
      }
      case 'external-cluster-lb':
      case 'nodeport-cluster-lb':
        if (ctx.chain.endsWith('policy-local')) {
          return ctx.text.includes('fib saddr') ? `from the node itself: every endpoint of the Service (${lbWords(target)})` : `the source ${env.p.src} is a pod: short-circuit to every endpoint of the Service (${lbWords(target)}), not masqueraded`;
        }
        return lbWords(target);
      case 'external-local-lb':
      case 'nodeport-local-lb':
        return `externalTrafficPolicy: Local: this node's ${endpointsWord(count(target))} only, the client's address kept`;
      case 'no-endpoint-services':
      case 'no-endpoint-nodeports':
        if (verdict === 'drop') return `${s}a Local traffic policy and no endpoint on this node: dropped`;
        return `${s}no usable endpoint (none ready, none serving while terminating): rejected`;
    }
    return undefined;
  },
  verdict(ctx: Ctx, kind: string, _target?: string): string | undefined {
    if (ctx.chain.startsWith('affinity-') && kind === 'goto' && /saddr @affinity-/.test(ctx.text)) return 'sessionAffinity: ClientIP: this client is in the endpoint\'s set (it used it within the timeout)';
    if (ctx.chain === 'cluster-ips-check') return kind === 'reject' ? 'a cluster IP on a port or protocol its Service does not serve: rejected' : 'an address of a ServiceCIDR that no Service has: dropped';
    if (ctx.chain === 'firewall-check') return kind === 'drop' ? 'loadBalancerSourceRanges do not allow this source: dropped' : kind === 'return' ? 'loadBalancerSourceRanges allow this source' : undefined;
    return undefined;
  },
};

/** iptables: the comment of a rule says which Service and what for (upstream's comments). */
export const iptWhy = {
  jump(chain: string, target: string, comment: string | undefined): string | undefined {
    const c = comment ?? '';
    if (target.startsWith('KUBE-SVC-') && chain === 'KUBE-SERVICES') return `${c}: every usable endpoint`;
    if (target.startsWith('KUBE-SVL-') && chain === 'KUBE-SERVICES') return `${c}: internalTrafficPolicy: Local: this node's endpoints only`;
    if (target.startsWith('KUBE-EXT-') && (chain === 'KUBE-SERVICES' || chain === 'KUBE-NODEPORTS')) return `${c}${chain === 'KUBE-NODEPORTS' ? ' NodePort' : ''}: external traffic`;
    if (target.startsWith('KUBE-FW-')) return `${c}: loadBalancerSourceRanges apply`;
    if (chain.startsWith('KUBE-FW-') && target.startsWith('KUBE-EXT-')) return 'loadBalancerSourceRanges allow this source';
    if (chain.startsWith('KUBE-EXT-') && target.startsWith('KUBE-SVL-')) return "externalTrafficPolicy: Local: this node's endpoints only, the client's address kept";
    if (chain.startsWith('KUBE-EXT-') && target.startsWith('KUBE-SVC-')) {
      if (/pod traffic/i.test(c)) return 'externalTrafficPolicy: Local, but the source is a pod: short-circuit to every endpoint';
      if (/LOCAL/.test(c) || /local traffic/i.test(c)) return 'externalTrafficPolicy: Local, but from the node itself: every endpoint';
      return undefined;
    }
    if (target === 'KUBE-MARK-MASQ') {
      if (chain.startsWith('KUBE-SEP-')) return 'the endpoint is the client itself (hairpin): to be masqueraded';
      if (chain.startsWith('KUBE-EXT-')) return /masquerade LOCAL/i.test(c) ? 'from the node itself: to be masqueraded' : 'externalTrafficPolicy: Cluster: to be masqueraded (the endpoint may be on another node)';
      if (chain.startsWith('KUBE-SVC-') || chain.startsWith('KUBE-SVL-')) return 'to a cluster IP from outside the pod network: to be masqueraded';
    }
    return undefined;
  },
  terminal(chain: string, target: string, comment: string | undefined): string | undefined {
    const c = comment ?? '';
    if (target === 'REJECT') return `${c.replace(/ has no endpoints$/, '')}: no usable endpoint (none ready, none serving while terminating): rejected`;
    if (target === 'DROP') {
      if (/has no local endpoints/.test(c)) return `${c.replace(/ has no local endpoints$/, '')}: a Local traffic policy and no endpoint on this node: dropped`;
      if (chain === 'KUBE-PROXY-FIREWALL') return `${c.replace(/ traffic not accepted by .*$/, '')}: loadBalancerSourceRanges do not allow this source: dropped`;
      if (chain === 'KUBE-FIREWALL') return 'traffic to 127.0.0.0/8 from elsewhere that was not DNATed: dropped (route_localnet guard)';
      if (chain === 'KUBE-FORWARD') return 'an INVALID packet: dropped';
    }
    if (target === 'ACCEPT' && chain === 'KUBE-NODEPORTS') return `${c.replace(/ health check node port$/, '')}: its healthCheckNodePort: accepted for kpng's health check server`;
    if (target === 'MASQUERADE') return 'masqueraded: the endpoint sees a node address';
    return undefined;
  },
};
