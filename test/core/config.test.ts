// kube-proxy's configuration file: defaults, values, and strict refusal.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { parseConfig, configFromFlags, parseDuration } from '../../src/backends/shared/config.js';
import { ConfigError } from '../../src/runtime/errors.js';

function refused(doc: unknown): string {
  try {
    parseConfig(doc);
  } catch (e) {
    if (e instanceof ConfigError) return e.field;
    throw e;
  }
  assert.fail('expected a ConfigError');
}

test('a KubeProxyConfiguration is read with kube-proxy defaults', () => {
  const c = parseConfig({
    apiVersion: 'kubeproxy.config.k8s.io/v1alpha1',
    kind: 'KubeProxyConfiguration',
    clusterCIDR: '10.0.0.0/8, fd00:10::/64',
    detectLocalMode: 'ClusterCIDR',
    nodePortAddresses: ['192.168.0.2/32', 'primary'],
    nftables: { masqueradeAll: true, minSyncPeriod: '250ms', syncPeriod: '1m0s' },
    conntrack: { maxPerCore: null, tcpEstablishedTimeout: '24h0m0s' },
  });
  assert.deepEqual(c.clusterCIDRs, ['10.0.0.0/8', 'fd00:10::/64']);
  assert.deepEqual(c.nodePortAddresses, ['192.168.0.2/32', 'primary']);
  assert.equal(c.nftables.masqueradeAll, true);
  assert.equal(c.nftables.minSyncPeriodMs, 250);
  assert.equal(c.nftables.syncPeriodMs, 60_000);
  assert.equal(c.conntrack.maxPerCore, 32768);
  assert.equal(c.healthzBindAddress, '0.0.0.0:10256');
  assert.equal(c.metricsBindAddress, '127.0.0.1:10249');
  assert.equal(c.iptables.localhostNodePorts, true);
});

test('unknown and invalid fields are refused with their path', () => {
  assert.equal(refused({ clusterCidr: '10.0.0.0/8' }), 'clusterCidr');
  assert.equal(refused({ nftables: { masqueradeALL: true } }), 'nftables.masqueradeALL');
  assert.equal(refused({ clusterCIDR: '10.0.0.0/40' }), 'clusterCIDR');
  assert.equal(refused({ detectLocalMode: 'Magic' }), 'detectLocalMode');
  assert.equal(refused({ detectLocalMode: 'BridgeInterface' }), 'detectLocal.bridgeInterface');
  assert.equal(refused({ iptables: { syncPeriod: 'soon' } }), 'iptables.syncPeriod');
  assert.equal(refused({ nodePortAddresses: ['everywhere'] }), 'nodePortAddresses[0]');
  assert.equal(refused({ kind: 'KubeletConfiguration' }), 'kind');
  assert.equal(refused({ iptables: { masqueradeBit: 40 } }), 'iptables.masqueradeBit');
});

test('flags given override the file; flags not given do not', () => {
  const c = configFromFlags({ clusterCidr: '10.244.0.0/16', masqueradeAll: true, nodeportAddresses: 'primary,10.0.0.0/8' });
  assert.deepEqual(c.clusterCIDRs, ['10.244.0.0/16']);
  assert.equal(c.nftables.masqueradeAll, true);
  assert.deepEqual(c.nodePortAddresses, ['primary', '10.0.0.0/8']);
  assert.equal(configFromFlags({}).nftables.masqueradeAll, false);
});

test('Go durations', () => {
  assert.equal(parseDuration('1h0m0s', 'x'), 3_600_000);
  assert.equal(parseDuration('1.5s', 'x'), 1500);
  assert.equal(parseDuration('0', 'x'), 0);
  assert.throws(() => parseDuration('10', 'x'), ConfigError);
});

/** the refusal's message ("field: reason") */
function refusal(f: () => unknown): string {
  try {
    f();
  } catch (e) {
    if (e instanceof ConfigError) return e.message;
    throw e;
  }
  assert.fail('expected a ConfigError');
}

test("what kube-proxy's validation refuses is refused, naming the field", () => {
  for (const s of ['iptables', 'ipvs', 'nftables']) {
    // a period of nothing: a sync loop that never rests
    assert.match(refusal(() => parseConfig({ [s]: { syncPeriod: '0s', minSyncPeriod: '0s' } })), new RegExp(`^${s}\\.syncPeriod: 0s must be greater than 0$`));
    // 1ns is above 0, but below the default minSyncPeriod (ipvs: 0)
    if (s !== 'ipvs') assert.match(refusal(() => parseConfig({ [s]: { syncPeriod: '1ns' } })), new RegExp(`^${s}\\.syncPeriod: 1ns must be greater than or equal to ${s}\\.minSyncPeriod \\(1s\\)$`));
    assert.match(refusal(() => parseConfig({ [s]: { syncPeriod: '10s', minSyncPeriod: '20s' } })), new RegExp(`^${s}\\.syncPeriod: 10s must be greater than or equal to ${s}\\.minSyncPeriod \\(20s\\)$`));
    assert.match(refusal(() => parseConfig({ [s]: { minSyncPeriod: '-1s' } })), new RegExp(`^${s}\\.minSyncPeriod: -1s must be greater than or equal to 0$`));
  }
  assert.match(refusal(() => parseConfig({ ipvs: { tcpTimeout: '-5s' } })), /^ipvs\.tcpTimeout: -5s must be greater than or equal to 0$/);
  assert.match(refusal(() => parseConfig({ conntrack: { udpTimeout: '-1m' } })), /^conntrack\.udpTimeout: /);
  assert.match(refusal(() => parseConfig({ ipvs: { excludeCIDRs: ['10.0.0.0/8', 'lan'] } })), /^ipvs\.excludeCIDRs\[1\]: "lan" is not a CIDR$/);
  assert.match(refusal(() => parseConfig({ udpIdleTimeout: '0s' })), /^udpIdleTimeout: 0s must be greater than 0$/);
  assert.match(refusal(() => parseConfig({ configSyncPeriod: '0s' })), /^configSyncPeriod: /);
  assert.match(refusal(() => parseConfig({ healthzBindAddress: '0.0.0.0' })), /^healthzBindAddress: "0\.0\.0\.0" is not IP:port$/);
  assert.match(refusal(() => parseConfig({ metricsBindAddress: 'localhost:10249' })), /^metricsBindAddress: "localhost" is not an IP address$/);
  assert.match(refusal(() => parseConfig({ metricsBindAddress: '127.0.0.1:70000' })), /^metricsBindAddress: 70000 is not a port/);
  // what upstream takes, kpng takes: the smallest periods, a sync loop that never rests by choice
  const fast = parseConfig({ nftables: { syncPeriod: '1ns', minSyncPeriod: '0s' }, ipvs: { syncPeriod: '1ns' }, healthzBindAddress: '', metricsBindAddress: '[::1]:10249' });
  assert.equal(fast.nftables.syncPeriodMs, 1e-6);
  assert.equal(fast.nftables.minSyncPeriodMs, 0);
});

test('a refused period from a flag names the flag', () => {
  assert.match(refusal(() => configFromFlags({ syncPeriod: '0s' })), /^--sync-period: 0s must be greater than 0$/);
  assert.match(refusal(() => configFromFlags({ minSyncPeriod: '1m' })), /^(iptables|nftables)\.syncPeriod: 30s must be greater than or equal to --min-sync-period \(60s\)$/);
  assert.match(refusal(() => configFromFlags({ metricsBindAddress: ':x' })), /^--metrics-bind-address: /);
  assert.equal(configFromFlags({ syncPeriod: '1s', minSyncPeriod: '0s' }).nftables.syncPeriodMs, 1000);
});
