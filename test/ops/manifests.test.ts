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
import { parseBrains } from '../../src/api/grpc/client.js';

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

test('split mode: several brains, one per node, a disruption budget, found without a Service', () => {
  const split = docs.filter((d) => d.file === 'kpng-split.yaml').map((d) => d.obj);
  const brain = split.find((o) => o.kind === 'Deployment' && o.metadata.name === 'kpng-brain');
  assert.ok(brain, 'the brain Deployment');
  const replicas = brain.spec.replicas;
  assert.ok(replicas >= 2, `replicas: ${replicas}`);
  const labels = brain.spec.template.metadata.labels;
  assert.notEqual(brain.spec.strategy?.type, 'Recreate', 'an update must not take every brain down at once');
  // one per node: required anti-affinity on the host name, against its own pods
  const anti = brain.spec.template.spec.affinity?.podAntiAffinity?.requiredDuringSchedulingIgnoredDuringExecution ?? [];
  assert.ok(
    anti.some((t: any) => t.topologyKey === 'kubernetes.io/hostname' && Object.entries(t.labelSelector?.matchLabels ?? {}).every(([k, v]) => labels[k] === v)),
    'required anti-affinity between brains',
  );
  // a PodDisruptionBudget that leaves at least one brain up
  const pdb = split.find((o) => o.kind === 'PodDisruptionBudget' && Object.entries(o.spec.selector.matchLabels).every(([k, v]) => labels[k] === v));
  assert.ok(pdb, 'a PodDisruptionBudget for the brains');
  const down = pdb.spec.maxUnavailable ?? replicas - pdb.spec.minAvailable;
  assert.ok(down >= 1 && down < replicas, `the budget lets ${down} of ${replicas} brains go at once`);
  // nodes find the brains by a list of host-network addresses, not by a Service kpng itself would program
  assert.equal(brain.spec.template.spec.hostNetwork, true);
  assert.ok(!split.some((o) => o.kind === 'Service'), 'no Service between nodes and brains');
  const node = split.find((o) => o.kind === 'DaemonSet');
  const c = node.spec.template.spec.containers[0];
  const api = c.args.find((a: string) => a.startsWith('--api='))!.slice('--api='.length);
  const ref = /^\$\((\w+)\)$/.exec(api);
  assert.ok(ref, `--api from the environment: ${api}`);
  const key = c.env.find((e: any) => e.name === ref[1])?.valueFrom?.configMapKeyRef;
  const cm = split.find((o) => o.kind === 'ConfigMap' && o.metadata.name === key?.name);
  const brains = parseBrains(cm.data[key.key]);
  assert.equal(brains.length, replicas, 'one address per brain');
  for (const b of brains) assert.match(b, /^tcp:\/\/[\d.]+:12090$/, 'a node IP and the brains\' port');
  assert.ok(brain.spec.template.spec.containers[0].args.includes('--listen=tcp://0.0.0.0:12090'));
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
