// The smallest sync periods kpng accepts (syncPeriod 1ns, minSyncPeriod 0s:
// the drift check runs back to back) must not take the process away from its
// signals: the real kpng, programming a namespace of the test's, stops
// promptly on SIGTERM (issue 40: over a minute, the event loop never turned).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { canUseNetns, createNetns, type TestNetns } from '../helpers/netns.js';
import { KPNG, ROOT } from '../helpers/cli.js';

/** kpng's normal stop takes about a second here; the starved loop took over 60 */
const STOP_WITHIN_MS = 15_000;

const skip = canUseNetns();
let ns: TestNetns;
let dir: string;
before(() => {
  if (skip) return;
  ns = createNetns('kpng-per');
  dir = mkdtempSync(join(tmpdir(), 'kpng-periods-'));
});
after(() => {
  ns?.remove();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

test('with syncPeriod 1ns and minSyncPeriod 0s, a real kpng stops promptly on SIGTERM', { skip, timeout: 90_000 }, async () => {
  const config = join(dir, 'config.yaml');
  writeFileSync(config, JSON.stringify({ apiVersion: 'kubeproxy.config.k8s.io/v1alpha1', kind: 'KubeProxyConfiguration', nftables: { syncPeriod: '1ns', minSyncPeriod: '0s' }, healthzBindAddress: '', metricsBindAddress: '' }));
  const args = ['file', '--input', join(ROOT, 'examples/cluster.yaml'), '--node-name', 'node-a', 'to-local', '--state-socket', 'none', 'to-nft', '--config', config, '--no-health-checks'];
  const p = spawn('ip', ['netns', 'exec', ns.name, ...KPNG, ...args], { cwd: ROOT, stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  p.stderr!.on('data', (d) => (stderr += d));
  const exited = new Promise<{ code: number | null; at: number }>((res) => p.on('exit', (code) => res({ code, at: Date.now() })));
  try {
    // programmed: the drift check now runs back to back
    const table = () => spawnSync('ip', ['netns', 'exec', ns.name, 'nft', 'list', 'set', 'ip', 'kpng', 'cluster-ips'], { encoding: 'utf8' }).stdout ?? '';
    for (let i = 0; !table().includes('10.96.') && i < 600; i++) {
      assert.equal(p.exitCode, null, `kpng exited before programming:\n${stderr}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.match(table(), /10\.96\./, `kpng did not program the namespace:\n${stderr}`);
    const t0 = Date.now();
    p.kill('SIGTERM');
    const timeout = new Promise<undefined>((res) => setTimeout(() => res(undefined), STOP_WITHIN_MS).unref());
    const stopped = await Promise.race([exited, timeout]);
    assert.ok(stopped, `kpng still ran ${STOP_WITHIN_MS} ms after SIGTERM\n${stderr.slice(-2000)}`);
    assert.equal(stopped.code, 0, stderr.slice(-2000));
    assert.match(stderr, /stopping signal=SIGTERM/);
    assert.ok(stopped.at - t0 < STOP_WITHIN_MS);
  } finally {
    if (p.exitCode === null && p.signalCode === null) {
      p.kill('SIGKILL');
      await exited;
    }
  }
});
