// Localhost NodePorts for backends whose NAT cannot serve them (to-nft):
// nftables cannot DNAT 127.0.0.1:<nodePort> to a pod (that takes
// route_localnet, which iptables mode turns on and nftables mode does not), so
// as in upstream's KEP-6032 those connections go to the userspace proxy
// instead: a listener per NodePort on 127.0.0.1 and ::1, and a small table of
// kpng's own redirecting the node's own traffic to them. The node's traffic
// to an externalTrafficPolicy Local NodePort goes to the cluster-wide
// endpoints, as to-iptables does.
//
// kube-proxy's knobs: the feature gate KubeProxyNFTablesLocalhostNodePorts
// (beta: on unless turned off) and nodePortAddresses naming localhost (the
// keyword, or a CIDR holding 127.0.0.1 / ::1); the default, "primary", does not.
import { cidrContains, parseCIDR, type Family } from '../../../api/ip.js';
import type { Logger } from '../../../runtime/log.js';
import type { KubeProxyConfiguration } from '../config.js';
import { runNft, type Nft } from '../nftables/nft.js';
import type { ServicePort } from '../service-ports.js';
import { UserspaceEngine, type ListenerSpec } from './engine.js';
import { redirectTransaction, type RedirectRules } from './redirect.js';

export const LOCALHOST_TABLE = 'kpng-localhost-nodeports';
export const LOCALHOST_GATE = 'KubeProxyNFTablesLocalhostNodePorts';

const LOOPBACK = { 4: '127.0.0.1', 6: '::1' } as const;

/** The families whose loopback NodePorts are to be served, per the configuration (none: off). */
export function localhostNodePortFamilies(c: KubeProxyConfiguration): Family[] {
  if (c.featureGates[LOCALHOST_GATE] === false) return [];
  const list = c.nodePortAddresses;
  return ([4, 6] as const).filter(
    (f) =>
      list.includes('localhost') ||
      list.some((a) => {
        const cidr = parseCIDR(a);
        return !!cidr && cidr.family === f && cidrContains(cidr, LOOPBACK[f]);
      }),
  );
}

interface Plan {
  readonly listeners: ListenerSpec[];
  readonly served: { family: Family; protocol: 'tcp' | 'udp'; nodePort: number; listener: string }[];
  readonly refused: { family: Family; protocol: 'tcp' | 'udp' | 'sctp'; nodePort: number }[];
}

export class LocalhostNodePorts {
  readonly engine: UserspaceEngine;
  private readonly plans = new Map<string, Plan>();

  constructor(
    private readonly o: { log: Logger; nft: Nft; families: readonly Family[]; udpIdleMs?: number },
  ) {
    this.engine = new UserspaceEngine({ log: o.log, udpIdleMs: o.udpIdleMs });
  }

  get families(): readonly Family[] {
    return this.o.families;
  }

  /** A Service's ports (all families) as they are to be served now; [] when it is gone. */
  set(key: string, ports: readonly ServicePort[]): void {
    const p: Plan = { listeners: [], served: [], refused: [] };
    for (const sp of ports) {
      if (!sp.nodePort || !this.o.families.includes(sp.family)) continue;
      if (sp.protocol === 'sctp') {
        p.refused.push({ family: sp.family, protocol: sp.protocol, nodePort: sp.nodePort });
        continue;
      }
      // the node is the client: eTP=Local short-circuits to the cluster-wide endpoints
      const endpoints = sp.externalLocal ? sp.cluster : sp.external;
      if (!endpoints.length) {
        p.refused.push({ family: sp.family, protocol: sp.protocol, nodePort: sp.nodePort });
        continue;
      }
      const lk = `${sp.service}|${sp.nodePort}|${sp.protocol}|${sp.family}|localhost`;
      p.listeners.push({ key: lk, service: sp.service, protocol: sp.protocol, family: sp.family, endpoints, affinitySeconds: sp.affinitySeconds, host: LOOPBACK[sp.family] });
      p.served.push({ family: sp.family, protocol: sp.protocol, nodePort: sp.nodePort, listener: lk });
    }
    if (p.listeners.length || p.refused.length) this.plans.set(key, p);
    else this.plans.delete(key);
  }

  /** Opens and closes listeners as the Services say, then writes the table. */
  async apply(): Promise<void> {
    await this.engine.update([...this.plans.values()].flatMap((p) => p.listeners));
    const r: RedirectRules = { serviceIPs: [], nodePorts: [], rejectIPs: [], rejectNodePorts: [], nodePortAddresses: { 4: ['127.0.0.0/8'], 6: ['::1'] } };
    for (const p of this.plans.values()) {
      for (const s of p.served) {
        const to = this.engine.portOf(s.listener);
        if (to) (r.nodePorts as unknown[]).push({ family: s.family, protocol: s.protocol, nodePort: s.nodePort, to });
      }
      (r.rejectNodePorts as unknown[]).push(...p.refused);
    }
    // before the backend's own NAT chains (priority -100): the first NAT mapping of a connection is the one
    await this.o.nft.run(redirectTransaction(LOCALHOST_TABLE, r, this.o.families, { natPriority: -101, comment: 'kpng: localhost NodePorts to the userspace proxy' }));
  }

  /** false once someone deleted the table (the periodic check repairs it) */
  async present(): Promise<boolean> {
    return (await this.o.nft.list('inet', LOCALHOST_TABLE)) !== undefined;
  }

  async close(): Promise<void> {
    await this.engine.close();
    this.o.nft.close();
  }
}

/** With the feature off, a table a previous run left would redirect to listeners nobody serves: it goes. */
export async function removeLocalhostTable(nft: Pick<Nft, 'list'>, nftPath = 'nft'): Promise<void> {
  // asked first: a node without it (every cold start) runs no nft
  if ((await nft.list('inet', LOCALHOST_TABLE).catch(() => null)) === undefined) return;
  await runNft(['delete', 'table', 'inet', LOCALHOST_TABLE], undefined, nftPath).catch(() => {});
}
