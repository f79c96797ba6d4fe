// Follows a packet through kpng's iptables rules as the kernel lists them
// (`iptables-save`): nat PREROUTING/OUTPUT/POSTROUTING and filter INPUT/
// FORWARD/OUTPUT, every chain they jump to. Only the matches and targets
// kpng's layout uses (src/backends/iptables/rules.ts) are understood; a rule
// with anything else is reported as unknown and taken as not matching.
import { canonicalIP, cidrContains, parseCIDR } from '../api/ip.js';
import { ruleArgs } from '../backends/iptables/rule-args.js';
import { UnknownRule as Unknown, cloneBranch, hostPort, walkChain, type Branch, type ChainOutcome, type Hook, type Packet, type RuleOutcome } from './packet.js';
import { iptWhy } from './reasons.js';

interface Opt {
  name: string;
  value?: string;
  neg: boolean;
  /** the -m module it belongs to */
  module?: string;
}

interface Rule {
  text: string;
  opts: Opt[];
  comment?: string;
  /** -j or -g and its target options */
  jump?: { goto: boolean; target: string; opts: Opt[] };
}

interface Chain {
  policy?: string;
  rules: Rule[];
}

/** options that take no value */
const FLAGS = new Set(['--rcheck', '--set', '--reap', '--rsource', '--random-fully', '--random', '--limit-iface-in', '--limit-iface-out', '--update']);
const SHORT: Record<string, string> = { '--source': '-s', '--destination': '-d', '--protocol': '-p', '--in-interface': '-i', '--out-interface': '-o', '--jump': '-j', '--goto': '-g', '--match': '-m' };

function parseRule(line: string): { chain: string; rule: Rule } {
  const args = ruleArgs(line);
  const chain = args[1]!;
  const opts: Opt[] = [];
  let jump: Rule['jump'];
  let module: string | undefined;
  let neg = false;
  for (let i = 2; i < args.length; i++) {
    let a = args[i]!;
    a = SHORT[a] ?? a;
    if (a === '!') {
      neg = true;
      continue;
    }
    if (a === '-m') {
      module = args[++i];
      continue;
    }
    if (a === '-j' || a === '-g') {
      jump = { goto: a === '-g', target: args[++i]!, opts: [] };
      module = undefined;
      continue;
    }
    let value: string | undefined;
    if (!FLAGS.has(a)) {
      value = args[++i];
      // "-s !1.2.3.4" (old form) and "! -s 1.2.3.4" both negate
      if (value?.startsWith('!')) {
        neg = !neg;
        value = value.slice(1);
      }
    }
    const o: Opt = { name: a, value, neg, module: a.startsWith('--') ? module : undefined };
    (jump ? jump.opts : opts).push(o);
    neg = false;
  }
  return { chain, rule: { text: line, opts, comment: opts.find((o) => o.name === '--comment')?.value, jump } };
}

/** The rules of one family, from `iptables-save` (or `ip6tables-save`). */
export class IptablesRules {
  readonly tables = new Map<string, Map<string, Chain>>();
  constructor(save: string) {
    let table: Map<string, Chain> | undefined;
    for (const line of save.split('\n')) {
      if (line.startsWith('*')) this.tables.set(line.slice(1).trim(), (table = new Map()));
      else if (line.startsWith(':') && table) {
        const [name, policy] = line.slice(1).split(/\s+/);
        table.set(name!, { policy: policy === '-' ? undefined : policy, rules: [] });
      } else if (line.startsWith('-A ') && table) {
        const { chain, rule } = parseRule(line);
        (table.get(chain) ?? table.set(chain, { rules: [] }).get(chain)!).rules.push(rule);
      }
    }
  }
  /** kpng's rules are there: nat KUBE-SERVICES exists */
  get hasKpng(): boolean {
    return !!this.tables.get('nat')?.has('KUBE-SERVICES');
  }
}


/** table and built-in chain per hook, in priority order (nat before filter on output) */
const HOOK_CHAINS: Record<Hook, [string, string][]> = {
  prerouting: [['nat', 'PREROUTING']],
  input: [['filter', 'INPUT']],
  forward: [['filter', 'FORWARD']],
  output: [
    ['nat', 'OUTPUT'],
    ['filter', 'OUTPUT'],
  ],
  postrouting: [['nat', 'POSTROUTING']],
};

type Outcome = ChainOutcome;

export function runIptablesHook(r: IptablesRules, p: Packet, local: { has(ip: string): boolean }, unknown: string[], hook: Hook, b0: Branch, natDone: boolean): Branch[] {
  let live = [b0];
  for (const [table, chain] of HOOK_CHAINS[hook]) {
    if (natDone && table === 'nat') continue;
    const t = r.tables.get(table);
    if (!t?.has(chain)) continue;
    const next: Branch[] = [];
    for (const b of live) {
      for (const o of runChain(t, table, p, local, unknown, chain, b, 0)) {
        if (o.v === 'drop' || o.v === 'reject') next.push({ ...o.b, end: o.v });
        else if ((o.v === 'next' || o.v === 'return') && t.get(chain)!.policy === 'DROP') next.push({ ...o.b, end: 'drop' });
        else next.push(o.b);
      }
    }
    live = next;
    if (live.every((b) => b.end)) break;
  }
  return live;
}

function runChain(t: Map<string, Chain>, table: string, p: Packet, local: { has(ip: string): boolean }, unknown: string[], name: string, b0: Branch, depth: number): ChainOutcome[] {
  const where = `${table} ${name}`;
  return walkChain(t.get(name)?.rules, where, b0, depth, {
    where,
    unknown,
    rule: (rule, b, i, pending) => {
      const out: RuleOutcome[] = [];
      for (const { b: mb } of matches(rule, p, local, b, pending, i, where)) {
        const j = rule.jump;
        if (!j) {
          out.push({ b: mb, v: 'next' });
          continue;
        }
        const step = (why?: string) => {
          mb.path.push({ where, rule: rule.text.replace(/^-A \S+ /, ''), ...(why ? { why } : {}) });
          if (why) mb.reasons.push(why);
        };
        if (t.has(j.target)) {
          step(iptWhy.jump(name, j.target, rule.comment));
          noteService(mb, name, rule.comment);
          out.push({ b: mb, v: j.goto ? 'goto' : 'jump', target: j.target });
          continue;
        }
        try {
          const v = target(j, table, mb);
          noteService(mb, name, rule.comment);
          step(iptWhy.terminal(name, j.target, rule.comment));
          out.push({ b: mb, v });
        } catch (e) {
          if (!(e instanceof Unknown)) throw e;
          unknown.push(`${where}: ${rule.text} (${e.message})`);
          out.push({ b: mb, v: 'next' });
        }
      }
      return out;
    },
    call: (target, b, d) => runChain(t, table, p, local, unknown, target, b, d),
  });
}

/**
 * The branches of b that match the rule. A `-m statistic` rule splits b: the
 * part that does not match goes on to the next rule (pushed on pending).
 */
function matches(rule: Rule, p: Packet, local: { has(ip: string): boolean }, b: Branch, pending: { b: Branch; i: number }[], i: number, where: string): { b: Branch }[] {
  let probability = 1;
  for (const o of rule.opts) {
    let ok: boolean;
    switch (o.name) {
      case '-s':
        ok = inNet(p.src, o.value!);
        break;
      case '-d':
        ok = inNet(b.dst, o.value!);
        break;
      case '-p':
        ok = o.value!.toLowerCase() === p.proto;
        break;
      case '-i':
        ok = !!p.iif && p.iif === o.value;
        break;
      case '--comment':
        ok = true;
        break;
      case '--dport':
      case '--sport':
        if (!['tcp', 'udp', 'sctp'].includes(o.module ?? '')) throw new Unknown(`${o.name} of -m ${o.module}`);
        ok = o.module === p.proto && String(o.name === '--dport' ? b.dport : p.sport) === o.value;
        break;
      case '--src-type':
      case '--dst-type':
        if (o.value !== 'LOCAL') throw new Unknown(`addrtype ${o.value}`);
        ok = local.has(o.name === '--src-type' ? p.src : b.dst);
        break;
      case '--mode':
        if (o.value !== 'random') throw new Unknown(`statistic mode ${o.value}`);
        ok = true;
        break;
      case '--probability':
        probability = Number(o.value);
        ok = true;
        break;
      case '--rcheck':
        // ClientIP affinity: a client seen lately goes back to its endpoint;
        // the tracer takes the client as new (the recent lists are not read)
        ok = false;
        break;
      case '--set':
      case '--seconds':
      case '--reap':
      case '--name':
      case '--mask':
      case '--rsource':
        ok = true;
        break;
      case '--mark': {
        const [v, m] = o.value!.split('/').map((x) => Number(x));
        ok = ((b.mark & (m ?? 0xffffffff)) >>> 0) === v;
        break;
      }
      case '--ctstate': {
        const states = new Set(['NEW', ...(b.dnat ? ['DNAT'] : [])]);
        ok = o.value!.split(',').some((s) => states.has(s));
        break;
      }
      default:
        throw new Unknown(`option ${o.name}`);
    }
    if (o.neg) ok = !ok;
    if (!ok) {
      pending.push({ b, i: i + 1 });
      return [];
    }
  }
  if (probability >= 1) return [{ b }];
  const yes = cloneBranch(b, b.probability * probability);
  const no = cloneBranch(b, b.probability * (1 - probability));
  no.path.push({ where, rule: rule.text.replace(/^-A \S+ /, ''), why: `not taken (probability ${1 - probability})` });
  pending.push({ b: no, i: i + 1 });
  return [{ b: yes }];
}

/** the Service port a dispatch rule names in its comment ("ns/svc:port cluster IP") */
function noteService(b: Branch, chain: string, comment: string | undefined) {
  if (b.service || !comment || !['KUBE-SERVICES', 'KUBE-NODEPORTS', 'KUBE-EXTERNAL-SERVICES'].includes(chain)) return;
  const m = /^([a-z0-9.-]+\/[a-z0-9.-]+(?::[^ ]*)?)(?: |$)/.exec(comment);
  if (m) b.service = m[1];
}

function inNet(ip: string, v: string): boolean {
  const c = parseCIDR(v.includes('/') ? v : `${v}/${v.includes(':') ? 128 : 32}`);
  if (!c) throw new Unknown(`address ${v}`);
  return cidrContains(c, ip);
}

/** A built-in target: its effect on the branch, and whether the chain goes on. */
function target(j: NonNullable<Rule['jump']>, table: string, b: Branch): Outcome['v'] {
  const opt = (n: string) => j.opts.find((o) => o.name === n)?.value;
  switch (j.target) {
    case 'ACCEPT':
      return 'accept';
    case 'DROP':
      return 'drop';
    case 'REJECT':
      return 'reject';
    case 'RETURN':
      return 'return';
    case 'MARK': {
      const x = opt('--set-xmark');
      if (!x) throw new Unknown('MARK without --set-xmark');
      const [v, m] = x.split('/').map((s) => Number(s));
      b.mark = ((b.mark & ~(m ?? 0xffffffff)) ^ v!) >>> 0;
      return 'next';
    }
    case 'DNAT': {
      const to = opt('--to-destination');
      const m = to && /^\[?([0-9a-fA-F:.]+?)\]?(?::(\d+))?$/.exec(to);
      const ip = m ? canonicalIP(m[1]!) : undefined;
      if (!ip || table !== 'nat') throw new Unknown(`DNAT ${to}`);
      b.dnat = { ip, port: m![2] ? Number(m![2]) : b.dport };
      b.dst = ip;
      b.dport = b.dnat.port;
      b.reasons.push(`DNAT to ${hostPort(ip, b.dport)}`);
      return 'accept';
    }
    case 'MASQUERADE':
      // the kernel takes MASQUERADE in nat POSTROUTING only
      if (table !== 'nat') throw new Unknown('MASQUERADE outside nat');
      b.masquerade = true;
      return 'accept';
  }
  throw new Unknown(`target ${j.target}`);
}

