// The long-lived `nft -i` session against the real nft in a throwaway
// namespace: atomic transactions acknowledged by the marker protocol, errors
// reported (and nothing applied), the process replaced after maxRuns, and an
// nft that never answers recognised as unusable.
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, chmodSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { NftSession, NftError } from '../../src/backends/shared/nftables/nft.js';
import { canUseNetns, createNetns, type TestNetns } from '../helpers/netns.js';

describe('nft -i session', { skip: canUseNetns() }, () => {
  let ns: TestNetns;
  before(() => (ns = createNetns()));
  after(() => ns?.remove());
  const elements = () => ns.exec('nft', ['list', 'set', 'ip', 't', 's']);

  test('transactions are atomic; an error rejects and applies nothing; the next one works', async () => {
    const s = new NftSession(ns.wrapper('nft'), { maxRuns: 2 });
    try {
      await s.run('add table ip t\nadd set ip t s { type ipv4_addr; }\nadd element ip t s { 10.0.0.1 }\n');
      assert.match(elements(), /10\.0\.0\.1/);
      const failed = s.run('add element ip t s { 10.0.0.2 }\nadd element ip t nosuch { 10.0.0.3 }');
      await assert.rejects(failed, (e: unknown) => e instanceof NftError && /No such file or directory/.test(e.message));
      assert.doesNotMatch(elements(), /10\.0\.0\.2/);
      // several in a row (queued), across process replacements (maxRuns 2)
      await Promise.all([1, 2, 3, 4, 5].map((i) => s.run(`add element ip t s { 10.0.1.${i} }`)));
      for (let i = 1; i <= 5; i++) assert.match(elements(), new RegExp(`10\\.0\\.1\\.${i}\\b`));
      assert.ok(s.usable);
    } finally {
      s.close();
    }
  });

  test('an nft that never answers times out and is marked unusable', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kpng-nft-'));
    const silent = join(dir, 'nft');
    writeFileSync(silent, '#!/bin/sh\nexec cat >/dev/null\n');
    chmodSync(silent, 0o755);
    const s = new NftSession(silent, { timeoutMs: 300 });
    try {
      await assert.rejects(s.run('add table ip t2'), /no answer in 300 ms/);
      assert.equal(s.usable, false);
    } finally {
      s.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
