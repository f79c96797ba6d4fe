// The drift check's contract: how the periodic check learns that someone else
// changed what kpng programmed (nftables' change events, iptables-legacy's
// table digests, a fake's own bookkeeping in tests), and how kpng's own
// commits are told apart from anyone else's.

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

/**
 * Where kpng notes its own commits, so that the drift check does not take
 * them for someone else's: each commit kpng makes to the watched dataplane
 * (one transaction: an nft run, a session's line, a netlink batch, an
 * iptables-restore) runs inside own().
 */
export interface OwnCommits {
  own<T>(commit: () => Promise<T>): Promise<T>;
}
