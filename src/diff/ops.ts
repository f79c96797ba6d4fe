// The node-local diff stream: kpng's Reset / Set / Delete / Sync ops.
import type { Service, Endpoint, LocalNode, ServiceCIDR } from '../api/model.js';
import { LocalSet } from '../api/model.js';

export type LocalValue = Service | Endpoint | LocalNode | ServiceCIDR;

export type LocalOp =
  | {
      readonly kind: 'reset';
      /**
       * kpng-ts resume: only these buckets (of this many) of services and
       * endpoints are resent; the rest the receiver holds stays (src/diff/resume.ts)
       */
      readonly resume?: { readonly buckets: number; readonly resent: readonly number[] };
    }
  | { readonly kind: 'sync' }
  | {
      readonly kind: 'set';
      readonly set: LocalSet;
      readonly path: string;
      /** decoded value; shared, never mutate it */
      readonly value: LocalValue;
      /** the protobuf encoding of value (Value.Bytes on the wire) */
      readonly bytes: Uint8Array;
      /** this op as an encoded OpItem, when its value keeps one (views in a server) */
      readonly frame?: Buffer;
    }
  | { readonly kind: 'delete'; readonly set: LocalSet; readonly path: string };

/** Where ops go: a backend, a file, a gRPC stream. */
export interface LocalSink {
  /**
   * Receives ops in order. A returned promise holds the stream: the next op
   * (and, after Sync, the next diff) waits for it. Changes that arrive
   * meanwhile are coalesced into the next diff.
   */
  send(op: LocalOp): void | Promise<void>;
}

export function describeOp(op: LocalOp): string {
  switch (op.kind) {
    case 'reset': return 'reset';
    case 'sync': return 'sync';
    case 'set': return `set ${LocalSet[op.set]} ${op.path}`;
    case 'delete': return `delete ${LocalSet[op.set]} ${op.path}`;
  }
}
