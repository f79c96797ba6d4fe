// Desired and committed map/set elements. Each owner (a service, the node,
// the ServiceCIDRs) declares its elements; only keys touched since the last
// sync are compared, so an incremental sync is proportional to the change
// and never lists the kernel's table. The element objects themselves are
// stored (desired and committed), so a sync allocates nothing per element
// beyond what its owner declared.
import type { ElementData, ElementValue } from './transaction.js';

export type { ElementValue };

/** An element an owner declares: its data, and who declared it (set by the table). */
export interface Element extends ElementData {
  owner: string;
}

export interface ElementDiff {
  readonly deletes: readonly Element[];
  readonly adds: readonly Element[];
}

export class ElementTable {
  /** set -> key -> the element that wins (the first owner by name) */
  private readonly desired = new Map<string, Map<string, Element>>();
  /** set\0key -> further owners of a key (rare: a conflict, or a shared element) */
  private readonly others = new Map<string, Element[]>();
  private readonly byOwner = new Map<string, readonly Element[]>();
  /**
   * What the kernel has. 'desired': the desired state, except the keys in
   * `before`; or, after an adoption until the next commit, set -> key ->
   * value as listed.
   */
  private committed: Map<string, Map<string, ElementValue>> | 'desired' = 'desired';
  /** set -> key -> what the kernel has (undefined: nothing) for the keys touched since the last commit, with committed 'desired' */
  private before = new Map<string, Map<string, ElementValue | undefined>>();
  /** keys to compare at the next diff; 'all' after an adoption */
  private pending: Map<string, Set<string>> | 'all' = new Map();
  /** keys wanted by two owners with different values (reported once) */
  readonly conflicts = new Set<string>();
  /** some key was declared twice (by two owners, or one owner twice) since this table was made */
  private declaredTwice = false;

  /** Replaces everything an owner declared (its elements are kept, not copied). */
  setOwner(owner: string, elements: Element[]): void {
    const before = this.byOwner.get(owner);
    if (before) for (const e of before) this.remove(e);
    else if (!elements.length) return;
    for (const e of elements) {
      e.owner = owner;
      this.add(e);
    }
    if (elements.length) this.byOwner.set(owner, elements);
    else this.byOwner.delete(owner);
  }

  hasOwner(owner: string): boolean {
    return this.byOwner.has(owner);
  }

  /** the owners that declared elements */
  owners(): IterableIterator<string> {
    return this.byOwner.keys();
  }

  /** The elements of an owner that count (a key two owners declare counts once); not to be changed. */
  winnersOf(owner: string): readonly Element[] {
    // no key was ever declared twice: every element counts (a cold start's many, uncopied)
    if (!this.declaredTwice) return this.byOwner.get(owner) ?? [];
    const out: Element[] = [];
    for (const e of this.byOwner.get(owner) ?? []) if (this.desired.get(e.set)?.get(e.key) === e) out.push(e);
    return out;
  }

  /** desired elements of one set (created on first use); the last one is cached: an owner's elements come grouped by set */
  private keysOf(set: string): Map<string, Element> {
    if (set === this.lastSet) return this.lastKeys!;
    let keys = this.desired.get(set);
    if (!keys) this.desired.set(set, (keys = new Map()));
    this.lastSet = set;
    this.lastKeys = keys;
    return keys;
  }
  private lastSet?: string;
  private lastKeys?: Map<string, Element>;

  private add(e: Element) {
    const keys = this.keysOf(e.set);
    const cur = keys.get(e.key);
    if (!cur) {
      this.touch(e.set, e.key, undefined);
      keys.set(e.key, e);
      return;
    }
    this.declaredTwice = true;
    if (cur.owner === e.owner) return; // declared twice by one owner: the first counts
    if (cur.value !== e.value) this.conflicts.add(`${e.set} ${e.key}`);
    const id = `${e.set}\0${e.key}`;
    const list = this.others.get(id) ?? [];
    if (e.owner < cur.owner) {
      list.push(cur);
      this.touch(e.set, e.key, cur);
      keys.set(e.key, e);
    } else list.push(e);
    this.others.set(id, list);
  }

  private remove(e: Element) {
    const keys = this.keysOf(e.set);
    const cur = keys.get(e.key);
    if (!cur) return;
    const id = `${e.set}\0${e.key}`;
    const list = this.others.get(id);
    if (cur === e) {
      this.touch(e.set, e.key, cur);
      if (list?.length) {
        // the next owner by name takes over
        list.sort((a, b) => (a.owner < b.owner ? -1 : 1));
        keys.set(e.key, list.shift()!);
        if (!list.length) this.others.delete(id);
      } else keys.delete(e.key);
    } else if (list) {
      const i = list.indexOf(e);
      if (i >= 0) list.splice(i, 1);
      if (!list.length) this.others.delete(id);
    }
  }

  /** key is about to change; was: its desired element until now */
  private touch(set: string, key: string, was: Element | undefined) {
    const pending = this.pending;
    if (pending === 'all') return;
    if (set !== this.lastTouched || this.lastTouchedIn !== pending) {
      let keys = pending.get(set);
      if (!keys) pending.set(set, (keys = new Set()));
      let before = this.before.get(set);
      if (!before) this.before.set(set, (before = new Map()));
      this.lastTouched = set;
      this.lastTouchedIn = pending;
      this.lastTouchedKeys = keys;
      this.lastBefore = before;
    }
    const keys = this.lastTouchedKeys!;
    if (keys.has(key)) return;
    keys.add(key);
    // the first change since the commit: the kernel has what was desired (committed 'desired')
    if (this.committed === 'desired') this.lastBefore!.set(key, was);
  }
  private lastTouched?: string;
  private lastTouchedIn?: Map<string, Set<string>>;
  private lastTouchedKeys?: Set<string>;
  private lastBefore?: Map<string, ElementValue | undefined>;

  /** what the kernel has for a key */
  private committedOf(set: string, key: string): ElementValue | undefined {
    if (this.committed !== 'desired') return this.committed.get(set)?.get(key);
    const before = this.before.get(set);
    if (before?.has(key)) return before.get(key);
    return this.desired.get(set)?.get(key);
  }

  /** Differences between desired and committed for the keys touched since the last commit. */
  diff(): ElementDiff {
    const deletes: Element[] = [];
    const adds: Element[] = [];
    const compare = (set: string, key: string) => {
      const want = this.desired.get(set)?.get(key);
      const cur = this.committedOf(set, key);
      if (cur && want && cur.value === want.value && cur.comment === want.comment) return;
      if (cur) deletes.push({ set, key, value: cur.value, comment: '', owner: '' });
      if (want) adds.push(want);
    };
    if (this.pending === 'all') {
      // (only after an adoption: committed is what the kernel listed)
      if (this.committed !== 'desired') for (const [set, keys] of this.committed) for (const key of keys.keys()) if (!this.desired.get(set)?.has(key)) compare(set, key);
      for (const [set, keys] of this.desired) for (const key of keys.keys()) compare(set, key);
    } else {
      for (const [set, keys] of this.pending) for (const key of keys) compare(set, key);
    }
    return { deletes, adds };
  }

  /**
   * The kernel has the desired state now: the last diff() went in (every
   * key touched since the previous commit, or all after an adoption), or a
   * fresh load put every desired element that counts into an empty table.
   */
  commit(): void {
    this.committed = 'desired';
    this.before = new Map();
    this.pending = new Map();
  }

  /** Adopts what the kernel has (after a restart or a failure): every key is compared next. */
  adopt(kernel: Map<string, Map<string, ElementValue>>): void {
    this.committed = kernel;
    this.before = new Map();
    this.pending = 'all';
  }

  /** the keys of a set as committed (adopted from the kernel, or applied) */
  *committedKeys(set: string): IterableIterator<string> {
    if (this.committed !== 'desired') {
      yield* this.committed.get(set)?.keys() ?? [];
      return;
    }
    const before = this.before.get(set);
    for (const key of this.desired.get(set)?.keys() ?? []) if (!before?.has(key)) yield key;
    for (const [key, was] of before ?? []) if (was) yield key;
  }

  desiredElements(set: string): Map<string, ElementValue> {
    return new Map(this.desired.get(set) ?? []);
  }
}
