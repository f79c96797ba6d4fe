// The aggregator's configuration (--tenants-config FILE, YAML or JSON): how
// long a disconnected tenant's content stays, how often one tenant may make
// kpng sync, quotas, and an optional allow-list of tenant names with the
// hooks each may use. Parsed strictly, like kpng's KubeProxyConfiguration:
// an unknown or invalid field is refused with its path (docs/aggregator.md).
import { readFileSync } from 'node:fs';
import { yaml } from '../runtime/lazy.js';
import { ConfigError } from '../runtime/errors.js';
import { HOOKS, type Quotas } from './nft-content.js';
import { tenantNameProblem } from './names.js';

export interface TenantAllowance {
  /** the hooks its base chains may use; undefined: any */
  readonly hooks?: ReadonlySet<string>;
  readonly quotas: Quotas;
}

export interface AggregatorConfig {
  /** a disconnected tenant's content stays this long (then it is removed) */
  readonly graceMs: number;
  /** one tenant's changes go to the kernel at most once per this (they coalesce meanwhile) */
  readonly minChangeIntervalMs: number;
  readonly quotas: Quotas;
  /** the only tenants taken, by name; undefined: any tenant, any hook */
  readonly allow?: ReadonlyMap<string, TenantAllowance>;
}

export const DEFAULT_QUOTAS: Quotas = { tables: 16, chains: 5000, rules: 20_000, sets: 5000, elements: 500_000 };

export function defaultAggregatorConfig(): AggregatorConfig {
  return { graceMs: 300_000, minChangeIntervalMs: 20, quotas: DEFAULT_QUOTAS };
}

/** What a tenant may do: its allowance, or undefined when the allow-list does not name it. */
export function allowanceOf(c: AggregatorConfig, tenant: string): TenantAllowance | undefined {
  if (!c.allow) return { quotas: c.quotas };
  return c.allow.get(tenant);
}

type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);

function fields(o: unknown, path: string, known: readonly string[]): Obj {
  if (!isObj(o)) throw new ConfigError(path || '(document)', 'must be an object');
  for (const k of Object.keys(o)) if (!known.includes(k)) throw new ConfigError(path ? `${path}.${k}` : k, `unknown field (known: ${known.join(', ')})`);
  return o;
}

function count(v: unknown, field: string, min: number, max: number): number {
  if (typeof v !== 'number' || !Number.isInteger(v)) throw new ConfigError(field, `must be an integer, not ${JSON.stringify(v)}`);
  if (v < min || v > max) throw new ConfigError(field, `${v} is out of range (${min}-${max})`);
  return v;
}

function quotas(v: unknown, field: string, base: Quotas): Quotas {
  const o = fields(v, field, Object.keys(base));
  const q: Record<string, number> = { ...base };
  for (const [k, n] of Object.entries(o)) q[k] = count(n, `${field}.${k}`, 0, 10_000_000);
  return q as unknown as Quotas;
}

export function parseAggregatorConfig(doc: unknown): AggregatorConfig {
  const d = defaultAggregatorConfig();
  if (doc === null || doc === undefined) return d;
  const o = fields(doc, '', ['graceSeconds', 'minChangeIntervalMs', 'quotas', 'allow']);
  const base = o.quotas === undefined ? d.quotas : quotas(o.quotas, 'quotas', d.quotas);
  let allow: Map<string, TenantAllowance> | undefined;
  if (o.allow !== undefined) {
    if (!Array.isArray(o.allow)) throw new ConfigError('allow', 'must be a list of tenants ({name, hooks, quotas})');
    allow = new Map();
    for (const [i, t] of o.allow.entries()) {
      const path = `allow[${i}]`;
      const e = fields(t, path, ['name', 'hooks', 'quotas']);
      const name = e.name;
      if (typeof name !== 'string' || tenantNameProblem(name)) throw new ConfigError(`${path}.name`, tenantNameProblem(String(name)) ?? 'must be a string');
      if (allow.has(name)) throw new ConfigError(`${path}.name`, `${name} is listed twice`);
      let hooks: Set<string> | undefined;
      if (e.hooks !== undefined) {
        if (!Array.isArray(e.hooks) || e.hooks.some((h) => !HOOKS.includes(h))) throw new ConfigError(`${path}.hooks`, `a list of ${HOOKS.join(', ')}`);
        hooks = new Set(e.hooks as string[]);
      }
      allow.set(name, { hooks, quotas: e.quotas === undefined ? base : quotas(e.quotas, `${path}.quotas`, base) });
    }
  }
  return {
    graceMs: o.graceSeconds === undefined ? d.graceMs : count(o.graceSeconds, 'graceSeconds', 0, 30 * 86_400) * 1000,
    minChangeIntervalMs: o.minChangeIntervalMs === undefined ? d.minChangeIntervalMs : count(o.minChangeIntervalMs, 'minChangeIntervalMs', 0, 3_600_000),
    quotas: base,
    allow,
  };
}

/** Reads the aggregator's configuration file; throws ConfigError naming the field. */
export function loadAggregatorConfig(path: string): AggregatorConfig {
  let doc: unknown;
  try {
    doc = yaml().parse(readFileSync(path, 'utf8'));
  } catch (e) {
    throw new ConfigError(path, `cannot read: ${(e as Error).message}`);
  }
  try {
    return parseAggregatorConfig(doc);
  } catch (e) {
    if (e instanceof ConfigError) throw new ConfigError(`${path}: ${e.field}`, e.reason);
    throw e;
  }
}
