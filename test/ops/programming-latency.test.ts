// kubeproxy_network_programming_duration_seconds (issue 12): observed for the
// Services a node's diff carried, once the sync that applied them succeeded;
// a change the node's view does not carry is not timed, nor the state at
// start (kube-proxy times no change from before it started). All-in-one
// (to-local) and split mode (kpng local behind a brain) alike.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { kpngSpawn } from '../helpers/cli.js';
import { freePort } from '../helpers/port.js';
import { sleep, until } from '../helpers/until.js';
import { fetchState } from '../../src/get/fetch.js';
import { node, service, slice } from '../helpers/k8s.js';

/** metrics are fetched: a look costs */
const SLOW = { timeoutMs: 15_000, everyMs: 100 };

const dir = mkdtempSync(join(tmpdir(), 'kpng-npl-'));
after(() => rmSync(dir, { recursive: true, force: true }));

/** "local" has internalTrafficPolicy Local and its endpoints on another node (but localIP, on node-a): node-a's view of it has none */
function write(input: string, remoteIP: string, webIP: string, localIP?: string) {
  const items = [
    node('node-a', undefined, ['192.168.0.2']),
    service('demo', 'local', { clusterIP: '10.96.0.11', internalTrafficPolicy: 'Local' }),
    slice('demo', 'local-1', 'local', [{ ip: remoteIP, node: 'node-b' }, ...(localIP ? [{ ip: localIP, node: 'node-a' }] : [])]),
    service('demo', 'web', { clusterIP: '10.96.0.10' }),
    slice('demo', 'web-1', 'web', [{ ip: webIP, node: 'node-a' }]),
  ];
  writeFileSync(join(dir, 'tmp.json'), JSON.stringify({ apiVersion: 'v1', kind: 'List', items }));
  renameSync(join(dir, 'tmp.json'), join(input, 'state.json'));
}

async function histogram(port: number): Promise<{ count: number; sum: number }> {
  const m = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
  // (the series is there from the start, at 0)
  const read = (what: string) => Number(new RegExp(`^kubeproxy_network_programming_duration_seconds_${what}\\{ip_family="IPv4"\\} ([0-9.e+-]+)`, 'm').exec(m)?.[1] ?? 'NaN');
  return { count: read('count'), sum: read('sum') };
}

const observations = async (port: number) => (await histogram(port)).count;

/** whether the kpng serving its state at address holds an endpoint with this IP */
async function holds(address: string, ip: string): Promise<boolean> {
  const state = await fetchState(address);
  return [...state.slices.values()].flat().some((s) => s.endpoints.some((e) => e.Endpoint?.IPs?.V4.includes(ip)));
}

/** the first sync succeeded: the last-sync timestamp is set */
async function synced(port: number): Promise<boolean> {
  const m = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
  return /^kubeproxy_sync_proxy_rules_last_timestamp_seconds\{[^}]*\} [1-9]/m.test(m);
}

for (const mode of ['to-local', 'kpng local'] as const) {
  test(`${mode}: only the changes the node's diff carried are timed`, { timeout: 60_000 }, async () => {
    const input = mkdtempSync(join(dir, 'in-'));
    write(input, '10.244.2.5', '10.244.1.10');
    const metricsPort = await freePort();
    const backend = ['to-nft', '--dry-run', '--node-name', 'node-a', '--metrics-bind-address', `127.0.0.1:${metricsPort}`, '--healthz-bind-address', '', '--min-sync-period', '0s'];
    const sock = `unix://${join(input, '..', `${Math.random().toString(36).slice(2)}.sock`)}`;
    const procs =
      mode === 'to-local'
        ? [kpngSpawn(['file', '--input', input, '--debounce', '20', 'to-local', '--state-socket', sock, ...backend])]
        : [kpngSpawn(['file', '--input', input, '--debounce', '20', 'to-api', '--listen', sock, '--metrics-bind-address', '']), kpngSpawn(['local', '--api', sock, ...backend])];
    // The store that computes node-a's view answers on sock (the to-local process's state
    // socket, the brain's API). Node-a's diff wakes within the store's update, before any
    // answer goes out: once the store is seen holding a change, node-a's diff has looked at it.
    const unseenChange = async (remoteIP: string, webIP: string, localIP?: string) => {
      write(input, remoteIP, webIP, localIP);
      await until(`the store to hold ${remoteIP}`, () => holds(sock, remoteIP).catch(() => false), SLOW);
    };
    try {
      // the first sync carries both Services: the state at start, not timed
      await until('the first sync', async () => await synced(metricsPort).catch(() => false), SLOW);
      assert.equal(await observations(metricsPort), 0);
      // the remote endpoint of the Local Service moves: node-a's view does not change
      const unseenAt = Date.now();
      await unseenChange('10.244.2.6', '10.244.1.10');
      const before = await histogram(metricsPort);
      assert.equal(before.count, 0);
      // an endpoint of it comes to node-a: timed from this change, not from the one node-a never saw
      // (which comes well before it, so that timing from it would show in the sum)
      await sleep(unseenAt + 2500 - Date.now());
      write(input, '10.244.2.6', '10.244.1.10', '10.244.1.20');
      await until('the change to be timed', async () => (await observations(metricsPort)) === 1, SLOW);
      const after = await histogram(metricsPort);
      assert.ok(after.sum - before.sum < 1.5, `timed ${after.sum - before.sum} s`);
      // web's endpoint changes: one more
      write(input, '10.244.2.6', '10.244.1.11', '10.244.1.20');
      await until('the change to be timed', async () => (await observations(metricsPort)) === 2, SLOW);
      // and only once: still two after a later change node-a does not see
      await unseenChange('10.244.2.7', '10.244.1.11', '10.244.1.20');
      assert.equal(await observations(metricsPort), 2);
    } finally {
      for (const p of procs.reverse()) await p.stop();
    }
  });
}
