// Running iptables: one `iptables-restore --noflush -w 5` per family per
// sync, `iptables-save` only for a full reconcile, and choosing between
// iptables-nft and iptables-legacy the way kubernetes-sigs/iptables-wrappers
// does.
import { ToolError, runTool } from '../shared/tool.js';
import type { Family } from '../../api/ip.js';

export type IptablesMode = 'nft' | 'legacy';

/** exit code 1 = not found / failed, 4 = resource (lock) problem; -1 = could not run */
export class IptablesError extends ToolError {}

/** How to find a tool: the name, or a path (tests run tools inside a namespace this way). */
export type ToolPath = (tool: string) => string;

export function run(path: string, args: string[], input?: string): Promise<string> {
  return runTool(path, args, { input, errorClass: IptablesError });
}

/** iptables-nft-restore, ip6tables-legacy-save, ... */
export function toolName(family: Family, mode: IptablesMode, what: 'restore' | 'save' | ''): string {
  return `${family === 4 ? 'iptables' : 'ip6tables'}-${mode}${what ? `-${what}` : ''}`;
}

/** One table of iptables-save output: chains in order, and each chain's rules. */
export interface SavedTable {
  readonly chains: Map<string, string[]>;
}

/** Parses iptables-save output: table -> chain -> rules ("-A ..." lines). */
export function parseSave(text: string): Map<string, SavedTable> {
  const tables = new Map<string, SavedTable>();
  let cur: SavedTable | undefined;
  for (const line of text.split('\n')) {
    const c = line.charCodeAt(0);
    if (c === 45 /* - */) {
      if (!cur || !line.startsWith('-A ')) continue;
      const sp = line.indexOf(' ', 3);
      const chain = sp < 0 ? line.slice(3) : line.slice(3, sp);
      let rules = cur.chains.get(chain);
      if (!rules) cur.chains.set(chain, (rules = []));
      rules.push(line);
    } else if (c === 58 /* : */) {
      if (cur) {
        const name = line.slice(1, line.indexOf(' '));
        if (!cur.chains.has(name)) cur.chains.set(name, []);
      }
    } else if (c === 42 /* * */) {
      const name = line.slice(1).trim();
      cur = { chains: new Map() };
      tables.set(name, cur);
    }
  }
  return tables;
}

/** Runs iptables-save for a family (all tables: legacy -t would create missing tables). */
export async function save(family: Family, mode: IptablesMode, tool: ToolPath): Promise<Map<string, SavedTable>> {
  return parseSave(await run(tool(toolName(family, mode, 'save')), []));
}

/** iptables-restore --noflush (test: only parse and check the input, commit nothing) */
export async function restore(family: Family, mode: IptablesMode, tool: ToolPath, input: string, o: { test?: boolean } = {}): Promise<void> {
  try {
    await run(tool(toolName(family, mode, 'restore')), ['--noflush', '-w', '5', ...(o.test ? ['--test'] : [])], input);
  } catch (e) {
    // name the line iptables-restore stopped at (as upstream logs it); legacy says "line N failed"
    const m = e instanceof IptablesError ? /Error occurred at line: (\d+)|^\S*restore: line (\d+) failed/m.exec(e.stderr) : null;
    if (!m) throw e;
    const n = Number(m[1] ?? m[2]);
    const line = input.split('\n', n)[n - 1];
    throw new IptablesError(`${(e as Error).message} | line ${n}: ${line}`, (e as IptablesError).stderr, (e as IptablesError).code);
  }
}

const KUBELET_CHAINS = /^:(KUBE-IPTABLES-HINT|KUBE-KUBELET-CANARY) /m;
const KUBE_CHAINS = /^:KUBE-/m;

async function saveText(tool: ToolPath, name: string, args: string[]): Promise<string> {
  try {
    return await run(tool(name), args);
  } catch {
    return '';
  }
}

/**
 * Which iptables the host uses, as iptables-wrappers decides: kubelet's
 * chains (KUBE-IPTABLES-HINT, KUBE-KUBELET-CANARY) in nft first, then in
 * legacy; then any KUBE-* chain (kube-proxy's or an earlier kpng's); then
 * whichever has more rules; nft when nothing tells.
 */
export async function detectMode(tool: ToolPath): Promise<{ mode: IptablesMode; reason: string }> {
  const nft = (await Promise.all([4, 6].map((f) => saveText(tool, toolName(f as Family, 'nft', 'save'), [])))).join('\n');
  const legacy = (await Promise.all([4, 6].map((f) => saveText(tool, toolName(f as Family, 'legacy', 'save'), [])))).join('\n');
  if (KUBELET_CHAINS.test(nft)) return { mode: 'nft', reason: "kubelet's chains are in iptables-nft" };
  if (KUBELET_CHAINS.test(legacy)) return { mode: 'legacy', reason: "kubelet's chains are in iptables-legacy" };
  const kn = KUBE_CHAINS.test(nft);
  const kl = KUBE_CHAINS.test(legacy);
  if (kn !== kl) return { mode: kn ? 'nft' : 'legacy', reason: `KUBE-* chains are in iptables-${kn ? 'nft' : 'legacy'}` };
  const count = (s: string) => s.split('\n').filter((l) => l.startsWith('-')).length;
  const [n, l] = [count(nft), count(legacy)];
  if (l > n) return { mode: 'legacy', reason: `iptables-legacy has more rules (${l} vs ${n})` };
  return { mode: 'nft', reason: n ? `iptables-nft has as many rules or more (${n} vs ${l})` : 'no rules anywhere: the default' };
}
