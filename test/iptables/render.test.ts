// The iptables backend without a kernel: upstream's chain names and rules
// (TestOverallIPTablesRules), probabilities, traffic policies, detect-local
// modes, and what a partial sync sends to iptables-restore.
import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { syncedStore, load, service, slice, node } from '../helpers/k8s.js';
import { harness, kubeChains, overall } from '../helpers/iptables.js';
import { testConfig } from '../helpers/proxier-harness.js';
import { parseSave } from '../../src/backends/iptables/iptables.js';
import { base32, endpointChain, portProtoHash, probability, saveString, serviceChains } from '../../src/backends/iptables/names.js';
import type { KubeProxyConfiguration } from '../../src/backends/shared/config.js';

const UPSTREAM = readFileSync(new URL('./data/overall-iptables-rules.save', import.meta.url), 'utf8');

const v4 = (config?: KubeProxyConfiguration) => ({ families: [4 as const], node: 'test-node', config });

describe('names', () => {
  test('base32 is RFC 4648 (Go StdEncoding)', () => {
    assert.equal(base32(Buffer.from('foobar')), 'MZXW6YTBOI');
    assert.equal(base32(Buffer.from('f')), 'MY');
  });

  test('chain names are upstream\'s (TestOverallIPTablesRules)', () => {
    assert.equal(portProtoHash('ns1/svc1:p80', 'tcp'), 'XPGD46QRK7WJZT7O');
    assert.deepEqual(serviceChains('ns2/svc2:p80', 'tcp'), { svc: 'KUBE-SVC-GNZBNJ2PO5MGZ6GT', svl: 'KUBE-SVL-GNZBNJ2PO5MGZ6GT', ext: 'KUBE-EXT-GNZBNJ2PO5MGZ6GT', fw: 'KUBE-FW-GNZBNJ2PO5MGZ6GT' });
    assert.equal(serviceChains('ns5/svc5:p80', 'tcp').fw, 'KUBE-FW-NUKIZ6OKUXPJNT4C');
    assert.equal(endpointChain('ns1/svc1:p80', 'tcp', '10.180.0.1:80'), 'KUBE-SEP-SXIVWICOYRO3J4NJ');
    assert.equal(endpointChain('ns4/svc4:p80', 'tcp', '10.180.0.5:80'), 'KUBE-SEP-C6EBXVWJJZMIWKLZ');
    assert.equal(endpointChain('ns5/svc5:p80', 'tcp', '10.180.0.3:80'), 'KUBE-SEP-I77PXRDZVX7PMWMN');
    // an unnamed port is ns/name; the protocol is lowercase
    assert.equal(serviceChains('ns1/svc1', 'udp').svc.length, 'KUBE-SVC-'.length + 16);
  });

  test('probabilities are 1/n as the kernel keeps and iptables-save prints them', () => {
    assert.deepEqual([2, 3, 4, 5, 10].map(probability), ['0.50000000000', '0.33333333349', '0.25000000000', '0.20000000019', '0.10000000009']);
  });

  test('strings are quoted as iptables-save quotes them', () => {
    assert.equal(saveString('KUBE-SEP-X_1'), 'KUBE-SEP-X_1');
    assert.equal(saveString('ns1/svc1:p80'), '"ns1/svc1:p80"');
    assert.equal(saveString('a "b"'), '"a \\"b\\""');
  });
});

describe('rendering (dry run)', () => {
  test('upstream TestOverallIPTablesRules: the same chains and rules, as iptables-save lists them', async () => {
    const h = harness(syncedStore(overall()), v4());
    const mine = parseSave(await h.sync());
    const theirs = parseSave(UPSTREAM);
    for (const table of ['filter', 'nat']) {
      const want = kubeChains(theirs.get(table));
      const got = kubeChains(mine.get(table));
      delete got['KUBE-PROXY-CANARY'];
      assert.deepEqual(got, want, table);
    }
  });

  test('three endpoints: 1/3, 1/2, then unconditional; affinity checks first', async () => {
    const h = harness(
      syncedStore([
        node('n1', undefined, ['192.168.0.2']),
        service('ns', 'web', { clusterIP: '172.30.0.10', sessionAffinity: 'ClientIP', sessionAffinityConfig: { clientIP: { timeoutSeconds: 60 } } }),
        slice('ns', 'web-1', 'web', ['10.1.0.1', '10.1.0.2', '10.1.0.3'].map((ip) => ({ ip }))),
      ]),
      { families: [4] },
    );
    const svc = serviceChains('ns/web:http', 'tcp').svc;
    const rules = parseSave(await h.sync()).get('nat')!.chains.get(svc)!;
    assert.equal(rules.length, 1 + 3 + 3);
    assert.match(rules[1], /-m recent --rcheck --seconds 60 --reap --name KUBE-SEP-\w+ --mask 255\.255\.255\.255 --rsource -j KUBE-SEP-/);
    assert.match(rules[4], /"ns\/web:http -> 10\.1\.0\.1:8080" -m statistic --mode random --probability 0\.33333333349 -j KUBE-SEP-/);
    assert.match(rules[5], /--probability 0\.50000000000 -j KUBE-SEP-/);
    assert.match(rules[6], /"ns\/web:http -> 10\.1\.0\.3:8080" -j KUBE-SEP-/);
  });

  test('internalTrafficPolicy Local: KUBE-SVL with local endpoints only; none local: DROP in filter KUBE-SERVICES', async () => {
    const store = syncedStore([
      node('n1', undefined, ['192.168.0.2']),
      service('ns', 'web', { clusterIP: '172.30.0.10', internalTrafficPolicy: 'Local' }),
      slice('ns', 'web-1', 'web', [{ ip: '10.1.0.1', node: 'n1' }, { ip: '10.2.0.1', node: 'n2' }]),
    ]);
    const h = harness(store, { families: [4] });
    const { svl, svc } = serviceChains('ns/web:http', 'tcp');
    let nat = parseSave(await h.sync()).get('nat')!.chains;
    assert.match(nat.get('KUBE-SERVICES')![0], new RegExp(`-d 172\\.30\\.0\\.10/32 .* -j ${svl}$`));
    assert.equal(nat.get(svl)!.filter((r) => r.includes('-j KUBE-SEP-')).length, 1);
    assert.ok(!nat.has(svc));
    load(store, [slice('ns', 'web-1', 'web', [{ ip: '10.2.0.1', node: 'n2' }])]);
    const tables = parseSave(await h.sync());
    nat = tables.get('nat')!.chains;
    assert.deepEqual(tables.get('filter')!.chains.get('KUBE-SERVICES'), [
      '-A KUBE-SERVICES -d 172.30.0.10/32 -p tcp -m comment --comment "ns/web:http has no local endpoints" -m tcp --dport 80 -j DROP',
    ]);
    // the chains that went away are deleted in the same restore
    assert.match(await h.out.join(''), new RegExp(`^-X ${svl}$`, 'm'));
  });

  test('eTP=Local with a local endpoint: KUBE-EXT ends in KUBE-SVL (local only), KUBE-SVC keeps every endpoint; ipMode Proxy is not programmed', async () => {
    const h = harness(
      syncedStore([
        node('n1', undefined, ['192.168.0.2']),
        service(
          'ns',
          'lb',
          { type: 'LoadBalancer', clusterIP: '172.30.0.20', externalTrafficPolicy: 'Local', ports: [{ name: 'http', port: 80, nodePort: 30080 }] },
          { status: { loadBalancer: { ingress: [{ ip: '1.2.3.4' }, { ip: '5.6.7.8', ipMode: 'Proxy' }] } } },
        ),
        slice('ns', 'lb-1', 'lb', [{ ip: '10.1.0.2', node: 'n1' }, { ip: '10.2.0.2', node: 'n2' }]),
      ]),
      { families: [4] },
    );
    const tables = parseSave(await h.sync());
    const nat = tables.get('nat')!.chains;
    const { svc, svl, ext } = serviceChains('ns/lb:http', 'tcp');
    assert.equal(nat.get(ext)!.at(-1), `-A ${ext} -j ${svl}`);
    assert.equal(nat.get(svl)!.filter((r) => r.includes('-j KUBE-SEP-')).length, 1);
    assert.equal(nat.get(svc)!.filter((r) => r.includes('-j KUBE-SEP-')).length, 2);
    assert.ok(nat.get('KUBE-SERVICES')!.some((r) => r.includes('-d 1.2.3.4/32')));
    assert.ok(!nat.get('KUBE-SERVICES')!.some((r) => r.includes('5.6.7.8')));
    assert.deepEqual(tables.get('filter')!.chains.get('KUBE-EXTERNAL-SERVICES'), []);
  });

  test('terminating endpoints: used only when no endpoint is ready; not serving: REJECT', async () => {
    const store = syncedStore([
      node('n1', undefined, ['192.168.0.2']),
      service('ns', 'web', { clusterIP: '172.30.0.10' }),
      slice('ns', 'web-1', 'web', [{ ip: '10.1.0.1', ready: true }, { ip: '10.1.0.2', ready: false, serving: true, terminating: true }]),
    ]);
    const h = harness(store, { families: [4] });
    const svc = serviceChains('ns/web:http', 'tcp').svc;
    const jumps = (t: Map<string, { chains: Map<string, string[]> }>) => (t.get('nat')!.chains.get(svc) ?? []).filter((r) => r.includes('-j KUBE-SEP-')).map((r) => r.replace(/.*-> (\S+)".*/, '$1'));
    assert.deepEqual(jumps(parseSave(await h.sync())), ['10.1.0.1:8080']);
    load(store, [slice('ns', 'web-1', 'web', [{ ip: '10.1.0.2', ready: false, serving: true, terminating: true }])]);
    assert.deepEqual(jumps(parseSave(await h.sync())), ['10.1.0.2:8080']);
    load(store, [slice('ns', 'web-1', 'web', [{ ip: '10.1.0.2', ready: false, serving: false, terminating: true }])]);
    const t = parseSave(await h.sync());
    assert.deepEqual(t.get('filter')!.chains.get('KUBE-SERVICES'), [
      '-A KUBE-SERVICES -d 172.30.0.10/32 -p tcp -m comment --comment "ns/web:http has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable',
    ]);
  });

  test('detect-local modes and masqueradeAll shape the masquerade and short-circuit rules', async () => {
    const objects = () =>
      syncedStore([
        node('n1', undefined, ['192.168.0.2']),
        service('ns', 'lb', { type: 'LoadBalancer', clusterIP: '172.30.0.20', externalTrafficPolicy: 'Local', ports: [{ name: 'http', port: 80, nodePort: 30080 }] }, { status: { loadBalancer: { ingress: [{ ip: '1.2.3.4' }] } } }),
        slice('ns', 'lb-1', 'lb', [{ ip: '10.1.0.2', node: 'n1' }]),
      ]);
    const run = async (over: (c: KubeProxyConfiguration) => void) => {
      const nat = parseSave(await harness(objects(), { families: [4], config: testConfig(over) }).sync()).get('nat')!.chains;
      const { svc, ext } = serviceChains('ns/lb:http', 'tcp');
      return [...(nat.get(svc) ?? []), ...(nat.get(ext) ?? [])].join('\n');
    };
    assert.match(await run(() => {}), /-A KUBE-SVC-\w+ ! -s 10\.0\.0\.0\/8 -d 172\.30\.0\.20\/32 -p tcp .* -j KUBE-MARK-MASQ/);
    assert.match(await run(() => {}), /-A KUBE-EXT-\w+ -s 10\.0\.0\.0\/8 -m comment --comment "pod traffic for ns\/lb:http external destinations" -j KUBE-SVC-/);
    assert.match(await run((c) => (c.iptables.masqueradeAll = true)), /-A KUBE-SVC-\w+ -d 172\.30\.0\.20\/32 -p tcp .* -j KUBE-MARK-MASQ/);
    assert.match(await run((c) => ((c.detectLocalMode = 'BridgeInterface'), (c.detectLocal.bridgeInterface = 'cbr0'))), /-A KUBE-SVC-\w+ -d 172\.30\.0\.20\/32 ! -i cbr0 -p tcp/);
    assert.match(await run((c) => ((c.detectLocalMode = 'InterfaceNamePrefix'), (c.detectLocal.interfaceNamePrefix = 'veth'))), /-A KUBE-EXT-\w+ -i veth\+ -m comment --comment "pod traffic/);
    const none = await run((c) => (c.clusterCIDRs = []));
    assert.doesNotMatch(none, /KUBE-MARK-MASQ.*cluster IP|pod traffic/);
  });

  test('nodePortAddresses: one jump per matching node address; localhost only with localhostNodePorts', async () => {
    const objects = () => syncedStore([node('n1', undefined, ['192.168.0.2']), service('ns', 'np', { type: 'NodePort', clusterIP: '172.30.0.30', ports: [{ name: 'http', port: 80, nodePort: 30080 }] })]);
    const jumps = async (over: (c: KubeProxyConfiguration) => void) =>
      parseSave(await harness(objects(), { families: [4], config: testConfig(over), interfaces: ['127.0.0.1', '192.168.0.2', '192.168.1.2', '10.9.9.9'] }).sync())
        .get('nat')!
        .chains.get('KUBE-SERVICES')!
        .filter((r) => r.endsWith('-j KUBE-NODEPORTS'))
        .map((r) => r.replace(/ -m comment --comment "[^"]*"/, ''));
    assert.deepEqual(await jumps(() => {}), ['-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS']);
    assert.deepEqual(await jumps((c) => (c.iptables.localhostNodePorts = false)), ['-A KUBE-SERVICES ! -d 127.0.0.0/8 -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS']);
    assert.deepEqual(await jumps((c) => (c.nodePortAddresses = ['192.168.0.0/16'])), ['-A KUBE-SERVICES -d 192.168.0.2/32 -j KUBE-NODEPORTS', '-A KUBE-SERVICES -d 192.168.1.2/32 -j KUBE-NODEPORTS']);
    assert.deepEqual(await jumps((c) => (c.nodePortAddresses = ['127.0.0.0/8', '192.168.0.2/32'])), ['-A KUBE-SERVICES -d 127.0.0.1/32 -j KUBE-NODEPORTS', '-A KUBE-SERVICES -d 192.168.0.2/32 -j KUBE-NODEPORTS']);
    assert.deepEqual(await jumps((c) => (c.nodePortAddresses = ['primary'])), ['-A KUBE-SERVICES -d 192.168.0.2/32 -j KUBE-NODEPORTS']);
  });

  test('IPv6: ip6tables forms, no localhost NodePorts', async () => {
    const h = harness(
      syncedStore([
        node('n1', undefined, ['2001:db8::1']),
        service('ns', 'web6', { type: 'NodePort', clusterIP: 'fd00:96::10', ipFamilies: ['IPv6'], ports: [{ name: 'http', port: 80, nodePort: 30080 }] }),
        slice('ns', 'web6-1', 'web6', [{ ip: 'fd00:10::10', node: 'n1' }]),
      ]),
      { families: [6], config: testConfig((c) => (c.clusterCIDRs = ['fd00:10::/64'])) },
    );
    const out = await h.sync();
    const nat = parseSave(out).get('nat')!.chains;
    assert.match(nat.get('KUBE-SERVICES')![0], /-d fd00:96::10\/128 -p tcp .* -j KUBE-SVC-/);
    assert.ok(nat.get('KUBE-SERVICES')!.at(-1)!.startsWith('-A KUBE-SERVICES ! -d ::1/128 '));
    const sep = endpointChain('ns/web6:http', 'tcp', '[fd00:10::10]:8080');
    assert.deepEqual(nat.get(sep), [
      `-A ${sep} -s fd00:10::10/128 -m comment --comment "ns/web6:http" -j KUBE-MARK-MASQ`,
      `-A ${sep} -p tcp -m comment --comment "ns/web6:http" -m tcp -j DNAT --to-destination [fd00:10::10]:8080`,
    ]);
    assert.doesNotMatch(out, /KUBE-FIREWALL/);
  });
});

describe('partial sync (dry run)', () => {
  const cluster = () => [
    node('n1', undefined, ['192.168.0.2']),
    service('ns', 'a', { clusterIP: '172.30.0.1' }),
    slice('ns', 'a-1', 'a', [{ ip: '10.1.0.1' }, { ip: '10.1.0.2' }]),
    service('ns', 'b', { clusterIP: '172.30.0.2' }),
    slice('ns', 'b-1', 'b', [{ ip: '10.2.0.1' }]),
  ];

  test('one endpoint change: the top-level chains in full, only that service\'s chains, the old endpoint\'s chain deleted', async () => {
    const store = syncedStore(cluster());
    const h = harness(store, { families: [4] });
    await h.sync();
    load(store, [slice('ns', 'a-1', 'a', [{ ip: '10.1.0.1' }, { ip: '10.1.0.3' }])]);
    const tx = await h.sync();
    const declared = tx.split('\n').filter((l) => l.startsWith(':')).map((l) => l.slice(1, l.indexOf(' ')));
    const a = serviceChains('ns/a:http', 'tcp').svc;
    const gone = endpointChain('ns/a:http', 'tcp', '10.1.0.2:8080');
    const added = endpointChain('ns/a:http', 'tcp', '10.1.0.3:8080');
    assert.deepEqual(declared.sort(), [
      'KUBE-EXTERNAL-SERVICES', 'KUBE-FIREWALL', 'KUBE-FORWARD', 'KUBE-MARK-MASQ', 'KUBE-NODEPORTS', 'KUBE-NODEPORTS', 'KUBE-POSTROUTING', 'KUBE-PROXY-FIREWALL',
      'KUBE-SERVICES', 'KUBE-SERVICES', a, added, gone,
    ].sort());
    assert.match(tx, new RegExp(`^-X ${gone}$`, 'm'));
    assert.doesNotMatch(tx, new RegExp(`^:${serviceChains('ns/b:http', 'tcp').svc} `, 'm'));
    assert.equal(h.proxier.stats.lastChainsWritten, 2);
    assert.equal(h.proxier.stats.lastChainsDeleted, 1);
    assert.doesNotMatch(tx, /^-I /m, 'jump rules only on a full sync');
  });

  test('the Node changed but no chain did: no per-service chain is written', async () => {
    const store = syncedStore(cluster());
    const h = harness(store, { families: [4] });
    await h.sync();
    load(store, [node('n1', 'zone-b', ['192.168.0.2'])]);
    assert.match(await h.sync(), /^\*nat$/m);
    assert.equal(h.proxier.stats.syncs, 2);
    assert.equal(h.proxier.stats.lastChainsWritten, 0);
  });

  test('a Service deleted: all its chains deleted, the other Service\'s kept', async () => {
    const store = syncedStore(cluster());
    const h = harness(store, { families: [4] });
    await h.sync();
    store.update((tx) => {
      tx.deleteService('ns', 'a');
      tx.deleteSlice('ns', 'a-1');
    });
    const tx = await h.sync();
    assert.equal(h.proxier.stats.lastChainsDeleted, 3);
    assert.equal((tx.match(/^-X /gm) ?? []).length, 3);
    assert.match(tx, /172\.30\.0\.2\/32/);
    assert.doesNotMatch(tx, /172\.30\.0\.1\/32/);
  });

  test('more than 1000 endpoints: endpoint rules lose their comments (upstream large-cluster mode)', async () => {
    const objs = [node('n1', undefined, ['192.168.0.2'])];
    for (let s = 0; s < 201; s++) {
      objs.push(service('ns', `s${s}`, { clusterIP: `172.30.${s >> 8}.${s & 255}` }));
      objs.push(slice('ns', `s${s}-1`, `s${s}`, Array.from({ length: 5 }, (_, e) => ({ ip: `10.${s >> 8}.${s & 255}.${e + 1}` }))));
    }
    const nat = parseSave(await harness(syncedStore(objs), { families: [4] }).sync()).get('nat')!.chains;
    const svc = serviceChains('ns/s0:http', 'tcp').svc;
    assert.match(nat.get(svc)![0], /-m comment --comment "ns\/s0:http cluster IP"/);
    assert.doesNotMatch(nat.get(svc)![1], /comment/);
  });
});
