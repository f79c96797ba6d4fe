// The store's revision moves only on real change; listeners hear what changed.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { syncedStore, load, service, slice, node } from '../helpers/k8s.js';
import { Store, KINDS } from '../../src/store/store.js';

test('writing what is stored changes nothing; a real change moves the revision once per update', () => {
  const store = syncedStore([service('ns', 'a'), slice('ns', 'a-1', 'a', [{ ip: '10.0.0.1' }]), node('n')]);
  const rev = store.rev;
  const changes: string[][] = [];
  store.subscribe((c) => changes.push([...c.services]));
  load(store, [service('ns', 'a'), slice('ns', 'a-1', 'a', [{ ip: '10.0.0.1' }]), node('n')]);
  assert.equal(store.rev, rev);
  assert.equal(changes.length, 0);
  load(store, [slice('ns', 'a-1', 'a', [{ ip: '10.0.0.2' }]), service('ns', 'b')]);
  assert.equal(store.rev, rev + 1);
  assert.deepEqual(changes, [['ns/a', 'ns/b']]);
});

test('events count every write; revisions count changes', () => {
  const store = new Store();
  for (let i = 0; i < 10; i++) load(store, [service('ns', 'a')]);
  assert.equal(store.events, 10);
  assert.equal(store.rev, 1);
});

test('a slice moving to another service touches both', () => {
  const store = syncedStore([service('ns', 'a'), service('ns', 'b'), slice('ns', 's', 'a', [{ ip: '10.0.0.1' }])]);
  let touched: string[] = [];
  store.subscribe((c) => (touched = [...c.services].sort()));
  load(store, [slice('ns', 's', 'b', [{ ip: '10.0.0.1' }])]);
  assert.deepEqual(touched, ['ns/a', 'ns/b']);
  assert.equal(store.slicesOfService('ns/a').length, 0);
  assert.equal(store.slicesOfService('ns/b').length, 1);
});

test('synced only when every kind has synced', () => {
  const store = new Store();
  let became = 0;
  store.subscribe((c) => (became += c.becameSynced ? 1 : 0));
  for (const k of KINDS.slice(0, -1)) store.update((tx) => tx.setSynced(k));
  assert.equal(store.allSynced, false);
  store.update((tx) => tx.setSynced(KINDS.at(-1)!));
  assert.equal(store.allSynced, true);
  assert.equal(became, 1);
});
