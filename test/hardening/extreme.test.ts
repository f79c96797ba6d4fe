// Every backend programs every legal Service, however extreme (issue 19:
// a 63-character namespace, name and port name made an nft comment too long
// and froze every update on the node).
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { pino } from 'pino';
import { syncedStore } from '../helpers/k8s.js';
import { extremeCluster } from '../helpers/extreme.js';
import { LocalSet } from '../../src/api/model.js';
import { NftProxier } from '../../src/backends/nft/proxier.js';
import { canUseNetns, createNetns, type TestNetns } from '../helpers/netns.js';
import { harness as iptablesHarness, iptablesUnsupported, MODES } from '../helpers/iptables.js';
import { driveProxier, printed, testConfig } from '../helpers/proxier-harness.js';
import { toolName } from '../../src/backends/iptables/iptables.js';
import { ConntrackNetlink } from '../../src/kernel/conntrack.js';

const quiet = pino({ level: 'silent' });

describe('legal but extreme objects, nft', { skip: canUseNetns() }, () => {
  let ns: TestNetns;
  before(() => (ns = createNetns()));
  after(() => ns?.remove());

  test('every service is programmed, and a restart finds nothing to change', async () => {
    const { objects, expect } = extremeCluster();
    const store = syncedStore(objects);
    const config = testConfig((c) => (c.clusterCIDRs = ['10.0.0.0/8', 'fd00::/64']));
    const run = async () => {
      const proxier = new NftProxier({ nodeName: 'n1', config, log: quiet, once: true, nftPath: ns.wrapper('nft'), conntrack: new ConntrackNetlink(ns.name), healthChecks: false, out: printed().sink });
      const h = driveProxier(store, proxier, { sets: [LocalSet.NodesSet] });
      try {
        await h.sync();
        return proxier.stats.lastElementChanges;
      } finally {
        await h.close();
      }
    };
    assert.ok((await run()) > 0);
    const table = ns.exec('nft', ['list', 'table', 'ip', 'kpng']) + ns.exec('nft', ['list', 'table', 'ip6', 'kpng']);
    for (const [svc, ips] of expect) for (const ip of ips) assert.match(table, new RegExp(`\\b${ip.replace(/[.]/g, '\\.')} \\. (tcp|udp|sctp) \\.`), `${svc}: ${ip}`);
    // what was written reads back the same (comments cut to nft's limit included)
    assert.equal(await run(), 0);
  });
});

for (const mode of MODES) {
  describe(`legal but extreme objects, iptables-${mode}`, { skip: iptablesUnsupported(mode) }, () => {
    let ns: TestNetns;
    before(() => (ns = createNetns()));
    after(() => ns?.remove());

    test('every service is programmed', async () => {
      const { objects, expect } = extremeCluster();
      const h = iptablesHarness(syncedStore(objects), { ns, mode, config: testConfig((c) => (c.clusterCIDRs = ['10.0.0.0/8', 'fd00::/64'])), families: [4, 6] });
      await h.sync();
      const saved = ns.exec(toolName(4, mode, 'save'), []) + ns.exec(toolName(6, mode, 'save'), []);
      for (const [svc, ips] of expect) for (const ip of ips) assert.match(saved, new RegExp(`-d ${ip.replace(/[.]/g, '\\.')}/(32|128) `), `${svc}: ${ip}`);
      // what was written reads back the same (comments included): a restart rewrites no service chain
      const rules = () => (ns.exec(toolName(4, mode, 'save'), []) + ns.exec(toolName(6, mode, 'save'), [])).replace(/^#.*\n/gm, '');
      const written = rules();
      h.restart();
      await h.sync();
      assert.equal(rules(), written);
    });
  });
}
