// What every backend derives from the node and kube-proxy's configuration,
// in one place: which traffic comes from pods (detect-local), which node
// addresses serve NodePorts (nodePortAddresses), the ServiceCIDRs.
import { parseCIDR, type Family } from '../../api/ip.js';
import { ipSetOf, type LocalNode, type ServiceCIDR } from '../../api/model.js';
import type { KubeProxyConfiguration } from './config.js';
import { normalizeCIDRs } from './service-ports.js';

/** How pod traffic is told apart (detectLocalMode); undefined: it cannot be. */
export type LocalDetector = { readonly kind: 'cidrs'; readonly cidrs: readonly string[] } | { readonly kind: 'interface'; readonly name: string; readonly prefix: boolean };

/**
 * detect-local for a family; warn says why a mode cannot work yet, with an
 * id for warning once (the same for every family: one line is enough).
 */
export function detectLocal(c: KubeProxyConfiguration, node: LocalNode | undefined, family: Family, warn: (id: string, msg: string) => void): LocalDetector | undefined {
  const ofFamily = (cidrs: readonly string[]) => cidrs.filter((x) => parseCIDR(x)?.family === family);
  switch (c.detectLocalMode) {
    case 'ClusterCIDR': {
      const cidrs = ofFamily(c.clusterCIDRs);
      return cidrs.length ? { kind: 'cidrs', cidrs } : undefined;
    }
    case 'NodeCIDR': {
      const podCIDRs = node?.PodCIDRs ?? [];
      const cidrs = ofFamily(podCIDRs).map((x) => {
        const p = parseCIDR(x)!;
        return `${p.ip}/${p.prefix}`;
      });
      // a node with pod CIDRs of the other family only is single-stack: it has no pods of this one
      if (!podCIDRs.length) warn(`detect-local ${!!node}`, `detectLocalMode NodeCIDR: ${node ? 'the node has no pod CIDR yet' : 'the Node is not known yet'}; pod traffic cannot be told apart`);
      return cidrs.length ? { kind: 'cidrs', cidrs } : undefined;
    }
    case 'BridgeInterface':
      return { kind: 'interface', name: c.detectLocal.bridgeInterface, prefix: false };
    case 'InterfaceNamePrefix':
      return { kind: 'interface', name: c.detectLocal.interfaceNamePrefix, prefix: true };
  }
  return undefined;
}

/** nodePortAddresses for a family, read: every address, or the node's primary IPs, localhost and CIDRs. */
export interface NodePortAddresses {
  readonly all: boolean;
  /** the node's IPs of the family ("primary") */
  readonly primary: readonly string[];
  /** "primary" was asked for and the Node is not known yet */
  readonly unknownNode: boolean;
  readonly localhost: boolean;
  /** the CIDRs of the family, normalized */
  readonly cidrs: readonly string[];
}

/** `list` is nodePortAddresses with the backend's default applied (nftables: primary; iptables: all). */
export function nodePortAddresses(list: readonly string[], node: LocalNode | undefined, family: Family): NodePortAddresses {
  const wantsPrimary = list.includes('primary');
  return {
    all: list.includes('all'),
    primary: wantsPrimary ? ipSetOf(node?.IPs, family) : [],
    unknownNode: wantsPrimary && node === undefined,
    localhost: list.includes('localhost'),
    cidrs: normalizeCIDRs(list.filter((a) => parseCIDR(a)?.family === family)),
  };
}

/** The ServiceCIDRs of a family, normalized (an interval set takes no overlaps). */
export function serviceCIDRsOf(cidrs: Iterable<ServiceCIDR>, family: Family): string[] {
  return normalizeCIDRs([...cidrs].flatMap((c) => c.CIDRs).filter((c) => parseCIDR(c)?.family === family));
}
