// A tenant's client of the tenant API, in TypeScript (tests, benchmarks, a
// node agent written for Node): one session on the tenant socket; each
// request resolves with kpng's reply (APPLIED or REFUSED, with why).
import type * as grpc from '@grpc/grpc-js';
import { create, fromBinary, toBinary, type MessageInitShape } from '@bufbuild/protobuf';
import { grpcJs } from '../runtime/lazy.js';
import { parseAddress } from '../api/grpc/address.js';
import { newClient } from '../api/grpc/client.js';
import { ChangeElementsSchema, DeclareSchema, Outcome, TenantReplySchema, TenantRequestSchema, type TenantReply, type TenantRequest } from '../api/gen/kpng/aggregator/v1/aggregator_pb.js';
import { TENANT_SESSION_PATH } from './server.js';

export type DeclareInit = MessageInitShape<typeof DeclareSchema>;
export type ChangeElementsInit = MessageInitShape<typeof ChangeElementsSchema>;

/** kpng's answer to one request */
export interface Reply {
  readonly applied: boolean;
  readonly error: string;
  readonly changes: number;
  readonly held: boolean;
}

export class TenantClient {
  private readonly client: grpc.Client;
  private readonly call: grpc.ClientDuplexStream<TenantRequest, TenantReply>;
  private nextId = 1n;
  private readonly waiting = new Map<bigint, (r: Reply) => void>();
  /** how the stream ended (the status kpng gave), once it did */
  ended?: { code: number; details: string };
  /** kpng's notices: it repaired the tenant's tables */
  onRepaired?: () => void;

  private constructor(address: string) {
    this.client = newClient(parseAddress(address), undefined);
    this.call = this.client.makeBidiStreamRequest(
      TENANT_SESSION_PATH,
      (m: TenantRequest) => Buffer.from(toBinary(TenantRequestSchema, m)),
      (b: Buffer) => fromBinary(TenantReplySchema, b),
      new (grpcJs().Metadata)(),
    );
    this.call.on('data', (r: TenantReply) => {
      if (r.outcome === Outcome.REPAIRED) return this.onRepaired?.();
      const w = this.waiting.get(r.id);
      this.waiting.delete(r.id);
      w?.({ applied: r.outcome === Outcome.APPLIED, error: r.error, changes: r.changes, held: r.held });
    });
    const end = (e?: grpc.ServiceError) => {
      this.ended ??= { code: e?.code ?? 0, details: e?.details ?? '' };
      for (const w of this.waiting.values()) w({ applied: false, error: `the session ended: ${this.ended.details || 'by kpng'}`, changes: 0, held: false });
      this.waiting.clear();
    };
    this.call.on('error', end);
    this.call.on('end', () => end());
  }

  /** Opens a session as tenant `name`; rejects when kpng refuses the name. */
  static async connect(address: string, name: string): Promise<{ client: TenantClient; held: boolean }> {
    const c = new TenantClient(address);
    const r = await c.send({ request: { case: 'hello', value: { tenant: name } } });
    if (!r.applied) {
      c.close();
      throw new Error(r.error);
    }
    return { client: c, held: r.held };
  }

  declare(d: DeclareInit): Promise<Reply> {
    return this.send({ request: { case: 'declare', value: create(DeclareSchema, d) } });
  }

  changeElements(c: ChangeElementsInit): Promise<Reply> {
    return this.send({ request: { case: 'elements', value: create(ChangeElementsSchema, c) } });
  }

  unregister(): Promise<Reply> {
    return this.send({ request: { case: 'unregister', value: {} } });
  }

  close(): void {
    this.call.cancel();
    this.client.close();
  }

  private send(req: MessageInitShape<typeof TenantRequestSchema>): Promise<Reply> {
    const id = this.nextId++;
    return new Promise((resolve) => {
      if (this.ended) return resolve({ applied: false, error: 'the session ended', changes: 0, held: false });
      this.waiting.set(id, resolve);
      this.call.write(create(TenantRequestSchema, { ...req, id }));
    });
  }
}
