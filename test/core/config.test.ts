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
