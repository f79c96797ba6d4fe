// to-iptables on the command line, in the form: registered below
// to-local, --dry-run prints each family's iptables-restore input,
// --iptables-mode is checked.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { list } from '../helpers/lab-kpng.js';
import { node, service, slice } from '../helpers/k8s.js';

const KPNG = fileURLToPath(new URL('../../bin/kpng.js', import.meta.url));

function kpng(args: string[]) {
  const dir = mkdtempSync(join(tmpdir(), 'kpng-ipt-cli-'));
  try {
    const state = join(dir, 'state.json');
    const config = join(dir, 'config.json');
    writeFileSync(state, JSON.stringify(list([node('n1', undefined, ['192.168.0.2']), service('ns1', 'svc1', { clusterIP: '172.30.0.41', ports: [{ name: 'p80', port: 80 }] }), slice('ns1', 'svc1-1', 'svc1', [{ ip: '10.180.0.1' }], [{ name: 'p80', port: 80 }])])));
    writeFileSync(config, JSON.stringify({ apiVersion: 'kubeproxy.config.k8s.io/v1alpha1', kind: 'KubeProxyConfiguration', mode: 'iptables', clusterCIDR: '10.0.0.0/8' }));
    // the form of the issue: kpng file --input STATE --node-name NODE to-local to-iptables --config CONFIG ...
    return spawnSync(process.execPath, [KPNG, 'file', '--input', state, '--node-name', 'n1', 'to-local', 'to-iptables', '--config', config, ...args], { encoding: 'utf8', timeout: 60_000 });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

test('--dry-run --once prints the restore input of both families and exits 0', () => {
  const r = kpng(['--dry-run', '--once', '--iptables-mode', 'legacy']);
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /^# iptables-legacy-restore --noflush -w 5\n\*filter\n/);
  assert.match(r.stdout, /^# ip6tables-legacy-restore --noflush -w 5$/m);
  assert.match(r.stdout, /^-A KUBE-SERVICES -d 172\.30\.0\.41\/32 -p tcp -m comment --comment "ns1\/svc1:p80 cluster IP" -m tcp --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O$/m);
  assert.match(r.stdout, /^-A KUBE-SEP-SXIVWICOYRO3J4NJ -p tcp -m comment --comment "ns1\/svc1:p80" -m tcp -j DNAT --to-destination 10\.180\.0\.1:80$/m);
});

test('--iptables-mode accepts nft and legacy only', () => {
  const r = kpng(['--dry-run', '--once', '--iptables-mode', 'ipvs']);
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /--iptables-mode.*Allowed choices are nft, legacy/);
});
