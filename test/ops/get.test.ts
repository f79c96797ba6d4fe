// kpng get against running processes, as an operator runs it: a node agent
// (kpng file ... to-local to-log, its state socket) and a brain (kpng file
// ... to-api, its state socket and its API), on the example cluster: the
// tables and JSON, with the reasons for the Service with
// externalTrafficPolicy Local (shop), the one whose pods all terminate
// (jobs) and the one with topology hints (api). State sockets are mode 0600
// and go away with their process. Every process is stopped, also on failure.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ROOT, kpngSpawn, kpngSync } from '../helpers/cli.js';

const EXAMPLE = join(ROOT, 'examples/cluster.yaml');
const dir = mkdtempSync(join(tmpdir(), 'kpng-get-'));
const running: ReturnType<typeof kpngSpawn>[] = [];
after(async () => {
  await Promise.all(running.map((p) => p.stop()));
  rmSync(dir, { recursive: true, force: true });
});

function start(args: string[]) {
  const p = kpngSpawn(args);
  running.push(p);
  return p;
}

type Obj = Record<string, any>;

function getJSON(args: string[]): Obj {
  const r = kpngSync(['get', ...args, '-o', 'json']);
  assert.equal(r.status, 0, r.stderr);
  return JSON.parse(r.stdout);
}

const byAddr = (svc: Obj, ip: string) => svc.endpoints.find((e: Obj) => e.endpoint.startsWith(`${ip}:`));

/** what node-a must see: the reasons each kind of Service gets */
function checkNodeA(list: Obj) {
  assert.equal(list.kind, 'ServiceList');
  assert.deepEqual(list.node, { name: 'node-a', zone: 'zone-1' });
  const svc = (name: string) => list.items.find((s: Obj) => s.name === name);
  assert.deepEqual(
    list.items.map((s: Obj) => s.name),
    ['api', 'echo', 'jobs', 'shop', 'web'],
  );
  // externalTrafficPolicy: Local: external traffic only to node-a's endpoint, internal to both
  const shop = svc('shop');
  assert.equal(shop.type, 'LoadBalancer');
  assert.equal(shop.externalTrafficPolicy, 'Local');
  assert.deepEqual(shop.loadBalancerIPs, ['203.0.113.10']);
  assert.deepEqual(byAddr(shop, '10.244.1.30').external, { used: true, why: 'ready, on this node (Local policy)' });
  assert.deepEqual(byAddr(shop, '10.244.2.30').external, { used: false, why: 'not on this node (Local policy; on node-b)' });
  assert.deepEqual(byAddr(shop, '10.244.2.30').internal, { used: true, why: 'ready' });
  // every pod terminating: the serving one is the fallback, the other is not serving
  const jobs = svc('jobs');
  assert.deepEqual(byAddr(jobs, '10.244.1.50').internal, { used: true, why: 'serving and terminating: the fallback (no ready endpoint)' });
  assert.deepEqual(byAddr(jobs, '10.244.2.50').internal, { used: false, why: 'not serving' });
  assert.equal(jobs.externalTrafficPolicy, undefined);
  // topology hints: zone-1's endpoint only
  const api = svc('api');
  assert.equal(api.trafficDistribution, 'PreferClose');
  assert.deepEqual(byAddr(api, '10.244.1.40').internal, { used: true, why: 'ready; topology hint for zone zone-1' });
  assert.deepEqual(byAddr(api, '10.244.2.40').internal, { used: false, why: 'topology: hinted for zone zone-2, not zone zone-1' });
  assert.deepEqual(byAddr(api, '10.244.2.40').hints, { zones: ['zone-2'], nodes: [] });
}

test('kpng get against a node agent: tables and JSON with the reasons', { timeout: 90_000 }, async () => {
  const sock = join(dir, 'node.sock');
  const agent = start(['file', '--input', EXAMPLE, '--node-name', 'node-a', 'to-local', '--state-socket', `unix://${sock}`, 'to-log']);
  await agent.until('the state socket', () => agent.stderr.includes('state socket: serving'));
  assert.equal(statSync(sock).mode & 0o777, 0o600, 'the state socket is for root only');

  checkNodeA(getJSON(['services', '--socket', sock]));

  const table = kpngSync(['get', 'services', '--socket', sock]);
  assert.equal(table.status, 0, table.stderr);
  const lines = table.stdout.trimEnd().split('\n');
  assert.match(lines[0]!, /^NAMESPACE\s+NAME\s+TYPE\s+CLUSTER-IP\s+EXTERNAL-IP\s+PORT\(S\)\s+TRAFFIC-POLICY\s+INTERNAL\s+EXTERNAL$/);
  assert.match(table.stdout, /^demo\s+shop\s+LoadBalancer\s+10\.96\.0\.30\s+203\.0\.113\.10\s+80:30080\/TCP\s+Cluster\/Local\s+2\/2\s+1\/2$/m);
  assert.match(table.stdout, /^demo\s+api\s+ClusterIP\s+10\.96\.0\.40\s+<none>\s+80\/TCP\s+Cluster\/-\s+1\/2\s+-$/m);
  assert.doesNotMatch(table.stdout, /\x1b\[/, 'plain when piped');

  const one = kpngSync(['get', 'services', 'jobs', '-n', 'demo', '--socket', sock]);
  assert.equal(one.status, 0, one.stderr);
  assert.match(one.stdout, /demo\/jobs on node-a \(zone zone-1\): internalTrafficPolicy: Cluster/);
  assert.match(one.stdout, /10\.244\.1\.50:8080\s+http\s+node-a\s+zone-1\s+not-ready,terminating\s+<none>\s+yes\s+-\s+serving and terminating: the fallback/);
  assert.match(one.stdout, /10\.244\.2\.50:8080\s+http\s+node-b\s+zone-2\s+not-ready,not-serving,terminating\s+<none>\s+no\s+-\s+not serving/);

  const eps = kpngSync(['get', 'endpoints', '--socket', sock]);
  assert.equal(eps.status, 0, eps.stderr);
  assert.match(eps.stdout, /^demo\s+shop\s+10\.244\.2\.30:8080\s+.*\byes\s+no\s+internal: ready; external: not on this node \(Local policy; on node-b\)$/m);
  const epsJSON = getJSON(['endpoints', '--socket', sock]);
  assert.equal(epsJSON.kind, 'EndpointList');
  assert.ok(epsJSON.items.some((e: Obj) => e.service === 'api' && e.endpoint === '10.244.1.40:8080' && e.internal.used));

  const nodes = kpngSync(['get', 'nodes', '--socket', sock]);
  assert.equal(nodes.status, 0, nodes.stderr);
  assert.match(nodes.stdout, /^node-a \(this node\)\s+zone-1\s+192\.168\.50\.2\s+10\.244\.1\.0\/24\s+Ready$/m);
  assert.match(nodes.stdout, /^node-b\s+zone-2\s+192\.168\.50\.3/m);

  const missing = kpngSync(['get', 'services', 'nope', '--socket', sock]);
  assert.equal(missing.status, 1);
  assert.match(missing.stderr, /service nope not found/);

  await agent.stop();
  assert.equal(existsSync(sock), false, 'the state socket goes away with its process');
});

test('kpng get against a brain: its state socket and its API, for any node', { timeout: 90_000 }, async () => {
  const state = join(dir, 'brain.sock');
  const api = join(dir, 'kpng.sock');
  const brain = start(['file', '--input', EXAMPLE, 'to-api', '--listen', `unix://${api}`, '--state-socket', `unix://${state}`, '--metrics-bind-address', '']);
  await brain.until('the state socket', () => brain.stderr.includes('state socket: serving'));
  assert.equal(statSync(state).mode & 0o777, 0o600);

  // node-a through the state socket, node-b through the API
  checkNodeA(getJSON(['services', '--socket', state, '--node', 'node-a']));
  const b = getJSON(['services', 'shop', '--api', `unix://${api}`, '--node', 'node-b']);
  assert.deepEqual(b.node, { name: 'node-b', zone: 'zone-2' });
  assert.deepEqual(byAddr(b.items[0], '10.244.2.30').external, { used: true, why: 'ready, on this node (Local policy)' });
  assert.deepEqual(byAddr(b.items[0], '10.244.1.30').external, { used: false, why: 'not on this node (Local policy; on node-a)' });

  // without a node: the global state, no reasons
  const global = getJSON(['services', '--socket', state]);
  assert.equal(global.node, undefined);
  assert.equal(global.items.length, 5);
  assert.ok(global.items.every((s: Obj) => s.endpoints.every((e: Obj) => e.internal === undefined)));
  const table = kpngSync(['get', 'services', '--socket', state]);
  assert.match(table.stdout, /^NAMESPACE\s+NAME\s+TYPE\s+CLUSTER-IP\s+EXTERNAL-IP\s+PORT\(S\)\s+TRAFFIC-POLICY\s+ENDPOINTS$/m);
  assert.match(table.stdout, /^demo\s+web\s+ClusterIP\s+10\.96\.0\.10\s+<none>\s+80\/TCP\s+Cluster\/-\s+3$/m);

  const yaml = kpngSync(['get', 'nodes', '--socket', state, '-o', 'yaml']);
  assert.equal(yaml.status, 0, yaml.stderr);
  assert.match(yaml.stdout, /^kind: NodeList$/m);
  assert.match(yaml.stdout, /name: node-b/);
});

test('kpng get against a split-mode node agent (kpng local): what its node was sent', { timeout: 90_000 }, async () => {
  const api = join(dir, 'split-kpng.sock');
  const sock = join(dir, 'split-node.sock');
  const brain = start(['file', '--input', EXAMPLE, 'to-api', '--listen', `unix://${api}`, '--state-socket', '', '--metrics-bind-address', '']);
  await brain.until('the brain', () => brain.stderr.includes('to-api: serving'));
  const agent = start(['local', '--api', `unix://${api}`, '--state-socket', `unix://${sock}`, 'to-log', '--node-name', 'node-a', '--metrics-bind-address', '', '--healthz-bind-address', '']);
  await agent.until('the state socket and a first sync', () => agent.stderr.includes('state socket: serving') && agent.stdout.includes('> sync'));
  assert.equal(statSync(sock).mode & 0o777, 0o600);

  const list = getJSON(['services', '--socket', sock]);
  assert.equal(list.node.name, 'node-a');
  const svc = (name: string) => list.items.find((s: Obj) => s.name === name);
  assert.deepEqual(byAddr(svc('shop'), '10.244.1.30').external, { used: true, why: 'ready, on this node (Local policy)' });
  assert.deepEqual(byAddr(svc('shop'), '10.244.2.30').external, { used: false, why: 'not on this node (Local policy)' });
  assert.deepEqual(byAddr(svc('jobs'), '10.244.1.50').internal, { used: true, why: 'serving and terminating: the fallback (no ready endpoint)' });
  // endpoints the brain left out are not sent to the node
  assert.equal(byAddr(svc('jobs'), '10.244.2.50'), undefined);
  assert.equal(byAddr(svc('api'), '10.244.2.40'), undefined);

  // another node's state is the brain's business
  const other = kpngSync(['get', 'services', '--socket', sock, '--node', 'node-b']);
  assert.equal(other.status, 1);
  assert.match(other.stderr, /serves node node-a only/);
  await agent.stop();
  assert.equal(existsSync(sock), false);
});
