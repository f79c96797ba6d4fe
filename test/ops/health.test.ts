// /healthz, /livez and /metrics of a running kpng: unhealthy while applying
// fails (after 2 x syncPeriod), healthy again after recovery; unhealthy (but
// live) while its Node is being deleted; kube-proxy's metric names.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, rmSync, chmodSync, existsSync, unlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { kpngSpawn } from '../helpers/cli.js';
import { until } from '../helpers/until.js';
import { freePort } from '../helpers/port.js';
import { canUseNetns, createNetns, type TestNetns } from '../helpers/netns.js';
import { service, slice, node } from '../helpers/k8s.js';

const skip = canUseNetns();

async function get(port: number, path: string): Promise<{ code: number; body: string }> {
  const r = await fetch(`http://127.0.0.1:${port}${path}`);
  return { code: r.status, body: await r.text() };
}

/** health and metrics are fetched: a look costs */
const SLOW = { timeoutMs: 20_000, everyMs: 100 };

let ns: TestNetns;
let dir: string;
before(() => {
  if (skip) return;
  ns = createNetns();
  dir = mkdtempSync(join(tmpdir(), 'kpng-health-'));
});
after(() => {
  ns?.remove();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

test('health follows syncs, node deletion and recovery; metrics carry kube-proxy names', { skip }, async () => {
  const flag = join(dir, 'fail');
  // nft in the test namespace, failing while the flag file exists: a one-shot
  // nft exits 1; in the long-lived `nft -i` session each transaction line is
  // replaced by one nft rejects (the session's markers pass through)
  const nft = join(dir, 'nft');
  writeFileSync(
    nft,
    [
      '#!/bin/sh',
      'if [ "$1" = "-i" ]; then',
      '  while IFS= read -r line; do',
      '    case "$line" in',
      `      kpng-sync-*) printf '%s\\n' "$line" ;;`,
      `      *) if [ -e ${flag} ]; then printf 'injected-failure\\n'; else printf '%s\\n' "$line"; fi ;;`,
      '    esac',
      `  done | exec ip netns exec ${ns.name} nft -i`,
      '  exit',
      'fi',
      `if [ -e ${flag} ]; then echo "Error: injected failure" >&2; exit 1; fi`,
      `exec ip netns exec ${ns.name} nft "$@"`,
      '',
    ].join('\n'),
  );
  chmodSync(nft, 0o755);
  const state = join(dir, 'state');
  const write = (ips: string[], deleting = false) =>
    writeFileSync(
      join(dir, 'state.json'),
      JSON.stringify({
        kind: 'List',
        items: [
          node('n1', undefined, ['192.168.0.2'], deleting ? { metadata: { deletionTimestamp: '2026-11-21T00:00:00Z' } } : {}),
          service('ns', 'web', { clusterIP: '172.30.0.10' }),
          slice('ns', 'web-1', 'web', ips.map((ip) => ({ ip, pod: `p-${ip}` }))),
        ],
      }),
    );
  void state;
  write(['10.1.0.1']);
  const hz = await freePort();
  const mp = await freePort();
  const k = kpngSpawn([
    'file', '--input', dir, '--debounce', '20', '--node-name', 'n1',
    'to-local', 'to-nft', '--nft-path', nft, '--no-health-checks',
    '--sync-period', '1s', '--min-sync-period', '0s',
    '--healthz-bind-address', `127.0.0.1:${hz}`, '--metrics-bind-address', `127.0.0.1:${mp}`,
  ]);
  try {
    // healthy once the first state is programmed
    await until('the first sync', async () => {
      const r = await get(hz, '/healthz').catch(() => ({ code: 0, body: '{}' }));
      return r.code === 200 && !!JSON.parse(r.body).lastUpdated;
    }, SLOW);
    const ok = JSON.parse((await get(hz, '/healthz')).body);
    assert.equal(ok.healthy, true);
    assert.equal(ok.nodeEligible, true);
    assert.ok(ok.lastUpdated);

    // applying fails: unhealthy once the update has waited 2 x syncPeriod
    writeFileSync(flag, '');
    write(['10.1.0.1', '10.1.0.2']);
    await until('unhealthy', async () => (await get(hz, '/healthz')).code === 503, SLOW);
    assert.equal((await get(hz, '/livez')).code, 503);
    assert.equal(JSON.parse((await get(hz, '/healthz')).body).healthy, false);
    // the last good rules stayed
    assert.match(ns.exec('nft', ['list', 'map', 'ip', 'kpng', 'cluster-endpoints-tcp']), /10\.1\.0\.1 \. 8080/);

    // recovery: the retry applies the change and health comes back
    unlinkSync(flag);
    await until('healthy again', async () => (await get(hz, '/healthz')).code === 200, SLOW);
    assert.match(ns.exec('nft', ['list', 'map', 'ip', 'kpng', 'cluster-endpoints-tcp']), /10\.1\.0\.2 \. 8080/);

    // the Node going away: /healthz fails (drain me), /livez does not (do not restart me)
    write(['10.1.0.1', '10.1.0.2'], true);
    await until('node not eligible', async () => (await get(hz, '/healthz')).code === 503, SLOW);
    assert.equal(JSON.parse((await get(hz, '/healthz')).body).nodeEligible, false);
    assert.equal((await get(hz, '/livez')).code, 200);

    const m = (await get(mp, '/metrics')).body;
    for (const name of [
      'kubeproxy_sync_proxy_rules_duration_seconds_bucket',
      'kubeproxy_sync_full_proxy_rules_duration_seconds_count',
      'kubeproxy_sync_partial_proxy_rules_duration_seconds_count',
      'kubeproxy_sync_proxy_rules_last_timestamp_seconds',
      'kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds',
      'kubeproxy_network_programming_duration_seconds_bucket',
      'kubeproxy_sync_proxy_rules_endpoint_changes_total',
      'kubeproxy_sync_proxy_rules_service_changes_total',
      'kubeproxy_sync_proxy_rules_no_local_endpoints_total',
      'kubeproxy_sync_proxy_rules_nftables_sync_failures_total',
      'kubeproxy_proxy_healthz_total',
      'kubeproxy_proxy_livez_total',
      'kpng_api_events_total',
      'kpng_store_revisions_total',
      'kpng_node_local_ops_total',
      'kpng_stage_duration_seconds_bucket',
      'process_resident_memory_bytes',
    ]) {
      assert.match(m, new RegExp(`^${name}`, 'm'), name);
    }
    assert.match(m, /^kubeproxy_sync_proxy_rules_nftables_sync_failures_total\{ip_family="IPv4"\} [1-9]/m);
    assert.match(m, /^kubeproxy_proxy_healthz_total\{code="503"\} [1-9]/m);
    assert.equal((await get(mp, '/proxyMode')).body, 'nftables');
  } finally {
    if (existsSync(flag)) unlinkSync(flag);
    await k.stop();
  }
});
