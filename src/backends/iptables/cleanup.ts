// kpng cleanup for the iptables backend: the KUBE-* chains it writes and the
// jumps to them from the built-in chains, in iptables-nft and iptables-legacy,
// IPv4 and IPv6; nothing else (kubelet's KUBE-FIREWALL and canaries stay).
import type { Family } from '../../api/ip.js';
import type { Logger } from '../../log.js';
import { isServiceChain } from './names.js';
import { FILTER_CHAINS, NAT_CHAINS, KUBE_PROXY_CANARY } from './rules.js';
import { restore, save, toolName, type IptablesMode, type ToolPath } from './iptables.js';

const OURS: Record<string, ReadonlySet<string>> = {
  filter: new Set([...FILTER_CHAINS, KUBE_PROXY_CANARY]),
  nat: new Set([...NAT_CHAINS, KUBE_PROXY_CANARY]),
  mangle: new Set([KUBE_PROXY_CANARY]),
};

const BUILT_IN = new Set(['INPUT', 'OUTPUT', 'FORWARD', 'PREROUTING', 'POSTROUTING']);

export async function cleanupIptables(log: Logger, tool: ToolPath = (t) => t): Promise<string[]> {
  const removed: string[] = [];
  for (const mode of ['nft', 'legacy'] as IptablesMode[]) {
    for (const family of [4, 6] as Family[]) {
      let tables;
      try {
        tables = await save(family, mode, tool);
      } catch {
        continue; // that iptables (or family) is not there
      }
      const input: string[] = [];
      const names: string[] = [];
      for (const [table, t] of tables) {
        const ours = [...t.chains.keys()].filter((c) => OURS[table]?.has(c) || (table === 'nat' && isServiceChain(c)));
        if (!ours.length) continue;
        const mine = new Set(ours);
        input.push(`*${table}`);
        // the jumps into our chains from the built-in chains
        for (const [chain, rules] of t.chains) {
          if (!BUILT_IN.has(chain)) continue;
          for (const r of rules) {
            const target = / -j (\S+)/.exec(r)?.[1];
            if (target && mine.has(target)) input.push(`-D ${r.slice(3)}`);
          }
        }
        for (const c of ours) input.push(`-F ${c}`);
        for (const c of ours) input.push(`-X ${c}`);
        input.push('COMMIT');
        names.push(...ours.map((c) => `${table}/${c}`));
      }
      if (!input.length) continue;
      await restore(family, mode, tool, input.join('\n') + '\n');
      removed.push(`${toolName(family, mode, '')} chains ${names.join(' ')}`);
      log.debug({ mode, family, chains: names.length }, 'cleanup: iptables chains removed');
    }
  }
  return removed;
}
