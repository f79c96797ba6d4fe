// nftables transactions as typed objects (in the spirit of
// kubernetes-sigs/knftables), for every backend that writes nftables: a
// Transaction is a list of operations (add, flush, delete) on tables, chains,
// rules, sets, maps and elements; it is rendered to nft's text in one place
// (render), and applied atomically by an Nft (nft.ts: a long-lived `nft -i`,
// a process per transaction; fake.ts: an in-memory model for tests).

export type TableFamily = 'ip' | 'ip6' | 'inet';

export interface TableRef {
  readonly family: TableFamily;
  readonly name: string;
}

export interface Table extends TableRef {
  readonly kind: 'table';
  readonly comment?: string;
}

export interface Chain {
  readonly kind: 'chain';
  readonly table: TableRef;
  readonly name: string;
  /** a base chain's hook, e.g. "type nat hook prerouting priority -100 ;" */
  readonly hook?: string;
}

export interface Rule {
  readonly kind: 'rule';
  readonly table: TableRef;
  readonly chain: string;
  /** the rule's text, e.g. "ip daddr @cluster-ips reject" */
  readonly rule: string;
}

export interface NftSet {
  readonly kind: 'set' | 'map';
  readonly table: TableRef;
  readonly name: string;
  /** the declaration, e.g. "type ipv4_addr ; flags interval ;" */
  readonly body: string;
}

/** An element's data as a table listing gives it. */
export interface ElementValue {
  readonly value: string;
  readonly comment: string;
}

/** A set or map element (the shape kpng's element tables keep). */
export interface ElementData {
  /** its set or map */
  readonly set: string;
  /** e.g. "10.96.0.1 . tcp . 80" */
  readonly key: string;
  /** map data ("goto lb-cluster-tcp-3", "10.0.0.1 . 8080"); '' in a set */
  readonly value: string;
  /** '' for none; already safe (see shared/comment.ts) */
  readonly comment: string;
  /** the element's own timeout in ms (a tenant's; kpng's own elements have none) */
  readonly timeoutMs?: number;
}

export type NftObject = Table | Chain | Rule | NftSet;

export type Operation =
  | { readonly verb: 'add'; readonly object: NftObject }
  | { readonly verb: 'flush' | 'delete'; readonly object: Table | Chain | NftSet }
  | { readonly verb: 'add' | 'delete'; readonly elements: readonly ElementData[]; readonly table: TableRef; readonly set: string };

/** at most this many elements per nft command: a line nft parses quickly */
const ELEMENTS_PER_COMMAND = 2000;

export class Transaction {
  private readonly list: Operation[] = [];
  /** elements added or deleted */
  elementCount = 0;
  private text?: string;

  get ops(): readonly Operation[] {
    return this.list;
  }

  private push(op: Operation): void {
    this.list.push(op);
    this.text = undefined;
  }

  get empty(): boolean {
    return this.ops.length === 0;
  }

  add(object: NftObject): this {
    this.push({ verb: 'add', object });
    return this;
  }

  flush(object: Table | Chain | NftSet): this {
    this.push({ verb: 'flush', object });
    return this;
  }

  delete(object: Table | Chain | NftSet): this {
    this.push({ verb: 'delete', object });
    return this;
  }

  /** Elements added (existing ones must be deleted first to change their value). */
  addElements(table: TableRef, set: string, elements: readonly ElementData[]): this {
    if (elements.length) this.push({ verb: 'add', table, set, elements });
    this.elementCount += elements.length;
    return this;
  }

  deleteElements(table: TableRef, set: string, elements: readonly ElementData[]): this {
    if (elements.length) this.push({ verb: 'delete', table, set, elements });
    this.elementCount += elements.length;
    return this;
  }

  /** Elements of any sets, grouped by set in the order they come. */
  elements(verb: 'add' | 'delete', table: TableRef, list: readonly ElementData[]): this {
    const bySet = new Map<string, ElementData[]>();
    for (const e of list) {
      let arr = bySet.get(e.set);
      if (!arr) bySet.set(e.set, (arr = []));
      arr.push(e);
    }
    for (const [set, items] of bySet) (verb === 'add' ? this.addElements(table, set, items) : this.deleteElements(table, set, items));
    return this;
  }

  /** Appends another transaction's operations. */
  append(other: Transaction): this {
    for (const op of other.ops) this.push(op);
    this.elementCount += other.elementCount;
    return this;
  }

  /** nft's text: one command per line (the whole text is one atomic transaction); kept until the next change. */
  render(): string {
    if (this.text !== undefined) return this.text;
    const lines: string[] = [];
    for (const op of this.list) renderOp(op, lines);
    return (this.text = lines.length ? lines.join('\n') + '\n' : '');
  }
}

const tableText = (t: TableRef) => `${t.family} ${t.name}`;

function renderOp(op: Operation, lines: string[]): void {
  if ('elements' in op) {
    const t = tableText(op.table);
    const withData = op.verb === 'add';
    const items = op.elements.map((e) => (withData ? `${e.key}${e.timeoutMs ? ` timeout ${e.timeoutMs}ms` : ''}${e.comment ? ` comment "${e.comment}"` : ''}${e.value ? ` : ${e.value}` : ''}` : e.key));
    for (let i = 0; i < items.length; i += ELEMENTS_PER_COMMAND) lines.push(`${op.verb} element ${t} ${op.set} { ${items.slice(i, i + ELEMENTS_PER_COMMAND).join(', ')} }`);
    return;
  }
  const o = op.object;
  switch (o.kind) {
    case 'table':
      if (op.verb === 'add') lines.push(`add table ${tableText(o)}${o.comment ? ` { comment "${o.comment}" ; }` : ''}`);
      else lines.push(`${op.verb} table ${tableText(o)}`);
      return;
    case 'chain':
      if (op.verb === 'add') lines.push(`add chain ${tableText(o.table)} ${o.name}${o.hook ? ` { ${o.hook} }` : ''}`);
      else lines.push(`${op.verb} chain ${tableText(o.table)} ${o.name}`);
      return;
    case 'rule':
      lines.push(`add rule ${tableText(o.table)} ${o.chain} ${o.rule}`);
      return;
    case 'set':
    case 'map':
      if (op.verb === 'add') lines.push(`add ${o.kind} ${tableText(o.table)} ${o.name} { ${o.body} }`);
      else lines.push(`${op.verb} ${o.kind} ${tableText(o.table)} ${o.name}`);
      return;
  }
}
