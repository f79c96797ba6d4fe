// The contract between the aggregator and the backend that writes tenants'
// content to the kernel (src/backends/shared/nftables/tenants.ts for the
// nftables backends). The aggregator holds what tenants want; the backend
// writes it in its own syncs, beside its own rules, in the same transaction.
//
// A sync carries a tenant's content under tenantKey(name), the way it
// carries a Service: ProxierBase isolates a tenant the kernel refuses like a
// Service it refuses, with check-only transactions.
//
//   aggregator                          backend (one per node)
//   attach(dataplane)          <-       at its start
//   dataplane.check(...)       ->       a Declare's content, check only
//   dataplane.changed(key)     ->       a tenant's changes are staged: sync soon
//                              <-       take(name): at the start of a sync with its key
//                              <-       applied(name, n) / refused(name, why) / repaired(name)
//                              <-       found(name): its tables are in the kernel (a full sync)
import type { NftDeclaration } from './nft-content.js';
import type { Tenant } from './tenant.js';

/** Which content a backend writes: nftables tables, or (to-iptables) iptables chains. */
export type DataplaneFamily = 'nftables' | 'iptables';

/** A Declare's content, checked by kpng, per dataplane family. */
export interface DeclaredContent {
  readonly nftables?: NftDeclaration;
}

/** What the aggregator asks of the backend that writes tenants' content. */
export interface TenantDataplane {
  readonly family: DataplaneFamily;
  /** the packet mark bits kpng's own rules use (the masquerade bit): no tenant's rule may change them */
  readonly reservedMark: number;
  /** Only checks that the kernel would take this content (nothing changes); rejects with the kernel's message. */
  check(tenant: string, content: DeclaredContent): Promise<void>;
  /** A tenant's content changed (its key: tenantKey(name)): sync soon. */
  changed(key: string): void;
}

/** What a backend asks of the aggregator (the Aggregator implements it). */
export interface TenantLedger {
  /** Makes dp the node's writer of tenants' content; false when another backend already is. */
  attach(dp: TenantDataplane): boolean;
  detach(dp: TenantDataplane): void;
  /** the tenant of that name, if kpng knows it */
  tenant(name: string): Tenant | undefined;
  /** every tenant kpng knows */
  tenants(): Iterable<Tenant>;
  /** A sync carrying the tenant's key starts: its staged changes become desired. */
  take(name: string): void;
  /** The kernel took the tenant's desired content (changes: objects written for it). */
  applied(name: string, changes: number): void;
  /** The kernel refused it: the tenant goes back to its last good content (handled: true). */
  refused(name: string, why: string): boolean;
  /** Someone else changed the tenant's tables and the sync wrote them back. */
  repaired(name: string): void;
  /** A full sync found tables of this tenant in the kernel (after a restart: kept, untouched, until it declares or its grace runs out). */
  found(name: string): void;
}
