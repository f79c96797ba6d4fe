// The nftables rules that bring Service traffic to the userspace proxy's
// listeners: one table of kpng's own (family inet, both IP families), written
// whole in one transaction at each sync (a NAT table holds no state: flows
// already redirected keep their conntrack entry).
//
// Where traffic is redirected, and why there:
//  - from pods and outside (prerouting): a Service IP is redirected
//    (`redirect`: to the address of the interface it came in on), a NodePort
//    keeps its (local) address and only changes port;
//  - from the node itself (output): to the client's own source address, so a
//    UDP reply the listener sends (from the address routing picks for the
//    client, which is that address) matches the connection's NAT entry. This
//    also serves 127.0.0.1 / ::1 without route_localnet.
// A service port with no endpoint at all is not redirected but rejected
// (TCP reset, ICMP port unreachable) in the filter hooks, as kube-proxy does.
import type { Family } from '../../../api/ip.js';
import { Transaction, type ElementData, type TableRef } from '../nftables/transaction.js';

export interface RedirectRules {
  /** Service IP (cluster, external, LoadBalancer) . protocol . port -> listener port */
  readonly serviceIPs: readonly { family: Family; ip: string; protocol: 'tcp' | 'udp'; port: number; to: number }[];
  /** NodePort -> listener port, per family */
  readonly nodePorts: readonly { family: Family; protocol: 'tcp' | 'udp'; nodePort: number; to: number }[];
  /** Service IP ports without any endpoint: rejected */
  readonly rejectIPs: readonly { family: Family; ip: string; protocol: 'tcp' | 'udp' | 'sctp'; port: number }[];
  readonly rejectNodePorts: readonly { family: Family; protocol: 'tcp' | 'udp' | 'sctp'; nodePort: number }[];
  /** LoadBalancer IPs with loadBalancerSourceRanges: only these sources (CIDRs) get through, others are dropped */
  readonly firewall?: readonly { family: Family; ip: string; protocol: 'tcp' | 'udp' | 'sctp'; port: number; allow: readonly string[] }[];
  /** NodePorts on every local address ('all'), or on these addresses/CIDRs only (interval set elements) */
  readonly nodePortAddresses: Record<Family, 'all' | readonly string[]>;
}

const V = { 4: { ip: 'ip', addr: 'ipv4_addr', sfx: 'v4' }, 6: { ip: 'ip6', addr: 'ipv6_addr', sfx: 'v6' } } as const;

/** The table's whole content as one transaction (it replaces whatever the table had). */
export function redirectTransaction(name: string, r: RedirectRules, families: readonly Family[] = [4, 6], opts: { natPriority?: number; comment?: string } = {}): Transaction {
  const table: TableRef = { family: 'inet', name };
  const tx = new Transaction();
  // add-then-delete: deleting a table that is not there would fail the transaction
  tx.add({ kind: 'table', ...table });
  tx.delete({ kind: 'table', ...table });
  tx.add({ kind: 'table', ...table, comment: opts.comment ?? 'kpng: Service traffic to the userspace proxy' });
  const nat = opts.natPriority ?? -100;
  const chain = (n: string, hook: string) => tx.add({ kind: 'chain', table, name: n, hook });
  const rule = (c: string, text: string) => tx.add({ kind: 'rule', table, chain: c, rule: text });
  chain('nat-prerouting', `type nat hook prerouting priority ${nat} ;`);
  chain('nat-output', `type nat hook output priority ${nat} ;`);
  // before NAT (priority dstnat - 10), as kube-proxy's firewall check
  chain('filter-prerouting', 'type filter hook prerouting priority -110 ;');
  chain('filter-output-pre', 'type filter hook output priority -110 ;');
  chain('filter-input', 'type filter hook input priority 0 ;');
  chain('filter-forward', 'type filter hook forward priority 0 ;');
  chain('filter-output', 'type filter hook output priority 0 ;');
  const proto = 'meta l4proto { tcp, udp }';
  for (const f of families) {
    const { ip, addr, sfx } = V[f];
    const set = (n: string, body: string, kind: 'set' | 'map' = 'set') => tx.add({ kind, table, name: `${n}-${sfx}`, body });
    set('service-ips', `type ${addr} . inet_proto . inet_service : inet_service ;`, 'map');
    set('nodeports', 'type inet_proto . inet_service : inet_service ;', 'map');
    set('no-endpoint-services', `type ${addr} . inet_proto . inet_service ;`);
    set('no-endpoint-nodeports', 'type inet_proto . inet_service ;');
    set('firewall-ips', `type ${addr} . inet_proto . inet_service ;`);
    set('firewall-allow', `type ${addr} . inet_proto . inet_service . ${addr} ; flags interval ;`);
    const np = r.nodePortAddresses[f];
    let npDst = 'fib daddr type local';
    if (np !== 'all') {
      set('nodeport-addresses', `type ${addr} ; flags interval ;`);
      npDst = `fib daddr type local ${ip} daddr @nodeport-addresses-${sfx}`;
      addElements(tx, table, `nodeport-addresses-${sfx}`, np.map((a) => ({ key: a, value: '' })));
    }
    const vip = `${ip} daddr . meta l4proto . th dport`;
    for (const c of ['filter-prerouting', 'filter-output-pre']) {
      rule(c, `${vip} . ${ip} saddr @firewall-allow-${sfx} return`);
      rule(c, `${vip} @firewall-ips-${sfx} drop`);
    }
    const fw = (r.firewall ?? []).filter((e) => e.family === f);
    addElements(tx, table, `firewall-ips-${sfx}`, fw.map((e) => ({ key: `${e.ip} . ${e.protocol} . ${e.port}`, value: '' })));
    addElements(tx, table, `firewall-allow-${sfx}`, fw.flatMap((e) => e.allow.map((a) => ({ key: `${e.ip} . ${e.protocol} . ${e.port} . ${a}`, value: '' }))));
    rule('nat-prerouting', `${proto} redirect to : ${vip} map @service-ips-${sfx}`);
    rule('nat-prerouting', `${proto} ${npDst} dnat ${ip} to ${ip} daddr : meta l4proto . th dport map @nodeports-${sfx}`);
    rule('nat-output', `${proto} dnat ${ip} to ${ip} saddr : ${vip} map @service-ips-${sfx}`);
    rule('nat-output', `${proto} ${npDst} dnat ${ip} to ${ip} saddr : meta l4proto . th dport map @nodeports-${sfx}`);
    // refused: TCP with a reset, the rest with ICMP port unreachable
    for (const c of ['filter-forward', 'filter-output']) {
      rule(c, `${vip} @no-endpoint-services-${sfx} meta l4proto tcp reject with tcp reset`);
      rule(c, `${vip} @no-endpoint-services-${sfx} reject`);
    }
    rule('filter-input', `${npDst} meta l4proto . th dport @no-endpoint-nodeports-${sfx} meta l4proto tcp reject with tcp reset`);
    rule('filter-input', `${npDst} meta l4proto . th dport @no-endpoint-nodeports-${sfx} reject`);
    addElements(tx, table, `service-ips-${sfx}`, r.serviceIPs.filter((e) => e.family === f).map((e) => ({ key: `${e.ip} . ${e.protocol} . ${e.port}`, value: String(e.to) })));
    addElements(tx, table, `nodeports-${sfx}`, r.nodePorts.filter((e) => e.family === f).map((e) => ({ key: `${e.protocol} . ${e.nodePort}`, value: String(e.to) })));
    addElements(tx, table, `no-endpoint-services-${sfx}`, r.rejectIPs.filter((e) => e.family === f).map((e) => ({ key: `${e.ip} . ${e.protocol} . ${e.port}`, value: '' })));
    addElements(tx, table, `no-endpoint-nodeports-${sfx}`, r.rejectNodePorts.filter((e) => e.family === f).map((e) => ({ key: `${e.protocol} . ${e.nodePort}`, value: '' })));
  }
  return tx;
}

/** elements, each key once (two Services wanting one address and port: the first wins, as in to-nft) */
function addElements(tx: Transaction, table: TableRef, set: string, list: { key: string; value: string }[]): void {
  const seen = new Set<string>();
  const out: ElementData[] = [];
  for (const e of list) {
    if (seen.has(e.key)) continue;
    seen.add(e.key);
    out.push({ set, key: e.key, value: e.value, comment: '' });
  }
  tx.addElements(table, set, out);
}
