// kpng cleanup for the iptables backend, as kube-proxy --cleanup
// (CleanupLeftovers): kpng's chains and every rule of any other chain that
// jumps or goes to one of them (it points into what kpng installed), in
// iptables-nft and iptables-legacy, IPv4 and IPv6. One iptables-restore per
// table: a table that fails stays as it was, and every other table and family
// is still cleaned. KUBE-FIREWALL stays (see kept()); so do kubelet's chains.
import type { Family } from '../../api/ip.js';
import type { Logger } from '../../runtime/log.js';
import type { CleanupReport } from '../registry.js';
import { isServiceChain } from './names.js';
import { FILTER_CHAINS, NAT_CHAINS, KUBE_FIREWALL, KUBE_PROXY_CANARY } from './rules.js';
import { IptablesError, restore, save, toolName, type IptablesMode, type SavedTable, type ToolPath } from './iptables.js';
import { jumpTarget } from './rule-args.js';

/** kpng's fixed chains per table, in the order they are reported */
const FIXED: Record<string, readonly string[]> = {
  nat: [...NAT_CHAINS, KUBE_PROXY_CANARY],
  filter: [...FILTER_CHAINS, KUBE_PROXY_CANARY],
  mangle: [KUBE_PROXY_CANARY],
};

/** What one table's cleanup does: its restore input and what that removes. */
export interface TableCleanup {
  readonly input: string;
  readonly chains: string[];
  /** rules of other chains that jump to kpng's, and the chains holding them */
  readonly jumps: number;
  readonly from: string[];
}

/** The cleanup of one saved table; undefined when nothing of kpng's is there. */
export function tableCleanup(table: string, t: SavedTable): TableCleanup | undefined {
  const fixed = FIXED[table];
  if (!fixed) return undefined;
  const ours = new Set([...t.chains.keys()].filter((c) => fixed.includes(c) || (table === 'nat' && isServiceChain(c))));
  if (!ours.size) return undefined;
  const lines = [`*${table}`];
  const from: string[] = [];
  let jumps = 0;
  for (const [chain, rules] of t.chains) {
    if (ours.has(chain)) continue;
    for (const r of rules) {
      const target = jumpTarget(r);
      if (!target || !ours.has(target)) continue;
      // the rule as saved: iptables-restore deletes the first rule it matches
      lines.push(`-D ${r.slice(3)}`);
      jumps++;
      if (!from.includes(chain)) from.push(chain);
    }
  }
  // flushing every chain first drops the jumps between them, then none is busy
  for (const c of ours) lines.push(`-F ${c}`);
  for (const c of ours) lines.push(`-X ${c}`);
  lines.push('COMMIT', '');
  const chains = [...fixed.filter((c) => ours.has(c)), ...[...ours].filter((c) => !fixed.includes(c))];
  return { input: lines.join('\n'), chains, jumps, from };
}

function describe(tool: string, table: string, c: TableCleanup): string {
  const fixed = c.chains.filter((n) => !isServiceChain(n));
  const service = c.chains.length - fixed.length;
  return (
    `${tool} ${table} chains ${fixed.join(', ')}` +
    (service ? ` and ${service} service chains (KUBE-SVC-/SVL-/EXT-/FW-/SEP-)` : '') +
    (c.jumps ? `, and ${c.jumps} rules jumping to them (in ${c.from.join(', ')})` : '')
  );
}

/**
 * KUBE-FIREWALL (filter, IPv4 with localhost NodePorts) stays, as with
 * kube-proxy --cleanup: kubelet writes the same chain and rule, which kpng
 * cannot tell from its own, and its DROP guards route_localnet=1, which stays.
 */
function kept(tool: string, family: Family, tables: Map<string, SavedTable>): string[] {
  if (family !== 4 || !tables.get('filter')?.chains.has(KUBE_FIREWALL)) return [];
  return [
    `${tool} filter ${KUBE_FIREWALL} and its jumps (the DROP of non-local traffic to 127.0.0.0/8 that kubelet also writes; ` +
      'it guards net.ipv4.conf.all.route_localnet=1, which stays too; as with kube-proxy --cleanup)',
  ];
}

/** A save that failed because this kernel or host has no such iptables: nothing of kpng's can be there. */
function absent(e: unknown): boolean {
  if (!(e instanceof IptablesError)) return false;
  return e.code === -1 || /Protocol not supported|Address family not supported|Table does not exist|can't initialize/i.test(e.stderr);
}

export async function cleanupIptables(log: Logger, tool: ToolPath = (t) => t): Promise<CleanupReport> {
  const report: CleanupReport = { removed: [], kept: [], failed: [] };
  for (const mode of ['nft', 'legacy'] as IptablesMode[]) {
    for (const family of [4, 6] as Family[]) {
      const name = toolName(family, mode, '');
      let tables: Map<string, SavedTable>;
      try {
        tables = await save(family, mode, tool);
      } catch (e) {
        if (absent(e)) log.debug({ err: (e as Error).message }, `cleanup: no ${name} here`);
        else report.failed.push(`${name} (cannot list its tables): ${(e as Error).message}`);
        continue;
      }
      for (const table of ['nat', 'filter', 'mangle']) {
        const t = tables.get(table);
        const c = t && tableCleanup(table, t);
        if (!c) continue;
        try {
          await restore(family, mode, tool, c.input);
          report.removed.push(describe(name, table, c));
          log.debug({ mode, family, table, chains: c.chains.length, jumps: c.jumps }, 'cleanup: iptables chains removed');
        } catch (e) {
          report.failed.push(`${name} ${table} (left as it was): ${(e as Error).message}`);
        }
      }
      report.kept.push(...kept(name, family, tables));
    }
  }
  return report;
}
