// Which base chains a packet meets at each hook it passes, whoever wrote
// them: kpng's own, its tenants' (src/aggregator: tables kpng.<tenant>.*)
// and anyone else's, in the order the kernel runs them (by priority), from
// `nft -j list chains`. kpng's rules are followed in detail (nft.ts); the
// others are only listed: their verdicts compose with kpng's (docs/aggregator.md).
import { tenantOfTable } from '../aggregator/names.js';
import type { Hook } from './packet.js';

export interface HookChain {
  readonly priority: number;
  readonly family: string;
  readonly table: string;
  readonly chain: string;
  readonly type: string;
  /** 'kpng', 'tenant <name>', or 'other' */
  readonly owner: string;
}

export interface HookChains {
  readonly hook: Hook;
  readonly chains: HookChain[];
}

type J = any;

function ownerOf(table: string): string {
  const t = tenantOfTable(table);
  if (t) return `tenant ${t.tenant}`;
  return table === 'kpng' || table.startsWith('kpng-') ? 'kpng' : 'other';
}

/** The base chains of the packet's family (and inet) at each of these hooks, by priority; from `nft -j list chains`. */
export function hookChains(json: string, family: 4 | 6, hooks: readonly Hook[]): HookChains[] {
  const families = new Set(['inet', family === 4 ? 'ip' : 'ip6']);
  const all: (HookChain & { hook: string })[] = [];
  for (const o of (JSON.parse(json) as J).nftables ?? []) {
    const c = o.chain;
    if (!c?.hook || !families.has(c.family)) continue;
    all.push({ hook: c.hook, priority: Number(c.prio), family: c.family, table: c.table, chain: c.name, type: c.type, owner: ownerOf(c.table) });
  }
  return hooks.map((hook) => ({
    hook,
    chains: all
      .filter((c) => c.hook === hook)
      .sort((a, b) => a.priority - b.priority || a.table.localeCompare(b.table))
      .map(({ hook: _, ...c }) => c),
  }));
}

export function formatHookChains(list: readonly HookChains[]): string[] {
  const out = ['base chains at the hooks it passes (by priority; every one runs, a drop anywhere is final):'];
  for (const h of list) {
    out.push(`  ${h.hook}:`);
    if (!h.chains.length) out.push('    (none)');
    for (const c of h.chains) out.push(`    ${String(c.priority).padStart(5)}  ${`${c.family} ${c.table} ${c.chain}`.padEnd(48)} ${c.type.padEnd(7)} ${c.owner}`);
  }
  return out;
}
