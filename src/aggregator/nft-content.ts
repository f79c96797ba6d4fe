// A tenant's nftables content as kpng writes it: the tables, chains, rules
// and typed sets and maps a Declare gives, checked and put in the form kpng
// renders (validated before anything reaches nft), and the elements, in the
// form nft lists them back (so that comparing what is declared with what
// the kernel holds is comparing strings).
//
// What the checks keep a tenant from: rule text that ends its command and
// starts another (';', a newline, '#', an open brace or quote), jumps and
// set references outside its own table's chains and sets (nft scopes them
// to the rule's table anyway: the checks give a clear error instead of the
// kernel's), marks that change kpng's own mark bits, hooks the allow-list
// does not give it, and more than its quotas.
//
// kpng tags each rule, set and map with a comment ("kpng:<hash>" of what
// the tenant wrote): the kernel lists the comment back, so a listing says
// whether a chain holds exactly the declared rules (nft prints rules in its
// own normal form, not as they were written), as Felix tracks its iptables
// rules by hash comments.
import { createHash } from 'node:crypto';
import { canonicalIP, parseCIDR } from '../api/ip.js';
import type { NftablesContent, NftElement, NftSet, NftTable, NftChain } from '../api/gen/kpng/aggregator/v1/aggregator_pb.js';
import { kernelTableName, objectNameProblem, tableNameProblem } from './names.js';

export type NftFamily = 'inet' | 'ip' | 'ip6';
const NFT_FAMILIES: readonly NftFamily[] = ['inet', 'ip', 'ip6'];
export const HOOKS = ['prerouting', 'input', 'forward', 'output', 'postrouting'] as const;
export type HookName = (typeof HOOKS)[number];

/** A tenant's change kpng will not take: the message goes back to the tenant as is. */
export class TenantError extends Error {}

export interface NftBaseHook {
  readonly type: 'filter' | 'nat' | 'route';
  readonly hook: HookName;
  readonly priority: number;
  readonly policy: 'accept' | 'drop';
}

export interface TenantNftChain {
  readonly name: string;
  readonly hook?: NftBaseHook;
  /** each rule as written to the kernel: the tenant's text, then kpng's tag (and the tenant's comment) */
  readonly rules: readonly string[];
  /** the tags of the rules, in order: what a listing shows of them */
  readonly tags: readonly string[];
  /** hook and rules: equal digests, equal chains */
  readonly digest: string;
}

export interface TenantNftSet {
  readonly name: string;
  readonly kind: 'set' | 'map';
  /** the declaration, as between braces, with kpng's tag comment */
  readonly body: string;
  /** what a listing shows of the declaration (its comment) */
  readonly tag: string;
  readonly interval: boolean;
  /** the packet path adds elements (meters, "update @set"): those are not the tenant's to reconcile */
  readonly dynamic: boolean;
  readonly timeout: boolean;
  /** the elements' default timeout (0: none) */
  readonly timeoutMs: number;
  /** each key component's type where kpng knows it (addresses are written canonically) */
  readonly keyTypes: readonly (string | undefined)[];
  /** a data map's value components' types, likewise */
  readonly dataTypes: readonly (string | undefined)[];
  readonly verdictMap: boolean;
}

export interface TenantNftTable {
  readonly family: NftFamily;
  /** the tenant's name for it */
  readonly name: string;
  /** kpng.<tenant>.<name> */
  readonly kernelName: string;
  readonly chains: ReadonlyMap<string, TenantNftChain>;
  readonly sets: ReadonlyMap<string, TenantNftSet>;
  /** its regular chains (what jumps and verdict maps may reach) */
  readonly regular: ReadonlySet<string>;
}

/** An element in the form nft lists it. */
export interface TenantElement {
  readonly key: string;
  /** a map's value; '' in a set */
  readonly value: string;
  /** 0: the set's timeout, or none */
  readonly timeoutMs: number;
}

/** set id (family, kernel table, set: as transactions name a set) -> key -> element */
export type ElementsBySet = Map<string, Map<string, TenantElement>>;

export const setId = (family: NftFamily, kernelTable: string, set: string): string => `${family} ${kernelTable} ${set}`;
const tableId = (family: string, name: string): string => `${family} ${name}`;

export interface Quotas {
  readonly tables: number;
  readonly chains: number;
  readonly rules: number;
  readonly sets: number;
  readonly elements: number;
}

/** What a tenant may do, besides its content's own rules. */
export interface NftPolicy {
  readonly tenant: string;
  /** the hooks the allow-list gives it; undefined: any */
  readonly hooks?: ReadonlySet<string>;
  readonly quotas: Quotas;
  /** mark bits kpng uses (the masquerade bit): a tenant's rules leave them as they are */
  readonly reservedMark: number;
}

export interface NftDeclaration {
  /** by tableId(family, tenant's name) */
  readonly tables: ReadonlyMap<string, TenantNftTable>;
  readonly elements: ElementsBySet;
  readonly counts: { chains: number; rules: number; sets: number; elements: number };
}

const digestOf = (...parts: string[]): string => createHash('sha256').update(parts.join('\0')).digest('hex').slice(0, 12);
const TAG_PREFIX = 'kpng:';
/** the tag in a listed comment ("kpng:<hash> the tenant's comment"), or '' */
export const tagOfComment = (comment: string | undefined): string => (comment?.startsWith(TAG_PREFIX) ? comment.split(' ', 1)[0]! : '');
/** a chain's identity from its hook ("" for a regular chain) and its rules' tags: the same for a declaration and a listing */
export const chainDigest = (hook: string, tags: readonly string[]): string => digestOf(hook, ...tags);
export const hookText = (h: NftBaseHook | undefined): string => (h ? `${h.type} ${h.hook} ${h.priority} ${h.policy}` : '');

/**
 * The kernel's check refused a declaration: nft cannot take some words as
 * names (drop, counter, fwd, ... depending on its version) and says only
 * "syntax error, unexpected drop": name the chain or set it is.
 */
export function nameHint(d: NftDeclaration, message: string): string {
  const m = /unexpected ([A-Za-z][A-Za-z0-9_-]*), expecting string/.exec(message);
  if (!m) return message;
  for (const t of d.tables.values()) {
    if (t.chains.has(m[1]!) || t.sets.has(m[1]!)) return `${m[1]} (in table ${t.family} ${t.name}) is a word nft reserves: give the chain or set another name. ${message}`;
  }
  return message;
}

/** Checks a Declare's nftables content against the tenant's policy; throws TenantError with what is wrong. */
export function declareNft(content: NftablesContent, p: NftPolicy): NftDeclaration {
  if (content.tables.length > p.quotas.tables) throw new TenantError(`quota: ${content.tables.length} tables, at most ${p.quotas.tables} for tenant ${p.tenant}`);
  const tables = new Map<string, TenantNftTable>();
  const elements: ElementsBySet = new Map();
  const counts = { chains: 0, rules: 0, sets: 0, elements: 0 };
  for (const t of content.tables) {
    const table = nftTable(t, p, elements);
    const id = tableId(table.family, table.name);
    if (tables.has(id)) throw new TenantError(`table ${id} is declared twice`);
    tables.set(id, table);
    counts.chains += table.chains.size;
    counts.sets += table.sets.size;
    for (const c of table.chains.values()) counts.rules += c.rules.length;
  }
  for (const m of elements.values()) counts.elements += m.size;
  for (const k of ['chains', 'rules', 'sets', 'elements'] as const) {
    if (counts[k] > p.quotas[k]) throw new TenantError(`quota: ${counts[k]} ${k}, at most ${p.quotas[k]} for tenant ${p.tenant}`);
  }
  return { tables, elements, counts };
}

function nftTable(t: NftTable, p: NftPolicy, elements: ElementsBySet): TenantNftTable {
  if (!NFT_FAMILIES.includes(t.family as NftFamily)) throw new TenantError(`table ${t.name}: family ${JSON.stringify(t.family)}: inet, ip or ip6`);
  const bad = tableNameProblem(t.name);
  if (bad) throw new TenantError(bad);
  const family = t.family as NftFamily;
  const kernelName = kernelTableName(p.tenant, t.name);
  const where = `table ${family} ${t.name}`;
  const sets = new Map<string, TenantNftSet>();
  for (const s of t.sets) {
    const set = nftSet(s, where);
    if (sets.has(set.name)) throw new TenantError(`${where}: set ${set.name} is declared twice`);
    sets.set(set.name, set);
  }
  const declared = new Map<string, NftChain>();
  for (const c of t.chains) {
    const bad = objectNameProblem('chain', c.name);
    if (bad) throw new TenantError(`${where}: ${bad}`);
    if (declared.has(c.name)) throw new TenantError(`${where}: chain ${c.name} is declared twice`);
    if (sets.has(c.name)) throw new TenantError(`${where}: ${c.name} is both a chain and a set`);
    declared.set(c.name, c);
  }
  const scope: Scope = { where, regular: new Set([...declared.values()].filter((c) => !c.hook).map((c) => c.name)), sets, reservedMark: p.reservedMark };
  const chains = new Map<string, TenantNftChain>();
  for (const c of declared.values()) chains.set(c.name, nftChain(c, p, scope));
  for (const s of t.sets) {
    const set = sets.get(s.name)!;
    const id = setId(family, kernelName, set.name);
    elements.set(id, elementMap(s.elements, set, scope, `${where} set ${set.name}`));
  }
  return { family, name: t.name, kernelName, chains, sets, regular: scope.regular };
}

function nftChain(c: NftChain, p: NftPolicy, scope: Scope): TenantNftChain {
  const where = `${scope.where} chain ${c.name}`;
  let hook: NftBaseHook | undefined;
  if (c.hook) {
    const h = c.hook;
    const type = (h.type || 'filter') as NftBaseHook['type'];
    if (!['filter', 'nat', 'route'].includes(type)) throw new TenantError(`${where}: type ${JSON.stringify(h.type)}: filter, nat or route`);
    if (!HOOKS.includes(h.hook as HookName)) throw new TenantError(`${where}: hook ${JSON.stringify(h.hook)}: ${HOOKS.join(', ')}`);
    if (type === 'route' && h.hook !== 'output') throw new TenantError(`${where}: a route chain hooks output only`);
    if (type === 'nat' && h.hook === 'forward') throw new TenantError(`${where}: a nat chain cannot hook forward`);
    if (p.hooks && !p.hooks.has(h.hook)) throw new TenantError(`allow-list: tenant ${p.tenant} may not hook ${h.hook} (it may hook ${[...p.hooks].join(', ') || 'nothing'})`);
    const policy = (h.policy || 'accept') as NftBaseHook['policy'];
    if (policy !== 'accept' && policy !== 'drop') throw new TenantError(`${where}: policy ${JSON.stringify(h.policy)}: accept or drop`);
    hook = { type, hook: h.hook as HookName, priority: h.priority, policy };
  }
  const rules: string[] = [];
  const tags: string[] = [];
  for (const [i, r] of c.rules.entries()) {
    const text = ruleText(r.rule, `${where} rule ${i + 1}`, scope);
    const comment = r.comment;
    if (comment && (comment.length > 96 || !/^[\x20-\x7e]*$/.test(comment) || /["\\]/.test(comment))) throw new TenantError(`${where} rule ${i + 1}: comment: at most 96 printable characters, no double quote or backslash`);
    const tag = TAG_PREFIX + digestOf(text, comment);
    tags.push(tag);
    rules.push(`${text} comment "${tag}${comment ? ` ${comment}` : ''}"`);
  }
  return { name: c.name, hook, rules, tags, digest: chainDigest(hookText(hook), tags) };
}

/** what a rule may refer to */
interface Scope {
  readonly where: string;
  /** the table's regular chains (a jump's targets) */
  readonly regular: ReadonlySet<string>;
  readonly sets: ReadonlyMap<string, TenantNftSet>;
  readonly reservedMark: number;
}

/** Checks a rule's text; returns it with its whitespace made single spaces. */
function ruleText(raw: string, where: string, scope: Scope): string {
  const text = raw.trim().replace(/[ \t]+/g, ' ');
  if (!text) throw new TenantError(`${where}: empty`);
  if (text.length > 4096) throw new TenantError(`${where}: longer than 4096 characters`);
  if (!/^[\x20-\x7e]*$/.test(text)) throw new TenantError(`${where}: only printable ASCII on one line`);
  const bare = outsideQuotes(text, where);
  const forbidden = /[;#\\$`]/.exec(bare);
  if (forbidden) throw new TenantError(`${where}: ${JSON.stringify(forbidden[0])} is not allowed in a rule (one rule, no command separator, comment or variable)`);
  balanced(bare, where);
  if (/\bcomment\b/.test(bare)) throw new TenantError(`${where}: give a rule's comment in NftRule.comment: kpng tags each rule with one`);
  for (const m of bare.matchAll(/\b(jump|goto)\s+([^\s,}]+)/g)) {
    const target = m[2]!;
    if (!scope.regular.has(target)) throw new TenantError(`${where}: ${m[1]} ${target}: not a regular chain of this table (${[...scope.regular].join(', ') || 'it has none'})`);
  }
  for (const m of bare.matchAll(/@([A-Za-z_][A-Za-z0-9_-]*)(,?)/g)) {
    // @nh,16,8 and the like are raw payload, not sets
    if (m[2]) continue;
    if (!scope.sets.has(m[1]!)) throw new TenantError(`${where}: @${m[1]}: no such set or map in this table`);
  }
  markSets(bare, where, scope.reservedMark);
  return text;
}

/** the text with quoted strings blanked (a string cannot end a command); throws on an open quote */
function outsideQuotes(text: string, where: string): string {
  let out = '';
  let quoted = false;
  for (const ch of text) {
    if (ch === '"') {
      quoted = !quoted;
      out += '"';
    } else out += quoted ? '_' : ch;
  }
  if (quoted) throw new TenantError(`${where}: a quote is not closed`);
  return out;
}

function balanced(bare: string, where: string): void {
  const open = '{[(';
  const close = '}])';
  const stack: string[] = [];
  for (const ch of bare) {
    if (open.includes(ch)) stack.push(close[open.indexOf(ch)]!);
    else if (close.includes(ch) && stack.pop() !== ch) throw new TenantError(`${where}: ${ch} does not close anything`);
  }
  if (stack.length) throw new TenantError(`${where}: ${stack.length} bracket(s) not closed`);
}

const MARK_OPS: Record<string, 'and' | 'or' | 'xor'> = { and: 'and', '&': 'and', or: 'or', '|': 'or', xor: 'xor', '^': 'xor' };

/**
 * A rule that sets the packet mark keeps kpng's bits: only
 * "meta mark set meta mark <op> <bits> [<op> <bits>]" with and-masks that
 * keep them and or/xor values that do not touch them.
 */
function markSets(bare: string, where: string, reserved: number): void {
  const tokens = bare.split(/\s+/);
  const refuse = () => {
    throw new TenantError(`${where}: a mark is set only as "meta mark set meta mark and|or|xor <bits>" leaving kpng's mark bits (0x${(reserved >>> 0).toString(16)}) as they are`);
  };
  for (let at = 1; at < tokens.length; at++) {
    // the packet's mark (meta mark, or mark); a connection's (ct mark) is not kpng's
    if (tokens[at] !== 'set' || tokens[at - 1] !== 'mark' || tokens[at - 2] === 'ct') continue;
    let i = at + 1;
    if (tokens[i] === 'meta') i++;
    if (tokens[i++] !== 'mark') refuse();
    while (i + 1 < tokens.length && MARK_OPS[tokens[i]!]) {
      const op = MARK_OPS[tokens[i]!]!;
      const bits = tokens[i + 1]!;
      if (!/^(0x[0-9a-fA-F]{1,8}|\d{1,10})$/.test(bits)) refuse();
      const v = Number(bits);
      if (op === 'and' ? (v & reserved) >>> 0 !== reserved >>> 0 : (v & reserved) !== 0) refuse();
      i += 2;
    }
  }
}

// --- sets, maps and their elements

const SET_FLAGS = new Set(['interval', 'timeout', 'dynamic', 'constant']);
/** key types kpng writes canonically, from a typeof expression */
const TYPEOF_TYPES: [RegExp, string][] = [
  [/^ip [sd]addr$/, 'ipv4_addr'],
  [/^ip6 [sd]addr$/, 'ipv6_addr'],
  [/^(meta l4proto|ip protocol|ip6 nexthdr)$/, 'inet_proto'],
  [/^(th|tcp|udp|sctp|udplite|dccp) [sd]port$/, 'inet_service'],
];

function nftSet(s: NftSet, table: string): TenantNftSet {
  const bad = objectNameProblem('set', s.name);
  if (bad) throw new TenantError(`${table}: ${bad}`);
  const where = `${table} set ${s.name}`;
  const type = s.type.trim().replace(/\s+/g, ' ');
  const typeofKey = type.startsWith('typeof ');
  const typeRe = typeofKey ? /^typeof [a-z0-9_ .]+$/ : /^[a-z][a-z0-9_]*( \. [a-z][a-z0-9_]*)*$/;
  if (!typeRe.test(type)) throw new TenantError(`${where}: type ${JSON.stringify(s.type)}: nft's type names joined by " . " (ipv4_addr . inet_service), or "typeof <expression>"`);
  const typesOf = (expr: string, typeofExpr: boolean) => (typeofExpr ? expr.split(' . ').map((e) => TYPEOF_TYPES.find(([re]) => re.test(e))?.[1]) : expr.split(' . '));
  const keyTypes = typesOf(typeofKey ? type.slice(7) : type, typeofKey);
  const data = s.map.trim().replace(/\s+/g, ' ').replace(/^typeof /, '');
  if (data && !/^[a-z][a-z0-9_ .]*$/.test(data)) throw new TenantError(`${where}: map ${JSON.stringify(s.map)}: a type or expression`);
  for (const f of s.flags) if (!SET_FLAGS.has(f)) throw new TenantError(`${where}: flag ${JSON.stringify(f)}: ${[...SET_FLAGS].join(', ')}`);
  const flags = [...new Set(s.flags)].sort();
  const timeout = flags.includes('timeout') || s.timeoutMs > 0;
  if (s.timeoutMs > 0 && !flags.includes('timeout')) flags.push('timeout');
  const decl = [`${typeofKey ? type : `type ${type}`}${data ? ` : ${data}` : ''} ;`];
  if (flags.length) decl.push(`flags ${flags.join(',')} ;`);
  if (s.timeoutMs > 0) decl.push(`timeout ${s.timeoutMs}ms ;`);
  const tag = TAG_PREFIX + digestOf(...decl);
  return {
    name: s.name,
    kind: data ? 'map' : 'set',
    body: `${decl.join(' ')} comment "${tag}" ;`,
    tag,
    interval: flags.includes('interval'),
    dynamic: flags.includes('dynamic'),
    timeout,
    timeoutMs: s.timeoutMs,
    keyTypes,
    dataTypes: data && data !== 'verdict' ? typesOf(data, typeofKey || s.map.trim().startsWith('typeof ')) : [],
    verdictMap: data === 'verdict',
  };
}

function elementMap(list: readonly NftElement[], set: TenantNftSet, scope: Pick<Scope, 'regular'>, where: string): Map<string, TenantElement> {
  const out = new Map<string, TenantElement>();
  for (const e of list) {
    const el = element(e, set, scope, where);
    out.set(el.key, el);
  }
  return out;
}

/** An element in nft's listed form; throws TenantError. */
export function element(e: Pick<NftElement, 'key' | 'value' | 'timeoutMs'>, set: TenantNftSet, scope: Pick<Scope, 'regular'>, where: string): TenantElement {
  const key = elementKey(e.key, set, where);
  let value = e.value.trim().replace(/\s+/g, ' ');
  if (set.kind === 'set' && value) throw new TenantError(`${where}: element ${key}: a set's elements have no value`);
  if (set.kind === 'map') {
    if (!value) throw new TenantError(`${where}: element ${key}: a map's elements need a value`);
    if (set.verdictMap) {
      const m = /^(accept|drop|continue|return)$|^(jump|goto) ([A-Za-z][A-Za-z0-9_-]*)$/.exec(value);
      if (!m) throw new TenantError(`${where}: element ${key}: verdict ${JSON.stringify(value)}: accept, drop, continue, return, jump <chain> or goto <chain>`);
      if (m[3] && !scope.regular.has(m[3])) throw new TenantError(`${where}: element ${key}: ${value}: not a regular chain of this table`);
    } else value = components(value, set.dataTypes, false, where);
  }
  if (e.timeoutMs > 0 && !set.timeout) throw new TenantError(`${where}: element ${key}: a timeout needs the set's "timeout" flag`);
  return { key, value, timeoutMs: e.timeoutMs };
}

export function elementKey(raw: string, set: TenantNftSet, where: string): string {
  return components(raw, set.keyTypes, set.interval, where);
}

/** "a . b . c" with each part checked and, for addresses, in the canonical form nft lists */
function components(raw: string, types: readonly (string | undefined)[], interval: boolean, where: string): string {
  const parts = raw.trim().split(/\s+\.\s+/);
  if (types.length && parts.length !== types.length) throw new TenantError(`${where}: element ${JSON.stringify(raw)}: ${types.length} part(s) joined by " . " expected`);
  return parts.map((p, i) => component(p, types[i], interval, where)).join(' . ');
}

function component(part: string, type: string | undefined, interval: boolean, where: string): string {
  const known = type === 'ipv4_addr' || type === 'ipv6_addr' || type === 'inet_service';
  const bad = () =>
    new TenantError(`${where}: element part ${JSON.stringify(part)}${type ? ` is not of type ${type}` : ''}${known ? (interval ? ' (an address, prefix or range)' : '') : ': letters, digits and _ . : / - * only, or a quoted name'}`);
  if (type === 'ipv4_addr' || type === 'ipv6_addr') {
    const family = type === 'ipv4_addr' ? 4 : 6;
    const range = part.split('-');
    if (interval && range.length === 2) {
      const [a, b] = range.map((x) => canonicalIP(x));
      if (!a || !b || a.includes(':') !== (family === 6) || b.includes(':') !== (family === 6)) throw bad();
      return `${a}-${b}`;
    }
    if (interval && part.includes('/')) {
      const c = parseCIDR(part);
      if (!c || c.family !== family) throw bad();
      if (c.ip !== canonicalIP(part.split('/')[0]!)) throw new TenantError(`${where}: element ${part}: host bits set (${c.ip}/${c.prefix}?)`);
      // nft lists a whole-address prefix as the address
      return c.prefix === (family === 4 ? 32 : 128) ? c.ip : `${c.ip}/${c.prefix}`;
    }
    const ip = canonicalIP(part);
    if (!ip || ip.includes(':') !== (family === 6)) throw bad();
    return ip;
  }
  if (type === 'inet_service') {
    const m = /^(\d{1,5})(?:-(\d{1,5}))?$/.exec(part);
    if (!m || Number(m[1]) > 65535 || (m[2] !== undefined && (!interval || Number(m[2]) > 65535))) throw bad();
    return m[2] !== undefined ? `${Number(m[1])}-${Number(m[2])}` : String(Number(m[1]));
  }
  // quotes only around a whole name (nft lists names without them)
  const name = /^"([A-Za-z0-9_.:/*-]+)"$/.exec(part)?.[1] ?? part;
  if (!/^[A-Za-z0-9_.:/*-]+$/.test(name)) throw bad();
  return name;
}
