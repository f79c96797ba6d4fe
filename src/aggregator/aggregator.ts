// The aggregator: every tenant kpng knows, their sessions, and the backend
// that writes their content (dataplane.ts). A session's requests are taken
// one at a time, in order: each is checked (names, allow-list, quotas, rule
// text; a Declare also by the kernel, check only), then staged, and answered
// once a sync committed it or the kernel refused it. A tenant's changes make
// kpng sync at most once per minChangeIntervalMs (they coalesce meanwhile).
// A tenant whose session ends keeps its content in the kernel for graceMs,
// then it is removed; an Unregister removes it at once.
import type { Logger } from '../runtime/log.js';
import { Outcome, type TenantList, type TenantRequest, type ChangeElements, type Declare } from '../api/gen/kpng/aggregator/v1/aggregator_pb.js';
import { allowanceOf, type AggregatorConfig } from './config.js';
import type { DeclaredContent, TenantDataplane, TenantLedger } from './dataplane.js';
import { tenantNameProblem } from './names.js';
import { declareNft, element, elementKey, nameHint, setId, TenantError, type NftDeclaration, type NftPolicy, type TenantElement } from './nft-content.js';
import { declaredSet, Tenant, type PendingRequest } from './tenant.js';
import { forgetTenantMetrics, tenantMetrics } from './metrics.js';

/** A reply as the session writes it. */
export interface ReplyInit {
  readonly id: bigint;
  readonly outcome: Outcome;
  readonly error?: string;
  readonly changes?: number;
  readonly held?: boolean;
}

/** How the aggregator talks to one tenant's stream (server.ts). */
export interface SessionPort {
  send(reply: ReplyInit): void;
  /** ends the stream: ok (after an Unregister), or with an error status the tenant sees */
  close(how: 'ok' | 'invalid' | 'denied' | 'replaced' | 'unavailable', message: string): void;
}

export class Aggregator implements TenantLedger {
  private readonly byName = new Map<string, Tenant>();
  private readonly sessions = new Map<string, TenantSession>();
  private dataplane?: TenantDataplane;
  private closed = false;

  constructor(
    readonly config: AggregatorConfig,
    readonly log: Logger,
  ) {}

  // --- the backend's side (TenantLedger)

  attach(dp: TenantDataplane): boolean {
    if (this.dataplane && this.dataplane !== dp) return false;
    this.dataplane = dp;
    // changes staged before it came
    for (const t of this.byName.values()) if (t.hasStaged) this.release(t);
    return true;
  }

  detach(dp: TenantDataplane): void {
    if (this.dataplane === dp) this.dataplane = undefined;
  }

  /** the family the node's writer takes ('' : none) */
  get dataplaneFamily(): string {
    return this.dataplane?.family ?? '';
  }

  tenant(name: string): Tenant | undefined {
    return this.byName.get(name);
  }

  tenants(): Iterable<Tenant> {
    return this.byName.values();
  }

  take(name: string): void {
    this.byName.get(name)?.take(Date.now());
  }

  applied(name: string, changes: number): void {
    const t = this.byName.get(name);
    if (!t) return;
    const done = t.applied();
    const now = Date.now();
    if (changes > 0 || done.length) t.stats.lastChangeMs = now;
    for (const r of done) {
      tenantMetrics.changes.inc({ tenant: name });
      tenantMetrics.changeDuration.observe({ tenant: name }, (now - r.at) / 1000);
      t.stats.changes++;
      r.answer?.('applied', { changes });
    }
    tenantMetrics.elements.set({ tenant: name }, t.elementCount);
    if (done.some((r) => r.removal) && t.empty) this.forget(t, 'unregistered');
  }

  refused(name: string, why: string): boolean {
    const t = this.byName.get(name);
    if (!t) return false;
    const done = t.refused();
    this.noteRefusal(t, why, done.length);
    for (const r of done) r.answer?.('refused', { error: `the kernel refused it: ${why}` });
    this.log.error({ tenant: name, requests: done.length, err: why }, `tenant ${name}: the kernel refused its change; its last good content stays`);
    return true;
  }

  repaired(name: string): void {
    this.sessions.get(name)?.port.send({ id: 0n, outcome: Outcome.REPAIRED });
  }

  found(name: string): void {
    if (this.byName.has(name) || tenantNameProblem(name)) return;
    const t = new Tenant(name);
    t.foundInKernel = true;
    this.byName.set(name, t);
    this.log.info({ tenant: name, graceSeconds: this.config.graceMs / 1000 }, `tenant ${name}: its tables are in the kernel; kept as they are until it declares its content again or its grace runs out`);
    this.startGrace(t);
  }

  // --- sessions (server.ts)

  /** A new stream: its requests go to the returned session. */
  open(port: SessionPort, peer: string): TenantSession {
    return new TenantSession(this, port, peer);
  }

  /** what kpng get tenants shows */
  list(): Omit<TenantList, '$typeName' | '$unknown'> {
    const tenants = [...this.byName.values()].sort((a, b) => a.name.localeCompare(b.name)).map((t) => ({ $typeName: 'kpng.aggregator.v1.TenantInfo' as const, ...t.info(this.sessions.has(t.name)) }));
    return { tenants, dataplane: this.dataplaneFamily };
  }

  /** kpng stops: the tenants' content stays in the kernel; their streams end. */
  close(): void {
    this.closed = true;
    for (const s of [...this.sessions.values()]) s.port.close('unavailable', 'kpng is stopping');
    for (const t of this.byName.values()) {
      clearTimeout(t.releaseTimer);
      clearTimeout(t.graceTimer);
    }
  }

  // --- for TenantSession

  /** A Hello: the session becomes the tenant's (an earlier one is ended). */
  hello(s: TenantSession, name: string): Tenant {
    const bad = tenantNameProblem(name);
    if (bad) throw new TenantError(bad);
    if (!allowanceOf(this.config, name)) throw new TenantError(`allow-list: tenant ${name} is not allowed on this node`);
    if (this.closed) throw new TenantError('kpng is stopping');
    const before = this.sessions.get(name);
    this.sessions.set(name, s);
    if (before && before !== s) {
      before.port.close('replaced', `a new session of tenant ${name} took over`);
      before.ended();
    }
    let t = this.byName.get(name);
    if (!t) this.byName.set(name, (t = new Tenant(name)));
    clearTimeout(t.graceTimer);
    t.graceEndsMs = 0;
    this.log.info({ tenant: name, peer: s.peer, held: this.holds(t) }, `tenant ${name}: session open`);
    return t;
  }

  /** kpng holds content of the tenant (declared earlier, or found in the kernel) */
  holds(t: Tenant): boolean {
    return (t.foundInKernel && !t.known) || t.desired.tables.size > 0 || t.hasStaged;
  }

  /** A session ended: its tenant's content stays for the grace. */
  sessionEnded(s: TenantSession, t: Tenant | undefined): void {
    if (!t || this.sessions.get(t.name) !== s) return;
    this.sessions.delete(t.name);
    if (this.closed || !this.byName.has(t.name)) return;
    this.log.info({ tenant: t.name, graceSeconds: this.config.graceMs / 1000 }, `tenant ${t.name}: session ended; its content stays until its grace runs out`);
    this.startGrace(t);
  }

  policy(t: Tenant): NftPolicy {
    const a = allowanceOf(this.config, t.name);
    if (!a) throw new TenantError(`allow-list: tenant ${t.name} is not allowed on this node`);
    return { tenant: t.name, hooks: a.hooks, quotas: a.quotas, reservedMark: this.dataplane?.reservedMark ?? 0 };
  }

  /** A Declare: checked here and by the kernel, then staged. */
  async declare(t: Tenant, d: Declare, req: PendingRequest): Promise<void> {
    const dp = this.writer();
    if (dp.family !== 'nftables') throw new TenantError(`this node's backend writes ${dp.family} content; kpng does not take a tenant's ${dp.family} content yet`);
    if (!d.nftables) throw new TenantError("this node's backend writes nftables: declare nftables content (Declare.nftables)");
    const decl = declareNft(d.nftables, this.policy(t));
    if (!sameStructure(decl, t)) {
      const content: DeclaredContent = { nftables: decl };
      try {
        await dp.check(t.name, content);
      } catch (e) {
        throw new TenantError(`the kernel refuses it: ${nameHint(decl, (e as Error).message)}`);
      }
    }
    t.stageDeclaration(decl, req);
    this.release(t);
  }

  /** Element changes: checked against the declared sets and the quota, then staged. */
  changeElements(t: Tenant, c: ChangeElements, req: PendingRequest): void {
    this.writer();
    const quota = this.policy(t).quotas.elements;
    const changes: { id: string; deletes: string[]; adds: TenantElement[] }[] = [];
    let projected = t.projectedElements;
    // what this request itself adds and deletes, for the count
    const seen = new Map<string, boolean>();
    for (const [i, ch] of c.changes.entries()) {
      const where = `change ${i + 1} (${ch.family} ${ch.table} set ${ch.set})`;
      const found = declaredSet(t.tables, ch.family, ch.table, ch.set);
      if (!found) throw new TenantError(`${where}: no such set or map declared`);
      const id = setId(found.table.family, found.table.kernelName, found.set.name);
      const deletes = ch.delete.map((k) => elementKey(k, found.set, where));
      const adds = ch.add.map((e) => element(e, found.set, found.table, where));
      const present = (k: string) => seen.get(`${id}\0${k}`) ?? t.has(id, k);
      for (const k of deletes) {
        if (present(k)) projected--;
        seen.set(`${id}\0${k}`, false);
      }
      for (const e of adds) {
        if (!present(e.key)) projected++;
        seen.set(`${id}\0${e.key}`, true);
      }
      changes.push({ id, deletes, adds });
    }
    if (projected > quota) throw new TenantError(`quota: ${projected} elements, at most ${quota} for tenant ${t.name}`);
    t.stageElements(changes, req);
    this.release(t);
  }

  unregister(t: Tenant, req: PendingRequest): void {
    this.writer();
    t.stageRemoval({ ...req, removal: true });
    this.release(t);
  }

  noteRefusal(t: Tenant, why: string, requests = 1): void {
    t.stats.refusals += requests;
    t.stats.lastError = why;
    t.stats.lastErrorMs = Date.now();
    if (requests) tenantMetrics.refusals.inc({ tenant: t.name }, requests);
  }

  // --- inside

  private writer(): TenantDataplane {
    if (!this.dataplane) throw new TenantError("no backend on this node writes tenants' content (nftables: to-nft, to-ipvs, to-userspace)");
    return this.dataplane;
  }

  /** the tenant's staged changes go to a sync now, or when its rate limit allows */
  private release(t: Tenant): void {
    const dp = this.dataplane;
    if (!dp || this.closed) return;
    const now = Date.now();
    if (now >= t.nextReleaseMs) {
      clearTimeout(t.releaseTimer);
      t.releaseTimer = undefined;
      t.nextReleaseMs = now + this.config.minChangeIntervalMs;
      dp.changed(t.key);
      return;
    }
    t.releaseTimer ??= setTimeout(() => {
      t.releaseTimer = undefined;
      if (t.hasStaged) this.release(t);
    }, t.nextReleaseMs - now).unref();
  }

  private startGrace(t: Tenant): void {
    clearTimeout(t.graceTimer);
    t.graceEndsMs = Date.now() + this.config.graceMs;
    t.graceTimer = setTimeout(() => {
      if (this.sessions.has(t.name) || this.closed) return;
      this.log.info({ tenant: t.name }, `tenant ${t.name}: grace over; removing its content`);
      t.stageRemoval({ id: 0n, at: Date.now(), removal: true });
      this.release(t);
    }, this.config.graceMs).unref();
  }

  private forget(t: Tenant, why: string): void {
    clearTimeout(t.releaseTimer);
    clearTimeout(t.graceTimer);
    for (const r of t.drain()) r.answer?.('refused', { error: `tenant ${t.name} was ${why}` });
    this.byName.delete(t.name);
    forgetTenantMetrics(t.name);
    this.log.info({ tenant: t.name }, `tenant ${t.name}: ${why}; its content is gone from the kernel`);
    const s = this.sessions.get(t.name);
    if (s?.unregistering) {
      this.sessions.delete(t.name);
      s.port.close('ok', `tenant ${t.name} unregistered`);
    }
  }
}

/** true when a declaration's tables are those already desired or staged (a resend: the kernel need not check them again) */
function sameStructure(d: NftDeclaration, t: Tenant): boolean {
  if (!t.known || d.tables.size !== t.tables.size) return false;
  for (const [id, table] of d.tables) {
    const have = t.tables.get(id);
    if (!have || have.chains.size !== table.chains.size || have.sets.size !== table.sets.size) return false;
    for (const [n, c] of table.chains) if (have.chains.get(n)?.digest !== c.digest) return false;
    for (const [n, s] of table.sets) if (have.sets.get(n)?.tag !== s.tag) return false;
  }
  return true;
}

/** One tenant's stream: requests in order, one at a time. */
export class TenantSession {
  private tenant?: Tenant;
  private queue: Promise<void> = Promise.resolve();
  private open = true;
  /** an Unregister was taken: the stream ends once it is applied */
  unregistering = false;

  constructor(
    private readonly agg: Aggregator,
    readonly port: SessionPort,
    readonly peer: string,
  ) {}

  request(req: TenantRequest): void {
    this.queue = this.queue.then(() => this.handle(req)).catch((e) => this.agg.log.error({ err: (e as Error).message, peer: this.peer }, 'tenant session: request failed'));
  }

  /** the stream is gone */
  ended(): void {
    if (!this.open) return;
    this.open = false;
    this.agg.sessionEnded(this, this.tenant);
  }

  private pending(id: bigint): PendingRequest {
    const at = Date.now();
    return {
      id,
      at,
      answer: (outcome, d) => {
        if (this.open) this.port.send({ id, outcome: outcome === 'applied' ? Outcome.APPLIED : Outcome.REFUSED, error: d.error, changes: d.changes });
      },
    };
  }

  private async handle(req: TenantRequest): Promise<void> {
    if (!this.open) return;
    const r = req.request;
    try {
      if (r.case === 'hello') {
        if (this.tenant) throw new TenantError('Hello comes once, first');
        this.tenant = this.agg.hello(this, r.value.tenant);
        this.port.send({ id: req.id, outcome: Outcome.APPLIED, held: this.agg.holds(this.tenant) });
        return;
      }
      const t = this.tenant;
      if (!t) throw new TenantError('say Hello first: it names the tenant');
      if (this.unregistering) throw new TenantError('the tenant unregistered; this session ends');
      switch (r.case) {
        case 'declare':
          return await this.agg.declare(t, r.value, this.pending(req.id));
        case 'elements':
          return this.agg.changeElements(t, r.value, this.pending(req.id));
        case 'unregister':
          this.agg.unregister(t, this.pending(req.id));
          this.unregistering = true;
          return;
        default:
          throw new TenantError('an empty request');
      }
    } catch (e) {
      const msg = (e as Error).message;
      if (this.tenant) this.agg.noteRefusal(this.tenant, msg);
      this.port.send({ id: req.id, outcome: Outcome.REFUSED, error: msg });
      if (!(e instanceof TenantError)) this.agg.log.error({ err: msg, peer: this.peer }, 'tenant session: unexpected failure');
      if (r.case === 'hello') {
        this.open = false;
        this.port.close(msg.startsWith('allow-list') ? 'denied' : 'invalid', msg);
      }
    }
  }
}
