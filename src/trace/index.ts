// kpng trace: where a packet goes on this node and why, from the rules in
// the kernel (not from kpng's memory): `nft -j list table` for to-nft,
// `iptables-save` for to-iptables, and the kernel's local addresses.
import { execFile } from 'node:child_process';
import { canonicalIP, ipFamily } from '../api/ip.js';
import { LocalAddresses, summarize, walk, type Hook, type Packet, type Proto, type TraceResult } from './packet.js';
import { NftTable, runNftHook } from './nft.js';
import { IptablesRules, runIptablesHook } from './iptables.js';
import { formatHookChains, hookChains, type HookChains } from './hooks.js';

export type { Packet, TraceResult, Step, EndpointChoice, Verdict } from './packet.js';
export { NftTable } from './nft.js';
export { IptablesRules } from './iptables.js';

export type Exec = (argv: string[]) => Promise<{ code: number | null; stdout: string; stderr: string }>;

/** Runs a tool on this node, with a time limit. */
export const localExec: Exec = (argv) =>
  new Promise((resolve) => {
    execFile(argv[0]!, argv.slice(1), { timeout: 60_000, maxBuffer: 512 << 20 }, (err, stdout, stderr) => {
      const code = err ? (typeof (err as { code?: unknown }).code === 'number' ? ((err as { code: number }).code) : -1) : 0;
      resolve({ code, stdout: String(stdout), stderr: String(stderr || (err && !stderr ? err.message : '')) });
    });
  });

export interface TraceRequest {
  src: string;
  dst: string;
  dport: number;
  proto?: Proto;
  sport?: number;
  iif?: string;
  /** default: the one whose rules are on the node (nft first) */
  backend?: 'nft' | 'iptables';
  /** iptables-nft or iptables-legacy; default: whichever holds kpng's chains */
  iptablesMode?: 'nft' | 'legacy';
}

export class TraceError extends Error {}

export function packetOf(r: TraceRequest): Packet {
  const src = canonicalIP(r.src);
  const dst = canonicalIP(r.dst);
  if (!src) throw new TraceError(`--src ${r.src}: not an IP address`);
  if (!dst) throw new TraceError(`--dst ${r.dst}: not an IP address`);
  if (ipFamily(src) !== ipFamily(dst)) throw new TraceError(`--src ${src} and --dst ${dst} are of different IP families`);
  const port = (n: number, what: string) => {
    if (!Number.isInteger(n) || n < 1 || n > 65535) throw new TraceError(`${what} ${n}: not a port (1-65535)`);
    return n;
  };
  const proto = (r.proto ?? 'tcp').toLowerCase() as Proto;
  if (!['tcp', 'udp', 'sctp'].includes(proto)) throw new TraceError(`--proto ${r.proto}: tcp, udp or sctp`);
  return { src, dst, proto, dport: port(r.dport, '--dport'), sport: port(r.sport ?? 40000, '--sport'), ...(r.iif ? { iif: r.iif } : {}), family: ipFamily(src) };
}

/** The rules kpng installed for the packet's family, read from the kernel. */
export async function readRules(p: Packet, r: TraceRequest, exec: Exec): Promise<{ backend: 'nft'; table: NftTable; source: string } | { backend: 'iptables'; rules: IptablesRules; source: string }> {
  const fam = p.family === 4 ? 'ip' : 'ip6';
  const tried: string[] = [];
  if (r.backend !== 'iptables') {
    const j = await exec(['nft', '-j', 'list', 'table', fam, 'kpng']);
    if (j.code === 0) {
      const a = await exec(['nft', '-a', 'list', 'table', fam, 'kpng']);
      return { backend: 'nft', table: new NftTable(j.stdout, a.code === 0 ? a.stdout : ''), source: `nft list table ${fam} kpng` };
    }
    tried.push(`nft: no table ${fam} kpng (${j.stderr.trim().split('\n')[0] ?? j.code})`);
  }
  if (r.backend !== 'nft') {
    const tool = p.family === 4 ? 'iptables' : 'ip6tables';
    for (const mode of r.iptablesMode ? [r.iptablesMode] : (['nft', 'legacy'] as const)) {
      const cmd = `${tool}-${mode}-save`;
      const s = await exec([cmd]);
      if (s.code !== 0) {
        tried.push(`${cmd}: ${s.stderr.trim().split('\n')[0] ?? s.code}`);
        continue;
      }
      const rules = new IptablesRules(s.stdout);
      if (rules.hasKpng) return { backend: 'iptables', rules, source: cmd };
      tried.push(`${cmd}: no KUBE-SERVICES chain`);
    }
  }
  throw new TraceError(`no kpng rules on this node for IPv${p.family}: ${tried.join('; ')}`);
}

export type { HookChains, HookChain } from './hooks.js';

/** Traces one packet over the rules on the node exec runs on; hooks: every table's base chains at the hooks it passed (kpng's, its tenants', others'). */
export async function trace(r: TraceRequest, exec: Exec = localExec): Promise<TraceResult & { source: string; hooks?: HookChains[] }> {
  const p = packetOf(r);
  const rules = await readRules(p, r, exec);
  const routes = await exec(['ip', '-j', p.family === 4 ? '-4' : '-6', 'route', 'show', 'table', 'local']);
  if (routes.code !== 0) throw new TraceError(`ip route show table local: ${routes.stderr.trim()}`);
  const local = LocalAddresses.fromRoutes(routes.stdout);
  const unknown: string[] = [];
  const passed: Hook[] = [];
  const { origin, branches } = walk(p, local, (hook, b, { natDone }) => {
    if (!passed.includes(hook)) passed.push(hook);
    return rules.backend === 'nft' ? runNftHook(rules.table, p, local, unknown, hook, b, natDone) : runIptablesHook(rules.rules, p, local, unknown, hook, b, natDone);
  });
  const chains = await exec(['nft', '-j', 'list', 'chains']);
  const hooks = chains.code === 0 ? hookChains(chains.stdout, p.family, passed) : undefined;
  return { ...summarize(rules.backend, p, origin, branches, unknown), source: rules.source, ...(hooks ? { hooks } : {}) };
}

const pct = (x: number) => `${(Math.round(x * 1000) / 10).toString()}%`;

/** The trace for people: the packet, each rule it met, the verdict and why. */
export function formatTrace(t: TraceResult & { source?: string; hooks?: HookChains[] }): string {
  const p = t.packet;
  const hp = (ip: string, port: number) => (ip.includes(':') ? `[${ip}]:${port}` : `${ip}:${port}`);
  const out: string[] = [];
  out.push(`packet: ${p.proto} ${hp(p.src, p.sport)} -> ${hp(p.dst, p.dport)}, ${t.origin === 'node' ? 'made on this node (output)' : `arriving${p.iif ? ` on ${p.iif}` : ''} (prerouting)`}`);
  out.push(`rules:  ${t.source ?? t.backend} (read from the kernel)`);
  out.push('');
  out.push('path:');
  if (!t.path.length) out.push('  (no kpng rule matched)');
  for (const s of t.path) out.push(`  ${s.where.padEnd(34)} ${s.rule}${s.why ? `\n  ${''.padEnd(34)}   -> ${s.why}` : ''}`);
  out.push('');
  const masq = t.masquerade ? 'masqueraded' : 'not masqueraded';
  switch (t.verdict) {
    case 'dnat':
      out.push(`verdict: DNAT to ${t.endpoints.length === 1 ? t.endpoints[0] : `one of ${t.endpoints.length} endpoints`}, ${masq}${t.service ? ` (${t.service})` : ''}`);
      if (t.choices.length > 1 || t.choices.some((c) => c.masquerade !== t.masquerade)) for (const c of t.choices) out.push(`  ${c.endpoint.padEnd(24)} ${pct(c.probability).padStart(6)}${c.masquerade !== t.masquerade ? (c.masquerade ? '  masqueraded' : '  not masqueraded') : ''}`);
      break;
    case 'accept':
      out.push(`verdict: accept${t.path.length ? '' : ' (kpng leaves it alone)'}`);
      break;
    default:
      out.push(`verdict: ${t.verdict.toUpperCase()}${t.service ? ` (${t.service})` : ''}`);
  }
  out.push(`why:     ${t.reasons.join(';\n         ')}`);
  if (t.unknown.length) out.push('', 'unknown rules (taken as not matching; the verdict may be wrong):', ...t.unknown.map((u) => `  ${u}`));
  // only when another table hooks in too: kpng's own chains alone are the path above
  if (t.hooks?.some((h) => h.chains.some((c) => c.owner !== 'kpng'))) out.push('', ...formatHookChains(t.hooks));
  return out.join('\n');
}

/** `-o json`: verdict, endpoints, masquerade first, then the rest. */
export function traceJSON(t: TraceResult & { source?: string }): string {
  const { verdict, endpoints, masquerade, ...rest } = t;
  return JSON.stringify({ verdict, endpoints, masquerade, ...rest }, null, 2);
}
