// Drift repair with to-nft as kpng runs it (the check every syncPeriod), in a
// throwaway network namespace: kpng's own transactions are never taken for
// someone else's, however many repairs came before (no repair once the
// foreign changes stop), and a foreign transaction is never taken for
// kpng's, even from another pid namespace by a process whose pid is one
// kpng's own pid namespace used (repaired within 2 x syncPeriod).
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { syncedStore } from '../helpers/k8s.js';
import { recordingLogger } from '../helpers/logs.js';
import { until } from '../helpers/until.js';
import { DELETE_SERVICE_IP, VIP, driftCluster, runAsPid, watchingNft } from '../helpers/drift.js';
import { canUseNetns, createNetns, type TestNetns } from '../helpers/netns.js';

const SYNC_PERIOD_MS = 1000;

describe('to-nft drift repair', { skip: canUseNetns() }, () => {
  let ns: TestNetns;
  before(() => (ns = createNetns('kpng-drift')));
  after(() => ns?.remove());

  const hasServiceIP = () => ns.exec('nft', ['list', 'map', 'ip', 'kpng', 'service-ips']).includes(VIP);

  test('100 foreign deletions, each repaired, then silence: no repair after the last one', async () => {
    ns.exec('nft', ['flush', 'ruleset']);
    const { log, records } = recordingLogger();
    const h = watchingNft(syncedStore(driftCluster()), { netns: ns.name, tool: (t) => ns.wrapper(t), syncPeriodMs: SYNC_PERIOD_MS, log });
    try {
      await h.sync();
      const stats = h.proxier.stats;
      for (let i = 1; i <= 100; i++) {
        ns.exec('nft', DELETE_SERVICE_IP);
        await until(`repair ${i}`, () => stats.repairs >= i, { timeoutMs: 4 * SYNC_PERIOD_MS });
        assert.equal(stats.repairs, i, `repair ${i} only: ${records.filter((r) => r.why).map((r) => r.why).slice(-3).join(' | ')}`);
      }
      assert.ok(hasServiceIP());
      // silence: five more checks run, and find nothing
      const checks = stats.driftChecks;
      await until('five more drift checks', () => stats.driftChecks >= checks + 5, { timeoutMs: 30 * SYNC_PERIOD_MS });
      assert.equal(stats.repairs, 100, `repaired again without a foreign change: ${records.filter((r) => r.why).map((r) => r.why).slice(-3).join(' | ')}`);
      // the log line says what changed, and who committed it
      const why = records.find((r) => r.why)?.why;
      assert.match(String(why), /element deleted in table ip kpng set service-ips by nft, generation \d+/);
    } finally {
      await h.close();
    }
  });

  test('in a pid namespace of its own, kpng repairs a foreign change by a process whose pid is one kpng used, within 2 x syncPeriod', async () => {
    ns.exec('nft', ['flush', 'ruleset']);
    // kpng's tools: nft noting each run's pid (the wrapper execs nft: the same pid) and what it was for
    const dir = mkdtempSync(join(tmpdir(), 'kpng-pidns-'));
    const runs = join(dir, 'runs');
    writeFileSync(join(dir, 'nft'), `#!/bin/sh\necho "$$ $*" >> ${runs}\nexec ip netns exec ${ns.name} nft "$@"\n`);
    chmodSync(join(dir, 'nft'), 0o755);
    writeFileSync(join(dir, 'conntrack'), `#!/bin/sh\nexec ip netns exec ${ns.name} conntrack "$@"\n`);
    chmodSync(join(dir, 'conntrack'), 0o755);
    const helper = fileURLToPath(new URL('../helpers/pidns-proxier.ts', import.meta.url));
    const kpng = spawn('unshare', ['--pid', '--fork', '--kill-child', '--mount-proc', process.execPath, '--import', 'tsx', helper, ns.name, dir, String(SYNC_PERIOD_MS)], { stdio: ['pipe', 'pipe', 'pipe'] });
    const lines: { ready?: boolean; repairs?: number; why?: string }[] = [];
    let stderr = '';
    let out = '';
    kpng.stdout.on('data', (d) => {
      out += d;
      for (let nl = out.indexOf('\n'); nl >= 0; nl = out.indexOf('\n')) {
        lines.push(JSON.parse(out.slice(0, nl)));
        out = out.slice(nl + 1);
      }
    });
    kpng.stderr.on('data', (d) => (stderr += d));
    const repairs = () => lines.reduce((n, l) => Math.max(n, l.repairs ?? 0), 0);
    try {
      await until('kpng (in its pid namespace) programmed the Service', () => lines.some((l) => l.ready), { timeoutMs: 30_000 }).catch((e) => assert.fail(`${e}\n${stderr}`));
      // a first foreign change: its repair lists the tables (nft processes of kpng's that end)
      ns.exec('nft', DELETE_SERVICE_IP);
      await until('the first repair', () => repairs() === 1, { timeoutMs: 4 * SYNC_PERIOD_MS });
      const listing = readFileSync(runs, 'utf8')
        .split('\n')
        .filter((l) => / list table /.test(l))
        .map((l) => Number(l.split(' ')[0]));
      assert.ok(listing.length > 0, readFileSync(runs, 'utf8'));
      const pid = listing[listing.length - 1];
      // another pid namespace's nft, numbered as kpng's listing nft was (its netlink port: that number too)
      const t0 = Date.now();
      const foreign = runAsPid(pid, ['ip', 'netns', 'exec', ns.name, 'nft', ...DELETE_SERVICE_IP]);
      assert.equal(foreign.status, 0, foreign.output);
      assert.equal(foreign.pid, pid, 'the foreign nft ran with the pid of one of kpng');
      assert.ok(!hasServiceIP());
      await until('the repair of the change by a colliding pid', () => repairs() === 2, { timeoutMs: 2 * SYNC_PERIOD_MS }).catch((e) => assert.fail(`${e}\n${stderr}`));
      assert.ok(Date.now() - t0 <= 2 * SYNC_PERIOD_MS, `repaired after ${Date.now() - t0} ms`);
      assert.ok(hasServiceIP());
      assert.match(lines.at(-1)!.why ?? '', /element deleted in table ip kpng set service-ips by nft/);
    } finally {
      kpng.stdin.end();
      const exited = kpng.exitCode !== null || kpng.signalCode !== null ? Promise.resolve() : new Promise((r) => kpng.once('exit', r));
      const killer = setTimeout(() => kpng.kill('SIGKILL'), 5000);
      await exited;
      clearTimeout(killer);
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
