// The guest half of lab-sctp.test.ts: a lab with hand-written nftables rules
// for SCTP in the node's namespace, and what the agents saw, per case.
import { Lab, type Outcome } from '../../src/lab/index.js';
import { guestMain, isMain } from '../helpers/kernel-lab.js';

export type SctpCases = Record<string, Outcome | Outcome[] | string>;

// TCG: slower than the host, so a longer wait for an answer (only DROP waits it out)
const timeoutMs = 5000;

async function cases(): Promise<SctpCases> {
  const lab = await Lab.create({
    tag: 'vmsctp',
    node: { name: 'node-a', interfaces: [{ name: 'lo', addresses: ['127.0.0.1/8', '::1/128'] }, { name: 'eth0', addresses: ['192.168.0.2/24', '2001:db8::1/64'] }] },
    pods: [
      { name: 'web-1', ips: ['10.180.0.1', 'fd00:10::1'] },
      { name: 'web-2', ips: ['10.180.2.1'] },
      { name: 'client', ips: ['10.0.0.2', 'fd00:10::2'] },
    ],
  });
  const out: SctpCases = {};
  try {
    out.closedPortsMarked = String(lab.closedPortsMarked);
    await Promise.all([lab.serve('web-1', { sctp: [53] }), lab.serve('web-2', { sctp: [53] }), lab.serve('world', { sctp: [53], udpHosts: ['172.30.0.50'] })]);
    const nft = await lab.exec('node-a', ['nft', '-f', '-'], {
      input: `table ip t {
  chain pre { type nat hook prerouting priority dstnat; policy accept;
    ip daddr 172.30.0.41 sctp dport 53 dnat to numgen random mod 2 map { 0 : 10.180.0.1, 1 : 10.180.2.1 }
    ip daddr 172.30.0.43 sctp dport 53 meta mark set 1 dnat to 10.180.0.1
  }
  chain post { type nat hook postrouting priority srcnat; policy accept; meta mark 1 masquerade; }
  chain fw { type filter hook forward priority 0; policy accept; ip daddr 172.30.0.99 reject; ip daddr 172.30.0.98 drop; }
}
`,
    });
    if (nft.code !== 0) throw new Error(`nft: ${nft.stderr}`);
    const c = (to: string, port = 53, from = to.includes(':') ? 'fd00:10::2' : '10.0.0.2') => lab.connect({ from, to, port, protocol: 'SCTP', timeoutMs });
    [out.direct, out.direct6, out.closedPort, out.untouched, out.masq, out.reject, out.drop] = await Promise.all([
      c('10.180.0.1'),
      c('fd00:10::1'),
      c('10.180.0.1', 54),
      c('172.30.0.50'),
      c('172.30.0.43'),
      c('172.30.0.99'),
      c('172.30.0.98'),
    ]);
    // the SCTP server is no TCP server
    out.tcpToSctpPort = await lab.connect({ from: '10.0.0.2', to: '10.180.0.1', port: 53, protocol: 'TCP', timeoutMs });
    out.dnat = await lab.burst({ from: '10.0.0.2', to: '172.30.0.41', port: 53, protocol: 'SCTP', timeoutMs, count: 16 });
    const kept = await lab.open({ from: '10.0.0.2', to: '10.180.0.1', port: 53, protocol: 'SCTP', timeoutMs });
    out.keptFirst = kept.first;
    out.keptAgain = await kept.send();
    await lab.unserve('web-1', { protocol: 'SCTP', dropConnections: true });
    out.keptAfterUnserve = await kept.send();
    out.afterUnserve = await c('10.180.0.1');
    await kept.close();
  } finally {
    await lab.close();
  }
  return out;
}

if (isMain(import.meta.url)) await guestMain(cases);
