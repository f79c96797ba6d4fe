// The store keeps a slice's bytes packed (the names every endpoint repeats
// left out): what it hands back is the canonical bytes and endpoints, whatever they hold.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Store, encodeSlice, decodeSliceEndpoints } from '../../src/store/store.js';
import { namesPrefix, packSlice, unpackSlice } from '../../src/store/slice-pack.js';
import { randomMessages } from '../helpers/random-messages.js';

test('a slice reads back as written (bytes and endpoints), the names its endpoints repeat left out or not', () => {
  const random = randomMessages(11);
  for (const keepDecodedSlices of [false, true]) {
    const store = new Store({ keepDecodedSlices });
    for (let i = 0; i < 1500; i++) {
      const ns = ['ns', 'kube-system', 'é'][random.rnd(3)];
      const name = `s${random.rnd(40)}`;
      const svc = ['a', 'web', ''][random.rnd(3)];
      const endpoints = Array.from({ length: random.rnd(5) }, () => {
        const e = random.endpointInfo();
        // mostly the slice's own names, as a source writes them
        if (random.rnd(4)) Object.assign(e, { Hash: random.rnd(5) ? 0n : e.Hash, Namespace: ns, SourceName: name, ServiceName: svc });
        return e;
      });
      const bytes = encodeSlice(svc, endpoints);
      const rev = store.rev;
      const prev = store.getSlice(`${ns}/${name}`);
      store.update((tx) => (random.rnd(2) ? tx.setSliceBytes(ns, name, svc, bytes) : tx.setSlice(ns, name, svc, endpoints)));
      const got = store.getSlice(`${ns}/${name}`)!;
      assert.deepEqual(got.bytes, bytes, `slice ${i}`);
      assert.deepEqual(got.endpoints, decodeSliceEndpoints(bytes), `slice ${i}`);
      // the same bytes under the same service are no change; anything else is one
      const same = prev !== undefined && Buffer.from(prev.bytes).equals(Buffer.from(bytes));
      assert.equal(store.rev, same ? rev : rev + 1, `slice ${i}`);
    }
  }
});

test('packing is undone exactly, whatever the bytes (not framed as a slice: kept as they came)', () => {
  const random = randomMessages(5);
  const prefix = namesPrefix('ns', 'web-1', 'web').slice();
  for (let i = 0; i < 3000; i++) {
    const bytes = new Uint8Array(random.rnd(40));
    for (let j = 0; j < bytes.length; j++) bytes[j] = [0, 0, 1, 3, 0x12, 0x80, 0xff][random.rnd(7)];
    const packed = packSlice(bytes, prefix).slice();
    assert.deepEqual(unpackSlice(packed, prefix), bytes, `bytes ${i}`);
  }
});

test('a slice written again with the same bytes under another service name stays where it was: the bytes are what is compared', () => {
  const store = new Store();
  const bytes = encodeSlice('a', []);
  store.update((tx) => tx.setSliceBytes('ns', 's', 'a', bytes));
  store.update((tx) => tx.setSliceBytes('ns', 's', 'b', bytes));
  assert.equal(store.slicesOfService('ns/a').length, 1);
  assert.equal(store.slicesOfService('ns/b').length, 0);
});
