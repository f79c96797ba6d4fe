// Desired and committed map/set elements. Each owner (a service, the node,
// the ServiceCIDRs) declares its elements; only keys touched since the last
// sync are compared, so an incremental sync is proportional to the change
// and never lists the kernel's table.
import type { Element } from './service-elements.js';

interface Owned {
  owner: string;
  value: string;
  comment?: string;
}

export interface ElementValue {
  readonly value: string;
  readonly comment?: string;
}

export interface ElementDiff {
  readonly deletes: Element[];
  readonly adds: Element[];
}

export class ElementTable {
  /** set -> key -> owners (the first owner's value wins on conflict) */
  private readonly desired = new Map<string, Map<string, Owned[]>>();
  private readonly byOwner = new Map<string, Element[]>();
  /** what the kernel has: set -> key -> value */
  private committed = new Map<string, Map<string, ElementValue>>();
  private pending = new Map<string, Set<string>>();
  /** keys wanted by two owners with different values (reported once) */
  readonly conflicts = new Set<string>();

  /** Replaces everything an owner declared. */
  setOwner(owner: string, elements: readonly Element[]): void {
    for (const e of this.byOwner.get(owner) ?? []) {
      const owners = this.desired.get(e.set)?.get(e.key);
      if (!owners) continue;
      const i = owners.findIndex((o) => o.owner === owner);
      if (i >= 0) owners.splice(i, 1);
      if (!owners.length) this.desired.get(e.set)!.delete(e.key);
      this.touch(e.set, e.key);
    }
    if (elements.length) this.byOwner.set(owner, [...elements]);
    else this.byOwner.delete(owner);
    for (const e of elements) {
      let keys = this.desired.get(e.set);
      if (!keys) this.desired.set(e.set, (keys = new Map()));
      let owners = keys.get(e.key);
      if (!owners) keys.set(e.key, (owners = []));
      const mine = owners.find((o) => o.owner === owner);
      if (mine) continue; // an owner declaring a key twice: the first counts
      owners.push({ owner, value: e.value, comment: e.comment });
      if (owners.length > 1 && owners.some((o) => o.value !== owners![0].value)) this.conflicts.add(`${e.set} ${e.key}`);
      this.touch(e.set, e.key);
    }
  }

  private touch(set: string, key: string) {
    let keys = this.pending.get(set);
    if (!keys) this.pending.set(set, (keys = new Set()));
    keys.add(key);
  }

  private want(set: string, key: string): ElementValue | undefined {
    const owners = this.desired.get(set)?.get(key);
    if (!owners?.length) return undefined;
    const o = owners.reduce((a, b) => (b.owner < a.owner ? b : a));
    return { value: o.value, comment: o.comment };
  }

  /** Differences between desired and committed for the keys touched since the last commit. */
  diff(): ElementDiff {
    const deletes: Element[] = [];
    const adds: Element[] = [];
    for (const [set, keys] of this.pending) {
      const have = this.committed.get(set);
      for (const key of keys) {
        const want = this.want(set, key);
        const cur = have?.get(key);
        if (cur && want && cur.value === want.value && cur.comment === want.comment) continue;
        if (cur) deletes.push({ set, key, value: cur.value });
        if (want) adds.push({ set, key, value: want.value, comment: want.comment });
      }
    }
    return { deletes, adds };
  }

  /** The diff is in the kernel now. */
  commit(d: ElementDiff): void {
    for (const e of d.deletes) this.committed.get(e.set)?.delete(e.key);
    for (const e of d.adds) {
      let keys = this.committed.get(e.set);
      if (!keys) this.committed.set(e.set, (keys = new Map()));
      keys.set(e.key, { value: e.value, comment: e.comment });
    }
    this.pending = new Map();
  }

  /** Adopts what the kernel has (after a restart or a failure): every key is compared next. */
  adopt(kernel: Map<string, Map<string, ElementValue>>): void {
    this.committed = kernel;
    this.pending = new Map();
    for (const [set, keys] of kernel) for (const key of keys.keys()) this.touch(set, key);
    for (const [set, keys] of this.desired) for (const key of keys.keys()) this.touch(set, key);
  }

  /** Verdict targets (chains) that committed elements point to. */
  committedSize(): number {
    let n = 0;
    for (const keys of this.committed.values()) n += keys.size;
    return n;
  }

  desiredElements(set: string): Map<string, ElementValue> {
    const out = new Map<string, ElementValue>();
    for (const key of this.desired.get(set)?.keys() ?? []) out.set(key, this.want(set, key)!);
    return out;
  }
}
