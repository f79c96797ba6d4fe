// The drift check's contract: how the periodic check learns that someone else
// changed what kpng programmed (nftables' change events, iptables-legacy's
// table facts, a fake's own bookkeeping in tests).

/** What the periodic check asks of a drift detector. */
export interface DriftSource {
  /** before the dataplane is read back: what changes after this is seen */
  start(): void;
  /** around a big transaction of kpng's own */
  pause(): void;
  resume(ownTransactions: number): void;
  /** why the dataplane must be read back and repaired, or undefined */
  check(): string | undefined;
  close(): void;
}
