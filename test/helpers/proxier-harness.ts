// A proxier fed by a store through the real diff stream, as to-local feeds
// it, with its log lines kept: what the in-memory backend tests drive.
import { Writable } from 'node:stream';
import { pino, type Logger } from 'pino';
import { ServiceViews } from '../../src/localstate/views.js';
import { LocalDiff } from '../../src/diff/local-diff.js';
import { DecoderSink, type DecoderHandler } from '../../src/diff/decoder.js';
import { LocalSet } from '../../src/api/model.js';
import type { Store } from '../../src/store/store.js';

/** a logger at level that keeps every line it writes */
export function capturedLog(level = 'debug'): { log: Logger; lines: string[] } {
  const lines: string[] = [];
  const log = pino({ level }, new Writable({ write: (c, _e, cb) => (lines.push(String(c)), cb()) }));
  return { log, lines };
}

/** sync() sends the proxier what changed in the store since the last sync (node n1; Nodes and ServiceCIDRs unless sets says) */
export function driveProxier<P extends DecoderHandler & { close(): Promise<void> }>(store: Store, proxier: P, o: { nodeName?: string; sets?: LocalSet[] } = {}) {
  const diff = new LocalDiff(store, new ServiceViews(store), o.nodeName ?? 'n1', { sets: o.sets ?? [LocalSet.NodesSet, LocalSet.ServiceCIDRsSet] });
  const decoder = new DecoderSink(proxier);
  return {
    proxier,
    async sync() {
      for (const op of diff.next()) await decoder.send(op);
    },
    async close() {
      diff.close();
      await proxier.close();
    },
  };
}
