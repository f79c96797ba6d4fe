// A proxier fed by a store through the real diff stream, as to-local feeds
// it: what the backend tests drive, in memory or in a namespace. And the
// configuration those tests start from.
import { Writable } from 'node:stream';
import { ServiceViews } from '../../src/localstate/views.js';
import { LocalDiff } from '../../src/diff/local-diff.js';
import { DecoderSink, type DecoderHandler } from '../../src/diff/decoder.js';
import { LocalSet } from '../../src/api/model.js';
import { defaultConfig, type KubeProxyConfiguration } from '../../src/backends/shared/config.js';
import type { Store } from '../../src/store/store.js';

/** kube-proxy's defaults with the cluster's pod CIDR the test clusters use, then what over changes */
export function testConfig(over: (c: KubeProxyConfiguration) => void = () => {}): KubeProxyConfiguration {
  const c = defaultConfig();
  c.clusterCIDRs = ['10.0.0.0/8'];
  over(c);
  return c;
}

/** what a dry-run proxier prints (give it sink as its out), chunk by chunk */
export function printed(): { out: string[]; sink: Writable } {
  const out: string[] = [];
  return { out, sink: new Writable({ write: (c, _e, cb) => (out.push(String(c)), cb()) }) };
}

type Proxier = DecoderHandler & { close(): Promise<void> };

/**
 * sync() sends the proxier what changed in the store since the last sync
 * (node n1; Nodes and ServiceCIDRs unless sets says) and returns what the
 * proxier printed meanwhile, if printed is its out. With a function to
 * make the proxier, restart() is a new kpng process: fresh memory, a new
 * diff from nothing, the same dataplane.
 */
export function driveProxier<P extends Proxier>(store: Store, make: P | (() => P), o: { nodeName?: string; sets?: LocalSet[]; printed?: string[] } = {}) {
  const newDiff = () => new LocalDiff(store, new ServiceViews(store), o.nodeName ?? 'n1', { sets: o.sets ?? [LocalSet.NodesSet, LocalSet.ServiceCIDRsSet] });
  let proxier = typeof make === 'function' ? make() : make;
  let diff = newDiff();
  let decoder = new DecoderSink(proxier);
  return {
    get proxier(): P {
      return proxier;
    },
    async sync(): Promise<string> {
      if (o.printed) o.printed.length = 0;
      for (const op of diff.next()) await decoder.send(op);
      return o.printed?.join('') ?? '';
    },
    restart() {
      if (typeof make !== 'function') throw new Error('driveProxier: restart() needs a function that makes the proxier');
      diff.close();
      void proxier.close();
      proxier = make();
      decoder = new DecoderSink(proxier);
      diff = newDiff();
    },
    async close() {
      diff.close();
      await proxier.close();
    },
  };
}
