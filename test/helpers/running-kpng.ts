// Running kpng processes as a cluster runs them, for the operations tests
// (kpng status, the metrics monitoring reads): a node agent programming a
// test network namespace with to-nft, a brain, a split-mode agent (kpng
// local). The cluster is files (the file source); every process is the
// real CLI. Stop each (stop()) in an after hook: the namespaces are the
// caller's to remove.
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { kpngSpawn } from './cli.js';
import { freePort } from './port.js';
import type { TestNetns } from './netns.js';
import { node, service, slice } from './k8s.js';

export type Kpng = ReturnType<typeof kpngSpawn>;

/** One node (n1) and Services web (two endpoints) and dns (UDP), written to dir/cluster.json. */
export function writeCluster(dir: string, webEndpoints = ['10.1.0.1', '10.1.0.2']): void {
  writeFileSync(
    join(dir, 'cluster.json'),
    JSON.stringify({
      kind: 'List',
      items: [
        node('n1', undefined, ['192.168.0.2']),
        service('ns', 'web', { clusterIP: '172.30.0.10' }),
        slice('ns', 'web-1', 'web', webEndpoints.map((ip) => ({ ip, pod: `p-${ip}` }))),
        service('ns', 'dns', { clusterIP: '172.30.0.53', ports: [{ name: 'dns', port: 53, protocol: 'UDP' }] }),
        slice('ns', 'dns-1', 'dns', [{ ip: '10.1.0.3', pod: 'p-dns' }], [{ name: 'dns', port: 5353, protocol: 'UDP' }]),
      ],
    }),
  );
}

export interface Served {
  readonly kpng: Kpng;
  /** the state socket (unix://...) */
  readonly socket: string;
  /** where /metrics is served, from the network namespace the process runs in */
  readonly metricsPort: number;
  /** a node agent's namespace (its servers are on its loopback); none: the test's own */
  readonly netns?: TestNetns;
}

/** GET http://127.0.0.1:port/path from inside ns (the test's own namespace without one) */
export async function httpGet(ns: TestNetns | undefined, port: number, path: string): Promise<{ code: number; body: string }> {
  const url = `http://127.0.0.1:${port}${path}`;
  if (!ns) {
    const r = await fetch(url);
    return { code: r.status, body: await r.text() };
  }
  const script = `fetch(${JSON.stringify(url)}).then(async (r) => console.log(JSON.stringify({ code: r.status, body: await r.text() })), () => console.log('{"code":0,"body":""}'))`;
  return JSON.parse(ns.exec(process.execPath, ['-e', script])) as { code: number; body: string };
}

/** kube-proxy's servers (10256, 10249) in the node's namespace, fast syncs and drift checks */
const NODE_FLAGS = ['to-nft', '--node-name', 'n1', '--no-health-checks', '--sync-period', '1s', '--min-sync-period', '0s'];
const HEALTHZ_PORT = 10256;
const METRICS_PORT = 10249;

/** a node agent in ns (as a pod on the host network: its loopback up); resolves once the node is programmed */
async function startInNode(ns: TestNetns, args: string[], socket: string, started: Kpng[]): Promise<Served> {
  ns.exec('ip', ['link', 'set', 'lo', 'up']);
  const kpng = kpngSpawn([...args, ...NODE_FLAGS], { netns: ns.name });
  started.push(kpng);
  const synced = async () => {
    const r = await httpGet(ns, HEALTHZ_PORT, '/healthz');
    return r.code === 200 && !!(JSON.parse(r.body) as { lastUpdated?: string }).lastUpdated;
  };
  await kpng.until(`the first sync of kpng ${args.join(' ')}`, synced, { timeoutMs: 30_000, everyMs: 100 });
  return { kpng, socket, metricsPort: METRICS_PORT, netns: ns };
}

/** `kpng file --input DIR to-local to-nft` on node n1, in ns */
export function nodeAgent(ns: TestNetns, dir: string, started: Kpng[]): Promise<Served> {
  const socket = `unix://${join(dir, 'node.sock')}`;
  return startInNode(ns, ['file', '--input', dir, '--debounce', '20', 'to-local', '--state-socket', socket], socket, started);
}

/** `kpng local --api BRAIN to-nft` on node n1, in ns */
export function splitAgent(ns: TestNetns, dir: string, api: string, started: Kpng[]): Promise<Served> {
  // its own directory: the node lock beside the state socket is not the node agent's of nodeAgent()
  const socket = `unix://${join(dir, 'split', 'node.sock')}`;
  return startInNode(ns, ['local', '--api', api, '--state-socket', socket], socket, started);
}

/** `kpng file --input DIR to-api` on a unix socket; resolves once it serves */
export async function brain(dir: string, started: Kpng[]): Promise<Served & { api: string }> {
  const api = `unix://${join(dir, 'api.sock')}`;
  const socket = `unix://${join(dir, 'brain.sock')}`;
  const metricsPort = await freePort();
  const kpng = kpngSpawn(['file', '--input', dir, '--debounce', '20', 'to-api', '--listen', api, '--state-socket', socket, '--metrics-bind-address', `127.0.0.1:${metricsPort}`]);
  started.push(kpng);
  await kpng.until('the brain', () => kpng.stderr.includes('state socket: serving'));
  return { kpng, socket, metricsPort, api };
}
