// The iptables backend against the real iptables-restore/-save, in a
// throwaway namespace, with iptables-nft and iptables-legacy: what the kernel
// lists, partial syncs, adoption after a restart (nothing rewritten), stale
// chains, recovery after a failure or a flush, other chains left alone, and
// choosing the mode the host uses.
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { syncedStore, load, service, slice, node } from '../helpers/k8s.js';
import { createNetns, type TestNetns } from '../helpers/netns.js';
import { MODES, harness, iptablesUnsupported, kubeChains, overall, saveIn } from '../helpers/iptables.js';
import { detectMode, parseSave, toolName, type IptablesMode } from '../../src/backends/iptables/iptables.js';
import { endpointChain, serviceChains } from '../../src/backends/iptables/names.js';
import { metrics } from '../../src/runtime/metrics.js';

const cluster = () => [
  node('n1', undefined, ['192.168.0.2', '2001:db8::1']),
  service('ns', 'web', { clusterIP: '172.30.0.10' }),
  slice('ns', 'web-1', 'web', [{ ip: '10.1.0.1', node: 'n1' }, { ip: '10.2.0.1', node: 'n2' }]),
  service('ns', 'web6', { type: 'NodePort', clusterIP: 'fd00:96::10', ipFamilies: ['IPv6'], ports: [{ name: 'http', port: 80, nodePort: 30080 }] }),
  slice('ns', 'web6-1', 'web6', [{ ip: 'fd00:10::10', node: 'n1' }]),
  service('ns', 'dns', { clusterIP: '172.30.0.53', ports: [{ name: 'dns', port: 53, protocol: 'UDP' }], sessionAffinity: 'ClientIP' }),
  slice('ns', 'dns-1', 'dns', [{ ip: '10.2.0.3', node: 'n2' }], [{ name: 'dns', port: 53, protocol: 'UDP' }]),
  service('ns', 'empty', { clusterIP: '172.30.0.30' }),
];

for (const mode of MODES) {
  describe(`iptables-${mode} in a namespace`, { skip: iptablesUnsupported(mode) }, () => {
    let ns: TestNetns;
    before(() => (ns = createNetns('kpng-ipt')));
    after(() => ns?.remove());

    /** a clean namespace for each test: the previous test's rules go */
    const fresh = () => {
      ns.remove();
      ns = createNetns('kpng-ipt');
    };

    test('what the kernel lists is what kpng wrote (upstream TestOverallIPTablesRules)', async () => {
      fresh();
      const objects = overall();
      const dry = harness(syncedStore(objects), { families: [4], node: 'test-node' });
      const written = await dry.sync();
      const h = harness(syncedStore(objects), { ns, mode, families: [4], node: 'test-node' });
      await h.sync();
      const saved = saveIn(ns, 4, mode);
      const wrote = parseSave(written);
      for (const table of ['filter', 'nat']) assert.deepEqual(kubeChains(saved.get(table)), kubeChains(wrote.get(table)), table);
      // the jump rules from the built-in chains, once each
      const input = saved.get('filter')!.chains.get('INPUT')!;
      assert.deepEqual(input, [
        '-A INPUT -j KUBE-FIREWALL',
        '-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL',
        '-A INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS',
        '-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES',
      ]);
      assert.equal(ns.exec('sysctl', ['-n', 'net.ipv4.conf.all.route_localnet']).trim(), '1');
    });

    test('a restart adopts the rules: no chain rewritten, no jump added twice, nothing else changes', async () => {
      fresh();
      const store = syncedStore(cluster());
      const h = harness(store, { ns, mode });
      await h.sync();
      assert.ok(h.proxier.stats.lastChainsWritten > 5);
      const before = [4, 6].map((f) => saveIn(ns, f as 4 | 6, mode));
      h.restart();
      await h.sync();
      assert.equal(h.proxier.stats.fullSyncs, 1);
      assert.equal(h.proxier.stats.lastChainsWritten, 0);
      assert.equal(h.proxier.stats.lastChainsDeleted, 0);
      const after = [4, 6].map((f) => saveIn(ns, f as 4 | 6, mode));
      for (let i = 0; i < 2; i++) for (const t of ['filter', 'nat', 'mangle']) assert.deepEqual([...after[i].get(t)!.chains], [...before[i].get(t)!.chains], `${t} v${i ? 6 : 4}`);
      // and the next change is a partial sync again
      load(store, [slice('ns', 'web-1', 'web', [{ ip: '10.1.0.1', node: 'n1' }])]);
      await h.sync();
      assert.equal(h.proxier.stats.lastChainsWritten, 1);
      assert.equal(h.proxier.stats.lastChainsDeleted, 1);
    });

    test('partial sync: one endpoint replaced, the kernel has exactly the new chains', async () => {
      fresh();
      const store = syncedStore(cluster());
      const h = harness(store, { ns, mode });
      await h.sync();
      load(store, [slice('ns', 'web-1', 'web', [{ ip: '10.1.0.1', node: 'n1' }, { ip: '10.2.0.9', node: 'n2' }])]);
      await h.sync();
      assert.equal(h.proxier.stats.fullSyncs, 1);
      assert.equal(h.proxier.stats.lastChainsWritten, 2);
      assert.equal(h.proxier.stats.lastChainsDeleted, 1);
      const nat = saveIn(ns, 4, mode).get('nat')!.chains;
      const svc = serviceChains('ns/web:http', 'tcp').svc;
      assert.ok(nat.has(endpointChain('ns/web:http', 'tcp', '10.2.0.9:8080')));
      assert.ok(!nat.has(endpointChain('ns/web:http', 'tcp', '10.2.0.1:8080')));
      assert.match(nat.get(svc)!.join('\n'), /-> 10\.2\.0\.9:8080" -j KUBE-SEP-/);
      // sync_proxy_rules_iptables_total counts what the kernel has of kpng's, kept up as chains change
      await assertRuleTotals(ns, mode);
      // the restart-time state equals the incremental one
      const incremental = kubeChains(saveIn(ns, 4, mode).get('nat'));
      h.restart();
      await h.sync();
      assert.equal(h.proxier.stats.lastChainsWritten, 0);
      assert.deepEqual(kubeChains(saveIn(ns, 4, mode).get('nat')), incremental);
      await assertRuleTotals(ns, mode);
    });

    test('Services deleted while kpng was down: their chains are deleted at start-up, other chains stay', async () => {
      fresh();
      // someone else's chains and rules, and kubelet's
      ns.exec(toolName(4, mode, 'restore'), ['--noflush'], '*filter\n:MY-FIREWALL - [0:0]\n-A MY-FIREWALL -s 198.51.100.0/24 -j DROP\n-A INPUT -j MY-FIREWALL\nCOMMIT\n*nat\n:KUBE-KUBELET-CANARY - [0:0]\n:MY-NAT - [0:0]\n-A MY-NAT -j RETURN\nCOMMIT\n');
      const store = syncedStore(cluster());
      const h = harness(store, { ns, mode });
      await h.sync();
      store.update((tx) => {
        tx.deleteService('ns', 'web');
        tx.deleteSlice('ns', 'web-1');
      });
      h.restart();
      await h.sync();
      assert.equal(h.proxier.stats.lastChainsDeleted, 3);
      const saved = saveIn(ns, 4, mode);
      const nat = saved.get('nat')!.chains;
      assert.ok(![...nat.keys()].some((c) => c === serviceChains('ns/web:http', 'tcp').svc));
      assert.deepEqual(nat.get('MY-NAT'), ['-A MY-NAT -j RETURN']);
      assert.ok(nat.has('KUBE-KUBELET-CANARY'));
      assert.deepEqual(saved.get('filter')!.chains.get('MY-FIREWALL'), ['-A MY-FIREWALL -s 198.51.100.0/24 -j DROP']);
      assert.ok(saved.get('filter')!.chains.get('INPUT')!.includes('-A INPUT -j MY-FIREWALL'));
    });

    test('a change that fails on chains deleted behind kpng\'s back is applied after reading them back', async () => {
      fresh();
      const store = syncedStore(cluster());
      const h = harness(store, { ns, mode });
      await h.sync();
      const svc = serviceChains('ns/web:http', 'tcp').svc;
      ns.exec(toolName(4, mode, ''), ['-t', 'nat', '-F', 'KUBE-SERVICES']);
      ns.exec(toolName(4, mode, ''), ['-t', 'nat', '-F', svc]);
      ns.exec(toolName(4, mode, ''), ['-t', 'nat', '-X', svc]);
      load(store, [slice('ns', 'dns-1', 'dns', [{ ip: '10.2.0.4', node: 'n2' }], [{ name: 'dns', port: 53, protocol: 'UDP' }])]);
      await h.sync();
      assert.equal(h.proxier.stats.fullSyncs, 2);
      assert.equal(h.proxier.stats.failures, 0);
      assert.match(saveIn(ns, 4, mode).get('nat')!.chains.get(svc)!.join('\n'), /-> 10\.1\.0\.1:8080/);
    });

    test('mode detection: kubelet\'s chains, KUBE-* chains, more rules, else nft', async () => {
      fresh();
      const tool = (t: string) => ns.wrapper(t);
      assert.deepEqual((await detectMode(tool)).mode, 'nft');
      ns.exec(toolName(4, mode, 'restore'), ['--noflush'], '*filter\n:MY - [0:0]\n-A MY -j RETURN\n-A MY -j RETURN\nCOMMIT\n');
      assert.equal((await detectMode(tool)).mode, mode);
      ns.exec(toolName(6, other(mode), 'restore'), ['--noflush'], '*mangle\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n');
      const d = await detectMode(tool);
      assert.equal(d.mode, other(mode), d.reason);
    });
  });
}

/** kubeproxy_sync_proxy_rules_iptables_total{table} equals the rules in the kernel's KUBE-* chains (IPv4) */
async function assertRuleTotals(ns: TestNetns, mode: IptablesMode): Promise<void> {
  const saved = saveIn(ns, 4, mode);
  const values = (await metrics.iptablesTotal.get()).values;
  for (const table of ['nat', 'filter']) {
    const kernel = Object.values(kubeChains(saved.get(table))).reduce((n, rules) => n + rules.filter((r) => r.startsWith('-A ')).length, 0);
    assert.ok(kernel > 0, table);
    assert.equal(values.find((v) => v.labels.table === table && v.labels.ip_family === 'IPv4')?.value, kernel, table);
  }
}

function other(m: IptablesMode): IptablesMode {
  return m === 'nft' ? 'legacy' : 'nft';
}
