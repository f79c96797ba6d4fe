// What the backends that write chains of rules (to-nft, to-iptables) share
// of them.

/** whether two chains' rules are the same, rule for rule */
export function sameRules(a: readonly string[], b: readonly string[]): boolean {
  return a === b || (a.length === b.length && a.every((r, i) => r === b[i]));
}
