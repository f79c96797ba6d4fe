// Follows a packet through kpng's nftables table as the kernel lists it
// (`nft -j list table ip|ip6 kpng`, rule texts from `nft -a list table`).
// Only the expressions kpng's rulesets use are understood (payload, meta,
// fib, ct, numgen, concatenations, sets and maps, mark arithmetic, dnat,
// masquerade, reject, drop, jump/goto/return); any other rule is reported as
// unknown and taken as not matching, never guessed.
import { canonicalIP, cidrContains, ipToBig, parseCIDR } from '../api/ip.js';
import { UnknownRule as Unknown, asIP, cloneBranch, hostPort, walkChain, type Branch, type ChainOutcome, type Hook, type Packet, type RuleOutcome, type Step } from './packet.js';
import { nftWhy } from './reasons.js';

type J = any;

interface Chain {
  name: string;
  hook?: string;
  prio?: number;
  type?: string;
  rules: { handle: number; expr: J[]; text: string }[];
}

interface NftSet {
  name: string;
  elems: { key: J; value?: J; comment?: string }[];
}

/** the parsed table */
export class NftTable {
  readonly chains = new Map<string, Chain>();
  readonly sets = new Map<string, NftSet>();

  /** json: `nft -j list table FAMILY kpng`; text: `nft -a list table FAMILY kpng` (rule texts by handle) */
  constructor(json: string, text = '') {
    const texts = new Map<number, string>();
    for (const line of text.split('\n')) {
      const m = /^\s*(.*?)\s+# handle (\d+)\s*$/.exec(line);
      if (m && !/^(chain|table|set|map)\b/.test(m[1]!)) texts.set(Number(m[2]), m[1]!);
    }
    for (const o of (JSON.parse(json) as J).nftables ?? []) {
      if (o.chain) this.chains.set(o.chain.name, { name: o.chain.name, hook: o.chain.hook, prio: o.chain.prio, type: o.chain.type, rules: [] });
      else if (o.set || o.map) {
        const s = o.set ?? o.map;
        const elems = (s.elem ?? []).map((e: J) => {
          const [k, v] = o.map ? e : [e, undefined];
          const inner = k?.elem ?? undefined;
          return { key: inner ? inner.val : k, value: v, comment: inner?.comment };
        });
        this.sets.set(s.name, { name: s.name, elems });
      } else if (o.rule) {
        const c = this.chains.get(o.rule.chain);
        c?.rules.push({ handle: o.rule.handle, expr: o.rule.expr, text: texts.get(o.rule.handle) ?? renderExprs(o.rule.expr) });
      }
    }
  }

  /** the base chains of a hook, by priority */
  baseChains(hook: Hook): Chain[] {
    return [...this.chains.values()].filter((c) => c.hook === hook).sort((a, b) => (a.prio ?? 0) - (b.prio ?? 0));
  }
}


type Outcome = RuleOutcome;

/** Evaluates the table's base chains of one hook for one branch; nat chains are skipped once NAT was decided. */
export function runNftHook(t: NftTable, p: Packet, local: { has(ip: string): boolean }, unknown: string[], hook: Hook, b0: Branch, natDone: boolean): Branch[] {
  let live = [b0];
  for (const c of t.baseChains(hook)) {
    if (natDone && c.type === 'nat') continue;
    const next: Branch[] = [];
    for (const b of live) {
      for (const o of runChain(t, p, local, unknown, hook, c.name, b, 0)) {
        if (o.v === 'drop' || o.v === 'reject') next.push({ ...o.b, end: o.v });
        else next.push(o.b);
      }
    }
    live = next;
    if (live.every((b) => b.end)) break;
  }
  return live;
}

/** One chain: its outcomes per branch ('next'/'return' fall back to the caller). */
function runChain(t: NftTable, p: Packet, local: { has(ip: string): boolean }, unknown: string[], hook: Hook, name: string, b0: Branch, depth: number): ChainOutcome[] {
  const where = `${hook} ${name}`;
  return walkChain(t.chains.get(name)?.rules, name, b0, depth, {
    where,
    unknown,
    rule: (rule, b) => runRule(t, p, local, where, rule, b),
    call: (target, b, d) => runChain(t, p, local, unknown, hook, target, b, d),
  });
}

interface Env {
  p: Packet;
  b: Branch;
  local: { has(ip: string): boolean };
  numgen?: number;
}

/** A rule for one branch; a rule with numgen splits the branch, one per value. */
function runRule(t: NftTable, p: Packet, local: { has(ip: string): boolean }, where: string, rule: { expr: J[]; text: string }, b: Branch): Outcome[] {
  const mod = findNumgen(rule.expr);
  if (!mod) return [runExprs(t, { p, b: cloneBranch(b), local }, where, rule)];
  const out: Outcome[] = [];
  for (let n = 0; n < mod; n++) out.push(runExprs(t, { p, b: cloneBranch(b, b.probability / mod), local, numgen: n }, where, rule));
  // branches that did not match the rule are one branch again
  const missed = out.filter((o) => o.v === 'next');
  if (missed.length === mod) return [{ b, v: 'next' }];
  return out;
}

function findNumgen(x: J): number {
  if (!x || typeof x !== 'object') return 0;
  if (x.numgen) return x.numgen.mod;
  for (const v of Array.isArray(x) ? x : Object.values(x)) {
    const n = findNumgen(v);
    if (n) return n;
  }
  return 0;
}

function runExprs(t: NftTable, env: Env, where: string, rule: { expr: J[]; text: string }): Outcome {
  const b = env.b;
  // one step per rule that did something, with what it meant
  let shown = rule.text;
  const whys: string[] = [];
  const note = (why: string | undefined) => void (why && whys.push(why));
  const done = (o: Outcome): Outcome => {
    b.path.push({ where, rule: shown, ...(whys.length ? { why: whys.join('; ') } : {}) } satisfies Step);
    b.reasons.push(...whys);
    return o;
  };
  const ctx = { where, chain: where.split(' ')[1]!, text: rule.text };
  let acted = false;
  for (const x of rule.expr) {
    const k = Object.keys(x)[0]!;
    const v = x[k];
    switch (k) {
      case 'match':
        if (!match(t, env, v)) return { b, v: 'next' };
        break;
      case 'counter':
      case 'log':
      case 'notrack':
        break;
      case 'mangle': {
        const key = v.key?.meta?.key;
        if (key !== 'mark') throw new Unknown('a mangle other than the mark');
        b.mark = Number(value(t, env, v.value)) >>> 0;
        note(nftWhy.mark(ctx, b.mark));
        acted = true;
        break;
      }
      case 'masquerade':
        if (!where.startsWith('postrouting')) throw new Unknown('masquerade outside postrouting');
        b.masquerade = true;
        note(nftWhy.masquerade(ctx));
        return done({ b, v: 'accept' });
      case 'dnat': {
        const to = resolveDnat(t, env, v);
        if (!to) return { b, v: 'next' };
        b.dnat = to;
        b.dst = to.ip;
        b.dport = to.port;
        note(nftWhy.dnat(ctx, hostPort(to.ip, to.port)));
        return done({ b, v: 'accept' });
      }
      case 'vmap': {
        const hit = lookup(t, env, value(t, env, v.key), v.data);
        if (!hit) return { b, v: 'next' };
        const verdict = hit.value;
        const vk = Object.keys(verdict)[0]!;
        const target = verdict[vk]?.target;
        shown = `${rule.text}  =>  ${typeof v.data === 'string' ? v.data : 'map'} element ${renderKey(hit.key)}${hit.comment ? ` (${hit.comment})` : ''} : ${vk}${target ? ` ${target}` : ''}`;
        if (hit.comment && !b.service) b.service = hit.comment;
        note(nftWhy.vmap(ctx, typeof v.data === 'string' ? v.data.slice(1) : '', vk, target, hit.comment, env));
        return done(verdictOutcome(b, vk, target));
      }
      case 'jump':
      case 'goto':
        note(nftWhy.verdict(ctx, k, v.target));
        return done({ b, v: k, target: v.target });
      case 'return':
        note(nftWhy.verdict(ctx, 'return'));
        return done({ b, v: 'return' });
      case 'accept':
        return done({ b, v: 'accept' });
      case 'drop':
        note(nftWhy.verdict(ctx, 'drop'));
        return done({ b, v: 'drop' });
      case 'reject':
        note(nftWhy.verdict(ctx, 'reject'));
        return done({ b, v: 'reject' });
      case 'set': {
        // ClientIP affinity's "update @set { ip saddr ... }": bookkeeping only
        if (v.op !== 'update' && v.op !== 'add') throw new Unknown(`set ${v.op}`);
        break;
      }
      default:
        throw new Unknown(`statement ${k}`);
    }
  }
  return acted ? done({ b, v: 'next' }) : { b, v: 'next' };
}

function verdictOutcome(b: Branch, vk: string, target?: string): Outcome {
  if (vk === 'goto' || vk === 'jump') return { b, v: vk, target };
  if (vk === 'drop' || vk === 'reject' || vk === 'accept' || vk === 'return') return { b, v: vk };
  if (vk === 'continue') return { b, v: 'next' };
  throw new Unknown(`verdict ${vk}`);
}

/** The value of an expression for this branch; undefined where the packet has no such field. */
function value(t: NftTable, env: Env, x: J): unknown {
  if (typeof x === 'number' || typeof x === 'string') return x;
  if (!x || typeof x !== 'object') throw new Unknown('an empty expression');
  const { p, b } = env;
  if (x.payload) {
    const { protocol, field } = x.payload;
    if (protocol === 'ip' || protocol === 'ip6') {
      if ((protocol === 'ip') !== (p.family === 4)) return undefined;
      if (field === 'saddr') return p.src;
      if (field === 'daddr') return b.dst;
    }
    if (protocol === 'th' || protocol === p.proto) {
      if (field === 'dport') return b.dport;
      if (field === 'sport') return p.sport;
    }
    if (['tcp', 'udp', 'sctp'].includes(protocol)) return undefined;
    throw new Unknown(`payload ${protocol} ${field}`);
  }
  if (x.meta) {
    switch (x.meta.key) {
      case 'l4proto':
      case 'protocol':
        return p.proto;
      case 'mark':
        return b.mark;
      case 'iifname':
        return p.iif ?? '';
      case 'nfproto':
        return p.family === 4 ? 'ipv4' : 'ipv6';
    }
    throw new Unknown(`meta ${x.meta.key}`);
  }
  if (x.fib) {
    if (x.fib.result !== 'type') throw new Unknown(`fib ${x.fib.result}`);
    const ip = x.fib.flags?.includes('saddr') ? p.src : b.dst;
    return env.local.has(ip) ? 'local' : 'unicast';
  }
  if (x.ct) {
    // the packet is a new connection's first: state new; status dnat once DNATed
    if (x.ct.key === 'state') return ['new'];
    if (x.ct.key === 'status') return b.dnat ? ['dnat'] : [];
    throw new Unknown(`ct ${x.ct.key}`);
  }
  if (x.numgen) {
    if (env.numgen === undefined) throw new Unknown('numgen outside a split');
    return env.numgen;
  }
  if (Array.isArray(x.concat)) return x.concat.map((e: J) => value(t, env, e));
  for (const op of ['&', '|', '^']) {
    if (x[op]) {
      const [l, r] = x[op].map((e: J) => Number(value(t, env, e)));
      return op === '&' ? l & r : op === '|' ? l | r : l ^ r;
    }
  }
  throw new Unknown(`expression ${Object.keys(x)[0]}`);
}

function match(t: NftTable, env: Env, m: J): boolean {
  const left = value(t, env, m.left);
  if (left === undefined || (Array.isArray(left) && left.some((e) => e === undefined))) return false;
  const right = m.right;
  let hit: boolean;
  if (Array.isArray(left) && !Array.isArray(m.left?.concat)) {
    // flags (ct state, ct status): any in common
    const want = Array.isArray(right) ? right : right?.set ?? [right];
    hit = left.some((f) => want.includes(f));
  } else if (typeof right === 'string' && right.startsWith('@')) {
    hit = !!lookup(t, env, left, right);
  } else if (right?.set) {
    hit = right.set.some((e: J) => elemMatches(left, e));
  } else {
    hit = elemMatches(left, right);
  }
  switch (m.op) {
    case '==':
    case 'in':
      return hit;
    case '!=':
      return !hit;
  }
  throw new Unknown(`match operator ${m.op}`);
}

/** A set or map lookup (by name, "@x", or an anonymous one). */
function lookup(t: NftTable, env: Env, key: unknown, data: J): { key: J; value?: J; comment?: string } | undefined {
  if (key === undefined || (Array.isArray(key) && key.some((e) => e === undefined))) return undefined;
  if (typeof data === 'string') {
    const s = t.sets.get(data.slice(1));
    if (!s) throw new Unknown(`set ${data} not in the table`);
    return s.elems.find((e) => elemMatches(key, e.key));
  }
  if (data?.set) {
    for (const e of data.set) {
      const [k, v] = Array.isArray(e) ? e : [e, undefined];
      if (elemMatches(key, k)) return { key: k, value: v };
    }
    return undefined;
  }
  throw new Unknown('a map that is neither named nor anonymous');
}

/** One value against one element: equal, inside a prefix or a range; concatenations field by field. */
function elemMatches(v: unknown, e: J): boolean {
  if (e && typeof e === 'object' && e.elem) e = e.elem.val;
  if (e && typeof e === 'object' && Array.isArray(e.concat)) {
    const parts = e.concat as J[];
    return Array.isArray(v) && v.length === parts.length && parts.every((x, i) => elemMatches(v[i], x));
  }
  if (e && typeof e === 'object' && e.prefix) {
    const c = parseCIDR(`${e.prefix.addr}/${e.prefix.len}`);
    return !!c && typeof v === 'string' && !!asIP(v) && cidrContains(c, asIP(v)!);
  }
  if (e && typeof e === 'object' && e.range) {
    const [lo, hi] = e.range;
    if (typeof v === 'number') return v >= Number(lo) && v <= Number(hi);
    const ip = asIP(v);
    if (!ip || !asIP(lo) || !asIP(hi)) return false;
    const n = ipToBig(ip);
    return ipToBig(asIP(lo)!) <= n && n <= ipToBig(asIP(hi)!);
  }
  if (typeof e === 'number' || typeof v === 'number') return Number(v) === Number(e);
  const a = asIP(v);
  const c = asIP(e);
  if (a && c) return a === c;
  return String(v).toLowerCase() === String(e).toLowerCase();
}

/** Where a dnat statement sends the packet: a map lookup or a literal address (and port). */
function resolveDnat(t: NftTable, env: Env, d: J): { ip: string; port: number } | undefined {
  let addr: unknown;
  let port: unknown = d.port;
  if (d.addr?.map) {
    const hit = lookup(t, env, value(t, env, d.addr.map.key), d.addr.map.data);
    if (!hit) return undefined;
    const v = Array.isArray(hit.value?.concat) ? hit.value.concat : hit.value;
    if (Array.isArray(v)) [addr, port] = v;
    else addr = v;
  } else addr = d.addr;
  const ip = typeof addr === 'string' ? canonicalIP(addr) : undefined;
  if (!ip) throw new Unknown('a dnat to something other than an address');
  return { ip, port: port === undefined ? env.b.dport : Number(port) };
}

function renderKey(k: J): string {
  if (Array.isArray(k?.concat)) return k.concat.map(renderKey).join(' . ');
  if (k?.prefix) return `${k.prefix.addr}/${k.prefix.len}`;
  if (k?.range) return `${k.range[0]}-${k.range[1]}`;
  return String(k);
}

/** A rule without its text (no `nft -a` listing): its statements in short. */
function renderExprs(expr: J[]): string {
  return expr.map((x) => Object.keys(x)[0]).join(' ');
}
