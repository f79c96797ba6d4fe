// What the tracers share: the packet, the node's local addresses (the
// kernel's local routing table, what `fib ... type local` and `-m addrtype
// LOCAL` consult), a branch of the walk through the hooks, and the result.
import { canonicalIP, cidrContains, ipFamily, parseCIDR, type CIDR, type Family } from '../api/ip.js';

export type Proto = 'tcp' | 'udp' | 'sctp';

export interface Packet {
  readonly src: string;
  readonly dst: string;
  readonly proto: Proto;
  readonly sport: number;
  readonly dport: number;
  /** the interface it arrives on; unset: made on the node when src is a local address, else arriving */
  readonly iif?: string;
  readonly family: Family;
}

/** One thing a rule did to the packet (or decided), in the order it happened. */
export interface Step {
  /** hook and chain: "prerouting nat-prerouting", "nat KUBE-SERVICES" */
  readonly where: string;
  /** the rule as the kernel lists it, or a map element */
  readonly rule: string;
  /** what it means in Kubernetes' words */
  readonly why?: string;
}

export type Verdict = 'accept' | 'dnat' | 'drop' | 'reject';

export interface EndpointChoice {
  /** IP:PORT, [IPv6]:PORT */
  readonly endpoint: string;
  readonly probability: number;
  readonly masquerade: boolean;
}

export interface TraceResult {
  readonly backend: 'nft' | 'iptables';
  readonly packet: Packet;
  /** made on the node (output hook) or arriving (prerouting) */
  readonly origin: 'node' | 'arriving';
  readonly verdict: Verdict;
  /** every endpoint the packet may be sent to */
  readonly endpoints: string[];
  readonly choices: EndpointChoice[];
  readonly masquerade: boolean;
  /** the Service port it was addressed to (ns/name:port), when a rule named it */
  readonly service?: string;
  /** the reasons, in words, in path order */
  readonly reasons: string[];
  /** the rules of the first branch (with several endpoints, the first one's) */
  readonly path: Step[];
  /** rules the tracer does not understand (treated as not matching) */
  readonly unknown: string[];
}

export const hostPort = (ip: string, port: number) => (ip.includes(':') ? `[${ip}]:${port}` : `${ip}:${port}`);

/** The node's local addresses: the "local" routes of the kernel's local table. */
export class LocalAddresses {
  private readonly nets: CIDR[];
  constructor(locals: readonly string[]) {
    this.nets = locals.map((d) => parseCIDR(d.includes('/') ? d : `${d}/${ipFamily(canonicalIP(d) ?? d) === 4 ? 32 : 128}`)).filter((c): c is CIDR => !!c);
  }
  /** from `ip -j route show table local` (either family) */
  static fromRoutes(json: string): LocalAddresses {
    const routes = JSON.parse(json || '[]') as { type?: string; dst?: string }[];
    return new LocalAddresses(routes.filter((r) => r.type === 'local' && r.dst).map((r) => r.dst!));
  }
  has(ip: string): boolean {
    return this.nets.some((c) => cidrContains(c, ip));
  }
}

/** A packet's state along one branch of the walk. */
export interface Branch {
  dst: string;
  dport: number;
  mark: number;
  /** DNATed to (ip, port) */
  dnat?: { ip: string; port: number };
  /** the masquerade mark is set / masquerade happened */
  masquerade: boolean;
  probability: number;
  path: Step[];
  reasons: string[];
  service?: string;
  /** the end of the packet in kpng's rules */
  end?: 'drop' | 'reject';
}

export function cloneBranch(b: Branch, probability = b.probability): Branch {
  return { ...b, dnat: b.dnat && { ...b.dnat }, path: [...b.path], reasons: [...b.reasons], probability };
}

export function newBranch(p: Packet): Branch {
  return { dst: p.dst, dport: p.dport, mark: 0, masquerade: false, probability: 1, path: [], reasons: [] };
}

/** The hooks a packet goes through, given where it comes from and where it is going. */
export type Hook = 'prerouting' | 'input' | 'forward' | 'output' | 'postrouting';

/**
 * Walks the hooks: a packet made on the node goes output, postrouting, and,
 * when it is for the node itself, back in through input (its connection
 * still new); an arriving one goes prerouting, then input or forward (after
 * any DNAT), then postrouting when forwarded. Masquerading happens only in
 * postrouting. `run` evaluates one hook for one branch and may split it.
 */
export function walk(p: Packet, local: LocalAddresses, run: (hook: Hook, b: Branch, opts: { natDone: boolean }) => Branch[]): { origin: 'node' | 'arriving'; branches: Branch[] } {
  const origin: 'node' | 'arriving' = !p.iif && local.has(p.src) ? 'node' : 'arriving';
  let live = [newBranch(p)];
  const done: Branch[] = [];
  const step = (hook: Hook, bs: Branch[], natDone = false) => {
    const out: Branch[] = [];
    for (const b of bs) for (const r of run(hook, b, { natDone })) (r.end ? done : out).push(r);
    return out;
  };
  if (origin === 'node') {
    live = step('output', live);
    live = step('postrouting', live);
    const forMe = live.filter((b) => local.has(b.dst));
    const away = live.filter((b) => !local.has(b.dst));
    live = [...step('input', step('prerouting', forMe, true), true), ...away];
  } else {
    live = step('prerouting', live);
    const forMe = live.filter((b) => local.has(b.dst));
    const away = live.filter((b) => !local.has(b.dst));
    live = [...step('input', forMe), ...step('postrouting', step('forward', away))];
  }
  return { origin, branches: [...done, ...live] };
}

/** The result from the branches: DNAT when any branch is DNATed, else the first branch's end. */
export function summarize(backend: 'nft' | 'iptables', p: Packet, origin: 'node' | 'arriving', branches: Branch[], unknown: string[]): TraceResult {
  const dnat = branches.filter((b) => b.dnat && !b.end);
  const byEndpoint = new Map<string, { probability: number; masquerade: boolean }>();
  for (const b of dnat) {
    const k = hostPort(b.dnat!.ip, b.dnat!.port);
    const c = byEndpoint.get(k) ?? { probability: 0, masquerade: false };
    c.probability += b.probability;
    c.masquerade ||= b.masquerade;
    byEndpoint.set(k, c);
  }
  const first = dnat[0] ?? branches[0]!;
  const verdict: Verdict = dnat.length ? 'dnat' : (first.end ?? 'accept');
  const choices = [...byEndpoint].map(([endpoint, c]) => ({ endpoint, probability: Math.round(c.probability * 1e6) / 1e6, masquerade: c.masquerade }));
  // the first branch's own DNAT stands for all of them
  const reasons = choices.length > 1 ? first.reasons.map((r) => (r.startsWith('DNAT to ') ? `DNAT to one of ${choices.length} endpoints: ${choices.map((c) => c.endpoint).join(', ')}` : r)) : [...first.reasons];
  if (verdict === 'accept' && !first.dnat && !reasons.length) reasons.push("no kpng rule is for this packet (not a Service's address and port here): it goes on as if kpng were not there");
  return {
    backend,
    packet: p,
    origin,
    verdict,
    endpoints: choices.map((c) => c.endpoint),
    choices,
    masquerade: verdict === 'dnat' ? choices.some((c) => c.masquerade) : first.masquerade,
    ...(first.service ? { service: first.service } : {}),
    reasons,
    path: first.path,
    unknown: [...new Set(unknown)],
  };
}

/** "a.b.c.d" or "x::y" in canonical form, or undefined for anything else. */
export function asIP(v: unknown): string | undefined {
  return typeof v === 'string' && /^[0-9a-fA-F:.]+$/.test(v) && (v.includes('.') || v.includes(':')) ? canonicalIP(v) : undefined;
}

/** What one rule did to one branch: go on, leave the chain with a verdict, or call another chain. */
export type RuleOutcome = { b: Branch; v: 'next' | 'return' | 'accept' | 'drop' | 'reject' | 'goto' | 'jump'; target?: string };
/** A branch that left a chain: fell off its end ('next'), returned, or a verdict. */
export type ChainOutcome = { b: Branch; v: 'next' | 'return' | 'accept' | 'drop' | 'reject' };

/** The rule could not be read (kpng never writes it): listed, and taken as not matching. */
export class UnknownRule extends Error {}

/**
 * Follows a packet's branches through one chain, rule by rule, for the nft
 * and the iptables tracer alike. rule() evaluates one rule for a branch (and
 * may push split-off branches on pending); a jump runs the called chain and
 * comes back, a goto does not. Bounded: 10,000 steps, 16 chains deep.
 */
export function walkChain<R extends { text: string }>(
  rules: readonly R[] | undefined,
  name: string,
  b0: Branch,
  depth: number,
  o: { where: string; unknown: string[]; rule(rule: R, b: Branch, i: number, pending: { b: Branch; i: number }[]): RuleOutcome[]; call(target: string, b: Branch, depth: number): ChainOutcome[] },
): ChainOutcome[] {
  if (!rules || depth > 16) {
    o.unknown.push(`chain ${name} ${rules ? 'nested too deep' : 'not in the table'}`);
    return [{ b: b0, v: 'next' }];
  }
  const pending: { b: Branch; i: number }[] = [{ b: b0, i: 0 }];
  const out: ChainOutcome[] = [];
  let guard = 0;
  while (pending.length && guard++ < 10_000) {
    const { b, i } = pending.shift()!;
    if (i >= rules.length) {
      out.push({ b, v: 'next' });
      continue;
    }
    const rule = rules[i]!;
    let results: RuleOutcome[];
    try {
      results = o.rule(rule, b, i, pending);
    } catch (e) {
      if (!(e instanceof UnknownRule)) throw e;
      o.unknown.push(`${o.where}: ${rule.text} (${e.message})`);
      results = [{ b, v: 'next' }];
    }
    for (const r of results) {
      if (r.v === 'next') pending.push({ b: r.b, i: i + 1 });
      else if (r.v === 'jump' || r.v === 'goto') {
        for (const s of o.call(r.target!, r.b, depth + 1)) {
          if (s.v !== 'next' && s.v !== 'return') out.push(s);
          else if (r.v === 'jump') pending.push({ b: s.b, i: i + 1 });
          else out.push({ b: s.b, v: 'return' });
        }
      } else out.push({ b: r.b, v: r.v });
    }
  }
  return out;
}
