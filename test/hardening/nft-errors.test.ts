// A failing nft transaction is reported by its error and the part of the
// line nft points at, not by the whole transaction (issue 19: a sync's
// ~17 KB transaction was logged on every retry).
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { NftSession, NftError, runNft } from '../../src/backends/shared/nftables/nft.js';
import { canUseNetns, createNetns, type TestNetns } from '../helpers/netns.js';

describe('nft errors', { skip: canUseNetns() }, () => {
  let ns: TestNetns;
  before(() => {
    ns = createNetns();
    ns.exec('nft', ['-f', '-'], 'add table ip t\nadd set ip t s { type ipv4_addr; }\n');
  });
  after(() => ns?.remove());

  // one element command of ~20 KB with a bad comment near its end
  const many = Array.from({ length: 1500 }, (_, i) => `10.1.${i >> 8}.${i & 255}`).join(', ');
  const tx = `add element ip t s { ${many}, 10.2.0.1 comment "${'c'.repeat(130)}" }\n`;
  const check = (e: unknown) => {
    assert.ok(e instanceof NftError);
    assert.match(e.message, /comment too long/);
    assert.match(e.message, /10\.2\.0\.1 comment "c{10}/);
    assert.ok(e.message.length < 600, `${e.message.length} characters: ${e.message.slice(0, 300)}`);
    assert.ok(e.stderr.length > 15_000); // the whole of it stays on the error, for a debugger
    return true;
  };

  test('through a process of its own', async () => {
    await assert.rejects(runNft(['-f', '-'], tx, ns.wrapper('nft')), check);
  });

  test('through the long-lived session (a transaction is one line there)', async () => {
    const s = new NftSession(ns.wrapper('nft'));
    try {
      await assert.rejects(s.run(tx), check);
    } finally {
      s.close();
    }
  });
});
