// The Kubernetes manifests: kinds, RBAC limited to reading what a proxy needs,
// a valid KubeProxyConfiguration, and container arguments the CLI accepts.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { parseAllDocuments } from 'yaml';
import type { Command } from 'commander';
import { buildProgram } from '../../src/cli/main.js';
import { parseConfig } from '../../src/backends/shared/config.js';
import { ROOT } from '../helpers/cli.js';

const DIR = join(ROOT, 'deploy/kubernetes');
const docs = readdirSync(DIR)
  .filter((f) => f.endsWith('.yaml'))
  .flatMap((f) => parseAllDocuments(readFileSync(join(DIR, f), 'utf8')).map((d) => ({ file: f, obj: d.toJS() as any })));

/** true when the CLI parses these arguments (nothing runs) */
async function accepted(args: string[]): Promise<string | undefined> {
  const program = buildProgram(async () => {});
  const quiet = (c: Command) => {
    c.exitOverride();
    c.configureOutput({ writeOut: () => {}, writeErr: () => {} });
    c.commands.forEach(quiet);
  };
  quiet(program);
  try {
    await program.parseAsync(['node', 'kpng', ...args]);
    return undefined;
  } catch (e) {
    return (e as Error).message;
  }
}

test('the manifests hold what a deployment needs', () => {
  const kinds = docs.map((d) => d.obj.kind).sort();
  for (const k of ['ServiceAccount', 'ClusterRole', 'ClusterRoleBinding', 'ConfigMap', 'DaemonSet', 'Deployment']) assert.ok(kinds.includes(k), k);
  // both modes: kpng kube ... to-local on every node; a to-api brain and kpng local nodes
  const args = docs.filter((d) => ['DaemonSet', 'Deployment'].includes(d.obj.kind)).map((d) => d.obj.spec.template.spec.containers[0].args.join(' '));
  assert.ok(args.some((a) => /^kube .*to-local to-nft/.test(a)), 'single-process mode');
  assert.ok(args.some((a) => /^kube .*to-api /.test(a)), 'brain');
  assert.ok(args.some((a) => /^local .*to-nft/.test(a)), 'node of a brain');
});

test('RBAC: get, list and watch of Services, EndpointSlices, Nodes and ServiceCIDRs, nothing else', () => {
  const roles = docs.filter((d) => d.obj.kind === 'ClusterRole' || d.obj.kind === 'Role');
  assert.ok(roles.length > 0);
  const granted = new Set<string>();
  for (const r of roles) {
    for (const rule of r.obj.rules) {
      assert.deepEqual([...rule.verbs].sort(), ['get', 'list', 'watch'], `${r.file}: verbs`);
      for (const g of rule.apiGroups) for (const res of rule.resources) granted.add(`${g}/${res}`);
    }
  }
  assert.deepEqual([...granted].sort(), ['/nodes', '/services', 'discovery.k8s.io/endpointslices', 'networking.k8s.io/servicecidrs']);
});

test('every KubeProxyConfiguration in a ConfigMap is valid', () => {
  const configs = docs.filter((d) => d.obj.kind === 'ConfigMap').flatMap((d) => Object.entries(d.obj.data ?? {}).map(([k, v]) => ({ where: `${d.file} ${k}`, text: String(v) })));
  assert.ok(configs.length > 0);
  for (const c of configs) {
    const doc = parseAllDocuments(c.text)[0].toJS();
    if (doc?.kind !== 'KubeProxyConfiguration') continue;
    assert.doesNotThrow(() => parseConfig(doc), c.where);
  }
});

test("every container's arguments are accepted by the CLI", async () => {
  const containers = docs
    .filter((d) => ['DaemonSet', 'Deployment'].includes(d.obj.kind))
    .flatMap((d) => [...(d.obj.spec.template.spec.initContainers ?? []), ...d.obj.spec.template.spec.containers].map((c: any) => ({ where: `${d.file} ${d.obj.metadata.name}/${c.name}`, args: c.args as string[] })));
  assert.ok(containers.length > 0);
  for (const c of containers) {
    assert.ok(Array.isArray(c.args) && c.args.length > 0, `${c.where}: args`);
    assert.equal(await accepted(c.args), undefined, `${c.where}: kpng ${c.args.join(' ')}`);
  }
  // and the check does refuse what the CLI refuses
  assert.notEqual(await accepted(['kube', 'to-local', 'to-nft', '--no-such-flag']), undefined);
  assert.notEqual(await accepted(['kube', 'to-local', 'to-bogus']), undefined);
});
