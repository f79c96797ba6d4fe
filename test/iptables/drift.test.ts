// Drift repair with to-iptables as kpng runs it (the check every
// syncPeriod), in a throwaway namespace, with iptables-nft and
// iptables-legacy: an endpoint's DNAT rule replaced by hand with one of the
// same size (another destination: the table's rule count and size do not
// move) is repaired within 2 x syncPeriod; kpng's own restores are never
// taken for someone else's.
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { syncedStore } from '../helpers/k8s.js';
import { recordingLogger } from '../helpers/logs.js';
import { until } from '../helpers/until.js';
import { ENDPOINT, driftCluster, watchingIptables } from '../helpers/drift.js';
import { createNetns, type TestNetns } from '../helpers/netns.js';
import { MODES, iptablesUnsupported } from '../helpers/iptables.js';
import { toolName } from '../../src/backends/iptables/iptables.js';
import { xtablesDigest } from '../../src/kernel/xtables.js';

// (2 s: the repair itself, an iptables-save and restores, fits in the bound on a busy machine)
const SYNC_PERIOD_MS = 2000;

for (const mode of MODES) {
  describe(`iptables-${mode} drift repair`, { skip: iptablesUnsupported(mode) }, () => {
    let ns: TestNetns;
    before(() => (ns = createNetns('kpng-iptd')));
    after(() => ns?.remove());

    test('an endpoint rule replaced with one of the same size is repaired within 2 x syncPeriod; nothing else is', async () => {
      const ipt = toolName(4, mode, '');
      const { log, records } = recordingLogger();
      const h = watchingIptables(syncedStore(driftCluster()), mode, { netns: ns.name, tool: (t) => ns.wrapper(t), syncPeriodMs: SYNC_PERIOD_MS, log });
      const dnat = () => ns.exec(ipt, ['-w', '5', '-t', 'nat', '-S']).split('\n').find((l) => l.includes('-j DNAT'));
      try {
        await h.sync();
        const stats = h.proxier.stats;
        // quiet: kpng's own restores are not drift
        await until('three drift checks', () => stats.driftChecks >= 3, { timeoutMs: 10 * SYNC_PERIOD_MS });
        assert.equal(stats.repairs, 0, records.map((r) => r.why).join(' | '));
        const rule = dnat() ?? '';
        assert.ok(rule.includes(`--to-destination ${ENDPOINT}:8080`), rule);
        const [, chain] = rule.split(' ');
        // (iptables-legacy's: iptables-nft has no such table, undefined both times)
        const natSize = async () => {
          const d = await xtablesDigest(4, 'nat', ns.name);
          return d && [d.entries, d.size];
        };
        const sizeBefore = await natSize();
        // the DNAT is the endpoint chain's second rule (after the hairpin mark)
        const replaced = rule.slice(`-A ${chain} `.length).replace(`${ENDPOINT}:8080`, '10.66.6.66:8080');
        const t0 = Date.now();
        ns.exec('sh', ['-c', `${ipt} -w 5 -t nat -R ${chain} 2 ${replaced}`]);
        assert.match(dnat() ?? '', /10\.66\.6\.66:8080/);
        assert.deepEqual(await natSize(), sizeBefore, 'the same rule count and size');
        await until('the repair', () => stats.repairs >= 1, { timeoutMs: 2 * SYNC_PERIOD_MS });
        assert.ok(Date.now() - t0 <= 2 * SYNC_PERIOD_MS, `repaired after ${Date.now() - t0} ms`);
        assert.equal(dnat(), rule);
        const why = String(records.find((r) => r.why)?.why);
        assert.match(why, mode === 'legacy' ? /^iptables-legacy table ip nat changed: other rules of the same size \(\d+ rules, \d+ bytes\)$/ : new RegExp(`^rule (added|deleted) in table ip nat chain ${chain} by iptables`));
        // and then quiet again
        const checks = stats.driftChecks;
        await until('three more drift checks', () => stats.driftChecks >= checks + 3, { timeoutMs: 10 * SYNC_PERIOD_MS });
        assert.equal(stats.repairs, 1, records.map((r) => r.why).join(' | '));
      } finally {
        await h.close();
      }
    });
  });
}
