// The Kubernetes manifests (deploy/kustomize), every overlay rendered by
// kubectl kustomize under the operator's settings, and checked offline:
// resources shaped as the API expects them, the image and the API server's
// address from the one place that sets them, what each backend needs mounted,
// probes that mean "this node is programmed", memory bounds, RBAC limited to
// reading what a proxy needs, configurations kpng's parser takes and
// container arguments its CLI accepts.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { dirname, join, posix } from 'node:path';
import { parse } from 'yaml';
import type { Command } from 'commander';
import { buildProgram } from '../../src/cli/main.js';
import { parseConfig } from '../../src/backends/shared/config.js';
import { parseBindAddress } from '../../src/runtime/health.js';
import { parseBrains } from '../../src/api/grpc/client.js';
import { DEFAULT_BPFFS } from '../../src/backends/ebpf/defaults.js';
import { ROOT } from '../helpers/cli.js';
import { KUSTOMIZE, OVERLAYS, kustomize, kustomizeMissing, renderOverlay, topKustomization } from '../helpers/deploy.js';

type Obj = Record<string, any>;

const skip = kustomizeMissing();
const rendered = new Map<string, Obj[]>();
/** an overlay's resources, rendered once */
function resources(overlay: string): Obj[] {
  let r = rendered.get(overlay);
  if (!r) rendered.set(overlay, (r = renderOverlay(overlay)));
  return r;
}

const WORKLOADS = ['DaemonSet', 'Deployment'];
const workloads = (docs: Obj[]) => docs.filter((d) => WORKLOADS.includes(d.kind));
const podSpec = (w: Obj): Obj => w.spec.template.spec;
const containersOf = (w: Obj): Obj[] => [...(podSpec(w).initContainers ?? []), ...podSpec(w).containers];
/** the ConfigMap of that name (undefined when it is not rendered) */
const configMap = (docs: Obj[], name: string) => docs.find((d) => d.kind === 'ConfigMap' && d.metadata.name === name) as Obj;
const env = (c: Obj, name: string): Obj | undefined => (c.env ?? []).find((e: Obj) => e.name === name);
const flag = (args: string[], name: string) => args.find((a) => a.startsWith(`${name}=`))?.slice(name.length + 1);
const mebibytes = (q: string) => {
  const m = /^(\d+)(Mi|Gi)$/.exec(q);
  assert.ok(m, `memory quantity ${q} in Mi or Gi`);
  return Number(m[1]) * (m[2] === 'Gi' ? 1024 : 1);
};

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

test('the operator sets one overlay, the image and the API server address in one file', { skip }, () => {
  const { doc } = topKustomization();
  assert.equal(doc.bases.length, 1);
  assert.ok(OVERLAYS.includes(posix.basename(doc.bases[0])), `${doc.bases[0]} is an overlay`);
  assert.deepEqual(OVERLAYS, ['ebpf', 'iptables', 'ipvs', 'nft', 'split']);
  assert.equal(doc.bases[0], 'overlays/nft', 'nft is the default');
  const [image] = doc.images;
  assert.equal(image.name, 'kpng');
  const host = doc.configMapGenerator.find((g: Obj) => g.name === 'kpng-apiserver').literals.find((l: string) => l.startsWith('host='));
  assert.match(host, /^host=set-this-.*\.invalid$/, 'a placeholder that names itself and never resolves');
  // the shipped file renders as is
  assert.ok(kustomize(KUSTOMIZE).some((d) => d.kind === 'DaemonSet'));
});

for (const overlay of OVERLAYS) {
  test(`overlay ${overlay}: resources shaped as the API expects, wired to each other`, { skip }, () => {
    const docs = resources(overlay);
    const kinds = new Set(docs.map((d) => d.kind));
    for (const k of ['ServiceAccount', 'ClusterRole', 'ClusterRoleBinding', 'ConfigMap', 'DaemonSet']) assert.ok(kinds.has(k), k);
    for (const d of docs) {
      assert.match(d.apiVersion, /^([a-z0-9.-]+\/)?v\d+(beta\d+)?$/, `${d.kind} apiVersion`);
      assert.match(d.metadata?.name ?? '', /^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$/, `${d.kind} name`);
      if (!d.kind.startsWith('Cluster')) assert.equal(d.metadata.namespace, 'kube-system', `${d.kind} ${d.metadata.name} namespace`);
    }
    const { doc: top } = topKustomization();
    const image = `${top.images[0].newName}:${top.images[0].newTag}`;
    for (const w of workloads(docs)) {
      const where = `${w.kind} ${w.metadata.name}`;
      const labels = w.spec.template.metadata.labels;
      for (const [k, v] of Object.entries(w.spec.selector.matchLabels)) assert.equal(labels[k], v, `${where}: the selector matches its pods`);
      assert.equal(labels['app.kubernetes.io/name'], 'kpng', `${where}: the label monitoring selects`);
      const volumes = new Map<string, Obj>(podSpec(w).volumes.map((v: Obj) => [v.name, v]));
      for (const v of volumes.values()) {
        if (v.configMap) assert.ok(configMap(docs, v.configMap.name), `${where}: ConfigMap ${v.configMap.name} rendered`);
        if (v.hostPath) assert.match(v.hostPath.path, /^\//, `${where}: hostPath ${v.name}`);
      }
      assert.equal(podSpec(w).serviceAccountName, 'kpng');
      assert.equal(podSpec(w).hostNetwork, true, `${where}: on the host network`);
      assert.equal(podSpec(w).dnsPolicy, 'Default', `${where}: the node's resolver, not the cluster DNS behind a Service`);
      for (const c of containersOf(w)) {
        assert.equal(c.image, image, `${where}/${c.name}: the image from the top kustomization`);
        for (const m of c.volumeMounts ?? []) assert.ok(volumes.has(m.name), `${where}/${c.name}: volume ${m.name}`);
        for (const e of c.env ?? []) {
          assert.equal([e.value, e.valueFrom].filter((x) => x !== undefined).length, 1, `${where}/${c.name}: env ${e.name}`);
          const ref = e.valueFrom?.configMapKeyRef;
          if (ref) assert.ok(configMap(docs, ref.name)?.data?.[ref.key] !== undefined, `${where}/${c.name}: env ${e.name} from ${ref.name}/${ref.key}`);
        }
        for (const p of c.ports ?? []) assert.ok(Number.isInteger(p.containerPort) && p.name, `${where}/${c.name}: port ${p.name}`);
      }
    }
  });

  test(`overlay ${overlay}: node agents on every node, ready once their node is programmed`, { skip }, () => {
    const docs = resources(overlay);
    const ds = docs.filter((d) => d.kind === 'DaemonSet');
    assert.equal(ds.length, 1);
    const d = ds[0]!;
    const spec = podSpec(d);
    assert.equal(spec.priorityClassName, 'system-node-critical');
    assert.ok(spec.tolerations.some((t: Obj) => t.operator === 'Exists' && !t.key), 'tolerates every taint');
    assert.equal(d.spec.updateStrategy.type, 'RollingUpdate');
    assert.ok(d.spec.updateStrategy.rollingUpdate.maxUnavailable, 'maxUnavailable');
    const c = spec.containers[0];
    // the probes ask the health server the configuration binds
    const configFile = flag(c.args, '--config')!;
    const mount = c.volumeMounts.find((m: Obj) => m.mountPath === dirname(configFile));
    const cm = configMap(docs, spec.volumes.find((v: Obj) => v.name === mount.name).configMap.name);
    const config = parseConfig(parse(cm.data[posix.basename(configFile)]));
    const healthz = parseBindAddress(config.healthzBindAddress)!;
    for (const [probe, path] of [['startupProbe', '/readyz'], ['readinessProbe', '/readyz'], ['livenessProbe', '/livez']] as const) {
      assert.equal(c[probe]?.httpGet?.path, path, probe);
      assert.equal(c[probe].httpGet.port, healthz.port, `${probe} port`);
    }
    assert.equal(c.ports.find((p: Obj) => p.name === 'healthz').containerPort, healthz.port);
    const metrics = parseBindAddress(flag(c.args, '--metrics-bind-address')!)!;
    assert.equal(metrics.host, '$(NODE_IP)', 'metrics on the node address, where Prometheus scrapes');
    assert.equal(c.ports.find((p: Obj) => p.name === 'metrics').containerPort, metrics.port);
    assert.equal(env(c, 'NODE_IP')?.valueFrom?.fieldRef?.fieldPath, 'status.hostIP');
    // memory: a request, and a limit above it for the start's peak
    const request = mebibytes(c.resources.requests.memory);
    const limit = mebibytes(c.resources.limits.memory);
    assert.ok(request >= 64 && limit >= 1.5 * request, `memory ${request}Mi / ${limit}Mi`);
    // the state socket on the host
    assert.ok(c.volumeMounts.some((m: Obj) => m.mountPath === '/run/kpng' && spec.volumes.find((v: Obj) => v.name === m.name)?.hostPath?.path === '/run/kpng'));
  });

  test(`overlay ${overlay}: the API server's own address, never the kubernetes Service`, { skip }, () => {
    const docs = resources(overlay);
    const placeholder = configMap(docs, workloads(docs).flatMap((w) => podSpec(w).containers).map((c) => env(c, 'KUBERNETES_SERVICE_HOST')?.valueFrom?.configMapKeyRef?.name).find(Boolean));
    for (const w of workloads(docs)) {
      const c = podSpec(w).containers[0];
      const host = env(c, 'KUBERNETES_SERVICE_HOST')?.valueFrom?.configMapKeyRef;
      const port = env(c, 'KUBERNETES_SERVICE_PORT')?.valueFrom?.configMapKeyRef;
      if (c.args[0] !== 'kube') {
        // kpng local asks its brains, not the API server
        assert.equal(host, undefined, `${w.metadata.name}: no API server`);
        assert.equal(podSpec(w).automountServiceAccountToken, false, `${w.metadata.name}: no token`);
        continue;
      }
      assert.ok(host && port && host.name === port.name, `${w.metadata.name}: host and port from one ConfigMap`);
      assert.equal(configMap(docs, host.name), placeholder);
    }
    assert.match(placeholder.data.host, /set-this/);
    assert.match(placeholder.data.port, /^\d+$/);
  });
}

/** the node agent's container and its pod spec */
function nodeAgent(overlay: string): { c: Obj; spec: Obj; mountOf: (path: string) => Obj | undefined } {
  const spec = podSpec(resources(overlay).find((d) => d.kind === 'DaemonSet')!);
  const c = spec.containers[0];
  const mountOf = (path: string) => {
    const m = c.volumeMounts.find((x: Obj) => x.mountPath === path);
    return m && { ...m, volume: spec.volumes.find((v: Obj) => v.name === m.name) };
  };
  return { c, spec, mountOf };
}

test('each overlay runs its backend, labelled for monitoring', { skip }, () => {
  const backends: Record<string, string[]> = { nft: ['to-nft'], iptables: ['to-iptables'], ipvs: ['to-ipvs'], ebpf: ['to-ebpf', 'to-nft'], split: ['to-nft'] };
  for (const overlay of OVERLAYS) {
    const { c } = nodeAgent(overlay);
    assert.deepEqual(c.args.filter((a: string) => a.startsWith('to-') && a !== 'to-local'), backends[overlay], overlay);
    const label = resources(overlay).find((d) => d.kind === 'DaemonSet')!.spec.template.metadata.labels['kpng.io/backend'];
    assert.equal(label, overlay === 'split' ? 'nft' : overlay);
  }
});

test('iptables: the xtables lock shared with the node', { skip }, () => {
  assert.equal(nodeAgent('iptables').mountOf('/run/xtables.lock')?.volume.hostPath.path, '/run/xtables.lock');
  for (const o of ['nft', 'ebpf']) assert.equal(nodeAgent(o).mountOf('/run/xtables.lock'), undefined, `${o} has no xtables lock`);
});

test('ipvs: the host modules, read-only, and IPVS loaded before kpng starts', { skip }, () => {
  const { spec, mountOf } = nodeAgent('ipvs');
  const modules = mountOf('/lib/modules');
  assert.equal(modules?.volume.hostPath.path, '/lib/modules');
  assert.equal(modules.readOnly, true);
  const init = spec.initContainers.find((c: Obj) => c.command?.[0] === 'modprobe');
  assert.ok(init, 'an init container loads the modules');
  for (const m of ['ip_vs', 'nf_conntrack']) assert.ok(init.command.includes(m), m);
  assert.ok(init.volumeMounts.some((m: Obj) => m.mountPath === '/lib/modules' && m.readOnly));
});

test('ebpf: bpffs and the cgroup2 root of the host, to-nft beside to-ebpf', { skip }, () => {
  const { c, spec, mountOf } = nodeAgent('ebpf');
  // the pins go to the bpffs the host keeps (a restart adopts them)
  const bpffs = c.volumeMounts.find((m: Obj) => DEFAULT_BPFFS.startsWith(`${m.mountPath}/`));
  assert.equal(spec.volumes.find((v: Obj) => v.name === bpffs.name).hostPath.path, '/sys/fs/bpf');
  assert.equal(bpffs.mountPropagation, 'HostToContainer');
  const mounter = spec.initContainers.find((i: Obj) => i.volumeMounts.some((m: Obj) => m.name === bpffs.name && m.mountPropagation === 'Bidirectional'));
  assert.match(mounter.command.join(' '), /mount -t bpf bpf \/sys\/fs\/bpf/);
  const cgroup = mountOf(flag(c.args, '--cgroup-path')!);
  assert.equal(cgroup?.volume.hostPath.path, '/sys/fs/cgroup', '--cgroup-path is the host cgroup2 root');
  // the health and metrics servers come from the first backend's flags
  const ebpf = c.args.indexOf('to-ebpf');
  const nft = c.args.indexOf('to-nft');
  assert.ok(ebpf > 0 && nft > ebpf);
  assert.ok(c.args.slice(ebpf, nft).some((a: string) => a.startsWith('--metrics-bind-address=')));
  assert.ok(mebibytes(c.resources.limits.memory) > mebibytes(nodeAgent('nft').c.resources.limits.memory), 'room for the BPF maps');
});

test('split: several brains, one per node, a disruption budget, found without a Service', { skip }, () => {
  const split = resources('split');
  const brain = split.find((o) => o.kind === 'Deployment' && o.metadata.name === 'kpng-brain');
  assert.ok(brain, 'the brain Deployment');
  const replicas = brain.spec.replicas;
  assert.ok(replicas >= 2, `replicas: ${replicas}`);
  const labels = brain.spec.template.metadata.labels;
  assert.notEqual(brain.spec.strategy?.type, 'Recreate', 'an update must not take every brain down at once');
  // one per node: required anti-affinity on the host name, against its own pods
  const anti = podSpec(brain).affinity?.podAntiAffinity?.requiredDuringSchedulingIgnoredDuringExecution ?? [];
  assert.ok(
    anti.some((t: Obj) => t.topologyKey === 'kubernetes.io/hostname' && Object.entries(t.labelSelector?.matchLabels ?? {}).every(([k, v]) => labels[k] === v)),
    'required anti-affinity between brains',
  );
  // a PodDisruptionBudget that leaves at least one brain up
  const pdb = split.find((o) => o.kind === 'PodDisruptionBudget' && Object.entries(o.spec.selector.matchLabels).every(([k, v]) => labels[k] === v));
  assert.ok(pdb, 'a PodDisruptionBudget for the brains');
  const down = pdb.spec.maxUnavailable ?? replicas - pdb.spec.minAvailable;
  assert.ok(down >= 1 && down < replicas, `the budget lets ${down} of ${replicas} brains go at once`);
  // probes and memory bounds for the brain too
  const bc = podSpec(brain).containers[0];
  for (const p of ['startupProbe', 'readinessProbe', 'livenessProbe']) assert.equal(bc[p]?.tcpSocket?.port, 12090, p);
  assert.ok(mebibytes(bc.resources.limits.memory) > mebibytes(bc.resources.requests.memory));
  // nodes find the brains by a list of host-network addresses, not by a Service kpng itself would program
  assert.ok(!split.some((o) => o.kind === 'Service'), 'no Service between nodes and brains');
  const { c } = nodeAgent('split');
  const api = flag(c.args, '--api')!;
  const ref = /^\$\((\w+)\)$/.exec(api);
  assert.ok(ref, `--api from the environment: ${api}`);
  const key = env(c, ref[1]!)?.valueFrom?.configMapKeyRef;
  const brains = parseBrains(configMap(split, key.name).data[key.key]);
  assert.equal(brains.length, replicas, 'one address per brain');
  for (const b of brains) assert.match(b, /^tcp:\/\/[\d.]+:12090$/, "a node IP and the brains' port");
  assert.ok(bc.args.includes('--listen=tcp://0.0.0.0:12090'));
});

test('split: the cert-manager example makes the Secrets both sides mount, for the addresses nodes dial', { skip }, () => {
  const split = resources('split');
  const certs = kustomize(join(KUSTOMIZE, 'overlays/split/cert-manager'));
  const secretOf = (w: Obj) => podSpec(w).volumes.find((v: Obj) => v.secret)?.secret.secretName;
  const brain = split.find((o) => o.kind === 'Deployment')!;
  const node = split.find((o) => o.kind === 'DaemonSet')!;
  const cert = (secret: string) => certs.find((c) => c.kind === 'Certificate' && c.spec.secretName === secret);
  const brainCert = cert(secretOf(brain));
  const nodeCert = cert(secretOf(node));
  assert.ok(brainCert && nodeCert, 'a Certificate for each Secret mounted');
  assert.deepEqual(brainCert.spec.usages, ['server auth']);
  assert.deepEqual(nodeCert.spec.usages, ['client auth']);
  // one CA signs both, so each side's ca.crt checks the other
  assert.equal(brainCert.spec.issuerRef.name, nodeCert.spec.issuerRef.name);
  const ca = certs.find((c) => c.kind === 'Issuer' && c.metadata.name === brainCert.spec.issuerRef.name)!;
  assert.ok(certs.some((c) => c.kind === 'Certificate' && c.spec.isCA && c.spec.secretName === ca.spec.ca.secretName));
  // the brains' certificate names every address the nodes dial
  const key = env(nodeAgent('split').c, 'KPNG_BRAINS')!.valueFrom.configMapKeyRef;
  const hosts = parseBrains(configMap(split, key.name).data[key.key]).map((b) => new URL(b).hostname);
  assert.deepEqual([...brainCert.spec.ipAddresses].sort(), hosts.sort());
});

test('RBAC: get, list and watch of Services, EndpointSlices, Nodes and ServiceCIDRs, nothing else', { skip }, () => {
  for (const overlay of OVERLAYS) {
    const roles = resources(overlay).filter((d) => d.kind === 'ClusterRole' || d.kind === 'Role');
    assert.ok(roles.length > 0);
    const granted = new Set<string>();
    for (const r of roles) {
      for (const rule of r.rules) {
        assert.deepEqual([...rule.verbs].sort(), ['get', 'list', 'watch'], `${overlay}: verbs`);
        for (const g of rule.apiGroups) for (const res of rule.resources) granted.add(`${g}/${res}`);
      }
    }
    assert.deepEqual([...granted].sort(), ['/nodes', '/services', 'discovery.k8s.io/endpointslices', 'networking.k8s.io/servicecidrs'], overlay);
  }
});

test('every KubeProxyConfiguration in a ConfigMap is valid', { skip }, () => {
  let seen = 0;
  for (const overlay of OVERLAYS) {
    for (const d of resources(overlay).filter((x) => x.kind === 'ConfigMap')) {
      for (const [k, v] of Object.entries(d.data ?? {})) {
        const doc = parse(String(v));
        if (doc?.kind !== 'KubeProxyConfiguration') continue;
        seen++;
        assert.doesNotThrow(() => parseConfig(doc), `${overlay} ${d.metadata.name} ${k}`);
      }
    }
  }
  assert.equal(seen, OVERLAYS.length);
});

test("every container's arguments are accepted by the CLI", { skip }, async () => {
  for (const overlay of OVERLAYS) {
    for (const w of workloads(resources(overlay))) {
      const c = podSpec(w).containers[0];
      assert.ok(Array.isArray(c.args) && c.args.length > 0, `${overlay} ${w.metadata.name}: args`);
      assert.equal(await accepted(c.args), undefined, `${overlay} ${w.metadata.name}: kpng ${c.args.join(' ')}`);
    }
  }
  // and the check does refuse what the CLI refuses
  assert.notEqual(await accepted(['kube', 'to-local', 'to-nft', '--no-such-flag']), undefined);
  assert.notEqual(await accepted(['kube', 'to-local', 'to-bogus']), undefined);
});

test('the image: kpng on PATH, with the tools every backend and init container runs', () => {
  const text = readFileSync(join(ROOT, 'deploy/Dockerfile'), 'utf8');
  const final = text.slice(text.lastIndexOf('\nFROM '));
  assert.match(final, /^ENTRYPOINT \["kpng"\]$/m);
  assert.match(final, /ln -s \/kpng\/bin\/kpng\.js \/usr\/local\/bin\/kpng/);
  const packages = new Set(/apt-get install -y --no-install-recommends ([^\n&]+)/.exec(final)![1]!.trim().split(/\s+/));
  // nft (to-nft, to-ipvs), iptables-restore and ipset (to-iptables), conntrack (cleanup), modprobe, ip and sysctl (to-ipvs), libbpf (to-ebpf)
  for (const p of ['nftables', 'iptables', 'ipset', 'conntrack', 'kmod', 'iproute2', 'procps', 'libbpf1']) assert.ok(packages.has(p), p);
  for (const overlay of OVERLAYS) {
    if (skip) break;
    for (const w of workloads(resources(overlay))) for (const c of podSpec(w).initContainers ?? []) assert.ok(['modprobe', 'sh'].includes(c.command[0]), `${overlay} ${c.name}: ${c.command[0]} is in the image`);
  }
});

test('the way back: cleanup runs `kpng cleanup` once on every node, then idles', { skip }, async () => {
  const docs = renderOverlay('cleanup', 'cleanup');
  const ds = docs.find((d) => d.kind === 'DaemonSet')!;
  const { doc: top } = topKustomization();
  const spec = podSpec(ds);
  assert.equal(spec.hostNetwork, true);
  assert.ok(spec.tolerations.some((t: Obj) => t.operator === 'Exists' && !t.key), 'on every node');
  const [init] = spec.initContainers;
  assert.deepEqual(init.args, ['cleanup']);
  assert.equal(await accepted(init.args), undefined, 'kpng cleanup');
  assert.equal(init.image, `${top.images[0].newName}:${top.images[0].newTag}`);
  assert.equal(init.securityContext.privileged, true);
  // to-ebpf's pins are on the host's bpffs
  const bpffs = init.volumeMounts.find((m: Obj) => DEFAULT_BPFFS.startsWith(`${m.mountPath}/`));
  assert.equal(spec.volumes.find((v: Obj) => v.name === bpffs.name).hostPath.path, '/sys/fs/bpf');
  const [c] = spec.containers;
  assert.deepEqual(c.command, ['sleep', 'infinity']);
  for (const f of ['args', 'ports', 'startupProbe', 'readinessProbe', 'livenessProbe']) assert.equal(c[f], undefined, `no ${f}: kpng does not run`);
});
