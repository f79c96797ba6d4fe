// kpng get tenants: the node agent's tenants (src/aggregator), read from its
// state socket (/kpng.aggregator.v1.TenantStatus/List), as a table or as
// JSON/YAML.
import type * as grpc from '@grpc/grpc-js';
import { create, fromBinary, toBinary } from '@bufbuild/protobuf';
import { grpcJs } from '../runtime/lazy.js';
import { parseAddress } from '../api/grpc/address.js';
import { newClient } from '../api/grpc/client.js';
import type { ClientTLS } from '../api/grpc/tls.js';
import { ListTenantsRequestSchema, TenantListSchema, type TenantList } from '../api/gen/kpng/aggregator/v1/aggregator_pb.js';
import { TENANT_LIST_PATH } from '../aggregator/server.js';
import { table, type Styler } from './view.js';
import { GetError } from './fetch.js';

export interface TenantState {
  name: string;
  connected: boolean;
  /** found in the kernel at start, not declared again yet: kept as it is */
  adoptedOnly: boolean;
  tables: string[];
  chains: number;
  rules: number;
  sets: number;
  elements: number;
  /** base chains: "hook priority family table chain (type)" in the order packets meet them */
  hooks: string[];
  changes: number;
  refusals: number;
  /** ISO times; '' for never */
  lastChange: string;
  lastError: string;
  lastErrorAt: string;
  /** disconnected: when its content is removed */
  graceEnds: string;
}

const TIMEOUT_MS = 10_000;

/** The tenants of the node agent at address (its state socket). */
export async function fetchTenants(address: string, tls?: ClientTLS): Promise<{ dataplane: string; tenants: TenantState[] }> {
  const client = newClient(parseAddress(address), tls);
  try {
    const list = await new Promise<TenantList>((resolve, reject) => {
      let got: TenantList | undefined;
      const call = client.makeServerStreamRequest(
        TENANT_LIST_PATH,
        (m: Uint8Array) => Buffer.from(m),
        (b: Buffer) => fromBinary(TenantListSchema, b),
        toBinary(ListTenantsRequestSchema, create(ListTenantsRequestSchema, {})),
        new (grpcJs().Metadata)(),
        { deadline: Date.now() + TIMEOUT_MS },
      );
      call.on('data', (l: TenantList) => (got = l));
      call.on('error', (e: grpc.ServiceError) =>
        reject(new GetError(e.code === grpcJs().status.UNIMPLEMENTED ? `${address}: this kpng serves no tenants (a brain, or a node agent with --rules-socket '')` : `${address}: ${e.details ?? e.message}`)),
      );
      call.on('end', () => (got ? resolve(got) : reject(new GetError(`${address}: no answer`))));
    });
    return { dataplane: list.dataplane, tenants: list.tenants.map(tenantState) };
  } finally {
    client.close();
  }
}

const when = (ms: bigint) => (ms > 0n ? new Date(Number(ms)).toISOString() : '');

function tenantState(t: TenantList['tenants'][number]): TenantState {
  return {
    name: t.name,
    connected: t.connected,
    adoptedOnly: t.adoptedOnly,
    tables: [...t.tables],
    chains: t.chains,
    rules: t.rules,
    sets: t.sets,
    elements: t.elements,
    hooks: t.hooks.map((h) => `${h.hook} ${h.priority} ${h.family} ${h.table} ${h.chain} (${h.type})`),
    changes: Number(t.changes),
    refusals: Number(t.refusals),
    lastChange: when(t.lastChangeMs),
    lastError: t.lastError,
    lastErrorAt: when(t.lastErrorMs),
    graceEnds: when(t.graceEndsMs),
  };
}

/** a duration as kubectl prints ages */
function span(ms: number): string {
  const s = Math.max(0, Math.round(ms / 1000));
  return s < 120 ? `${s}s` : s < 7200 ? `${Math.round(s / 60)}m` : `${Math.round(s / 3600)}h`;
}

const ago = (iso: string, now: number) => (iso ? span(now - Date.parse(iso)) : '<never>');

export function tenantsTable(tenants: TenantState[], style: Styler, wide: boolean, now = Date.now()): string {
  const head = ['NAME', 'STATE', 'TABLES', 'CHAINS', 'RULES', 'SETS', 'ELEMENTS', 'LAST-CHANGE', 'LAST-ERROR', ...(wide ? ['HOOKS'] : [])];
  const rows = tenants.map((t) => [
    t.name,
    t.connected ? 'connected' : t.adoptedOnly ? 'adopted' : t.graceEnds ? `away (removed in ${span(Date.parse(t.graceEnds) - now)})` : 'away',
    t.tables.join(',') || '<none>',
    String(t.chains),
    String(t.rules),
    String(t.sets),
    String(t.elements),
    ago(t.lastChange, now),
    t.lastError ? `${ago(t.lastErrorAt, now)} ago: ${t.lastError}` : '<none>',
    ...(wide ? [t.hooks.join('; ') || '<none>'] : []),
  ]);
  return table(head, rows, style);
}
