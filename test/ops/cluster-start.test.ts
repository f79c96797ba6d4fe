// A cluster starting from nothing: no kube-proxy rules anywhere, so the
// `kubernetes` Service's ClusterIP leads nowhere and kpng must reach the API
// server at its real address with the pod's own credentials (a
// service-account token file and CA, as kubelet mounts them). Real kpng
// processes against the test API server:
// - a node agent with --master: its /healthz, /readyz and /livez while the
//   API server refuses it (503, 503, 200), its /metrics before the first event
//   (the series dashboards and alerts need, at 0; client-go's rest_client_*),
//   then healthy once the token is good and the node programmed;
// - a split-mode brain (kpng kube --master ... to-api) and a kpng local node
//   behind it, found by address: the node gets programmed;
// - the node's kube-proxy configuration naming a kubeconfig
//   (clientConnection.kubeconfig), as kubeadm's kube-proxy ConfigMap does.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { TestApiServer, tlsFile, writeKubeconfig } from '../helpers/apiserver.js';
import { nodeObject, serviceObject, sliceObject } from '../helpers/kube-cluster.js';
import { kpngSpawn } from '../helpers/cli.js';
import { freePort } from '../helpers/port.js';

async function get(port: number, path: string): Promise<{ code: number; body: string }> {
  const r = await fetch(`http://127.0.0.1:${port}${path}`);
  return { code: r.status, body: await r.text() };
}

async function until(what: string, f: () => boolean | Promise<boolean>, ms = 30_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await f())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** The environment of a pod on a node without kube-proxy: a service-account directory, no kubeconfig anywhere. */
function podEnv(dir: string, sa: string): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env, HOME: dir, KPNG_SERVICEACCOUNT_DIR: sa };
  delete env.KUBECONFIG;
  delete env.KUBERNETES_SERVICE_HOST;
  delete env.KUBERNETES_SERVICE_PORT;
  return env;
}

describe('a cluster starting without kube-proxy', () => {
  let dir: string;
  let sa: string;
  let server: TestApiServer;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'kpng-cold-'));
    sa = join(dir, 'serviceaccount');
    mkdirSync(sa);
    copyFileSync(tlsFile('ca.crt'), join(sa, 'ca.crt'));
    server = await new TestApiServer({ tokens: ['good-token'] }).start();
    server.put(nodeObject('node-a', 1));
    server.put(serviceObject('demo', 'web', '10.96.0.10'));
    server.put(sliceObject('demo', 'web-1', 'web', [{ name: 'web-1', ip: '10.244.1.5', node: 'node-a', ready: true }]));
  });

  after(async () => {
    await server?.close();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('a node agent with --master: not healthy until programmed, metrics there from the start, healthy once the API server lets it in', async () => {
    writeFileSync(join(sa, 'token'), 'not-yet-valid');
    const [hz, mp] = [await freePort(), await freePort()];
    const k = kpngSpawn(
      [
        'kube', '--master', server.url, '--watch-node', 'node-a',
        'to-local', '--state-socket', `unix://${join(dir, 'node.sock')}`,
        'to-nft', '--dry-run', '--node-name', 'node-a', '--sync-period', '1s',
        '--healthz-bind-address', `127.0.0.1:${hz}`, '--metrics-bind-address', `127.0.0.1:${mp}`,
      ],
      { env: podEnv(dir, sa) },
    );
    try {
      await k.until('the health server', () => k.stderr.includes('/healthz listening'));
      await until('requests refused by the API server', () => server.requests.filter((r) => r.status === 401).length >= 2);
      const hzBefore = await get(hz, '/healthz');
      assert.equal(hzBefore.code, 503, hzBefore.body);
      assert.equal(JSON.parse(hzBefore.body).lastUpdated, '');
      assert.equal(JSON.parse(hzBefore.body).healthy, false);
      assert.equal((await get(hz, '/readyz')).code, 503);
      assert.equal((await get(hz, '/livez')).code, 200, 'nothing is stuck: restarting would not help');

      // before the first event: every series the dashboards and alerts need, at 0, with kube-proxy's labels
      const m = (await get(mp, '/metrics')).body;
      const host = new URL(server.url).host;
      for (const series of [
        /^kubeproxy_sync_proxy_rules_duration_seconds_count\{ip_family="IPv4"\} 0$/m,
        /^kubeproxy_sync_full_proxy_rules_duration_seconds_count\{ip_family="IPv4"\} 0$/m,
        /^kubeproxy_sync_partial_proxy_rules_duration_seconds_count\{ip_family="IPv4"\} 0$/m,
        /^kubeproxy_network_programming_duration_seconds_bucket\{le="0.25",ip_family="IPv4"\} 0$/m,
        /^kubeproxy_network_programming_duration_seconds_count\{ip_family="IPv4"\} 0$/m,
        /^kubeproxy_sync_proxy_rules_nftables_sync_failures_total\{ip_family="IPv4"\} 0$/m,
        /^kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total\{ip_family="IPv4"\} 0$/m,
        /^kubeproxy_sync_proxy_rules_no_local_endpoints_total\{traffic_policy="internal",ip_family="IPv4"\} 0$/m,
        /^kubeproxy_sync_proxy_rules_last_timestamp_seconds\{ip_family="IPv4"\} 0$/m,
        /^kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds\{ip_family="IPv4"\} \d/m,
        /^kubeproxy_proxy_healthz_total\{code="200"\} 0$/m,
        /^kubeproxy_proxy_healthz_total\{code="503"\} [1-9]/m,
        /^kubeproxy_proxy_livez_total\{code="503"\} 0$/m,
        /^kpng_node_known 0$/m,
        new RegExp(`^rest_client_requests_total\\{code="200",method="GET",host="${host}"\\} 0$`, 'm'),
        new RegExp(`^rest_client_requests_total\\{code="401",method="GET",host="${host}"\\} [1-9]`, 'm'),
        new RegExp(`^rest_client_request_duration_seconds_bucket\\{le="0.005",verb="GET",host="${host}"\\} \\d`, 'm'),
      ]) {
        assert.match(m, series);
      }
      assert.doesNotMatch(m, /ip_family=""/);

      // the token becomes valid (kubelet mounts the projected one): kpng needs no restart
      writeFileSync(join(sa, 'token'), 'good-token');
      await until('healthy', async () => (await get(hz, '/healthz')).code === 200);
      const ok = JSON.parse((await get(hz, '/healthz')).body);
      assert.equal(ok.nodeEligible, true);
      assert.ok(ok.lastUpdated);
      assert.equal((await get(hz, '/readyz')).code, 200);
      assert.match(k.stdout, /10\.96\.0\.10/, 'the Service is in the transaction');
      const after = (await get(mp, '/metrics')).body;
      assert.match(after, /^kpng_node_known 1$/m);
      assert.match(after, new RegExp(`^rest_client_requests_total\\{code="200",method="GET",host="${host}"\\} [1-9]`, 'm'));
    } finally {
      await k.stop();
    }
  });

  it('split mode: a brain with --master and the service-account token, and a node that finds it by address', async () => {
    writeFileSync(join(sa, 'token'), 'good-token');
    const asked = server.requests.length;
    const api = `unix://${join(dir, 'brain.sock')}`;
    const hz = await freePort();
    const brain = kpngSpawn(['kube', '--master', server.url, 'to-api', '--listen', api, '--state-socket', '', '--metrics-bind-address', ''], { env: podEnv(dir, sa) });
    const node = kpngSpawn(
      ['local', '--api', api, '--state-socket', `unix://${join(dir, 'local.sock')}`, 'to-nft', '--dry-run', '--node-name', 'node-a', '--healthz-bind-address', `127.0.0.1:${hz}`, '--metrics-bind-address', ''],
      { env: podEnv(dir, sa) },
    );
    try {
      await until('the node programmed from its brain', async () => (await get(hz, '/healthz').catch(() => ({ code: 0 }))).code === 200);
      assert.match(node.stdout, /10\.96\.0\.10/);
      assert.deepEqual([...new Set(server.requests.slice(asked).map((r) => r.user))], ['token:good-'], 'every request carried the service-account token');
    } finally {
      await node.stop();
      await brain.stop();
    }
  });

  it("the node's kube-proxy configuration names the API server (clientConnection.kubeconfig)", async () => {
    writeFileSync(join(sa, 'token'), 'good-token');
    // kubeadm's kube-proxy kubeconfig: the control plane's address, the pod's token file and CA
    const kubeconfig = writeKubeconfig(join(dir, 'kubeconfig.conf'), { server: server.url, ca: { file: join(sa, 'ca.crt') }, user: { tokenFile: join(sa, 'token') } });
    const config = join(dir, 'config.yaml');
    writeFileSync(config, `apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclientConnection:\n  kubeconfig: ${kubeconfig}\n`);
    // (spawned, not run synchronously: the API server answers from this process)
    const k = kpngSpawn(['kube', '--watch-node', 'node-a', 'to-local', 'to-nft', '--dry-run', '--once', '--node-name', 'node-a', '--config', config], { env: podEnv(dir, join(dir, 'no-serviceaccount')) });
    try {
      assert.equal(await k.exited, 0, k.stderr);
      assert.match(k.stdout, /10\.96\.0\.10/);
    } finally {
      await k.stop();
    }
  });
});
