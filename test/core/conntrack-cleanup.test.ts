// Conntrack cleanup in the background (issue 40, defect 1), against a table
// in memory: no sync waits for it; a round starts only after the sync that
// stopped using the flows committed; the flows of the syncs during a round
// wait for the next one, together; an endpoint that came back keeps its
// entries; a dump gives way to a sync; which entries a flow means (service
// IP, NodePort, never DNATed, IPv6); a failing round is one log line and one
// count per family, and the next round runs.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { driveProxier } from '../helpers/proxier-harness.js';
import { recordingLogger } from '../helpers/logs.js';
import { syncedStore, load, service, slice, node, serviceCIDR } from '../helpers/k8s.js';
import { NftProxier } from '../../src/backends/nft/proxier.js';
import { FakeNft } from '../../src/backends/shared/nftables/fake.js';
import { defaultConfig } from '../../src/backends/shared/config.js';
import { ConntrackCleaner, type StaleFlow } from '../../src/backends/shared/conntrack.js';
import { IPPROTO_UDP, type ConntrackBatchResult, type ConntrackEntry, type ConntrackFamily, type ConntrackTable } from '../../src/kernel/conntrack.js';
import { registry } from '../../src/runtime/metrics.js';
import { writeIPv6 } from '../../src/api/ip.js';

function hex(ip: string): string {
  if (!ip.includes(':')) return Buffer.from(ip.split('.').map(Number)).toString('hex');
  const b = Buffer.alloc(16);
  writeIPv6(b, 0, ip);
  return b.toString('hex');
}

/** what a client's datagrams to vip:port leave once answered by replyFrom */
function entry(vip: string, port: number, replyFrom: string, client = vip.includes(':') ? 'fd00:9::1' : '10.9.0.1', sport = 40000): ConntrackEntry {
  const family = vip.includes(':') ? 6 : 4;
  return { family, proto: IPPROTO_UDP, orig: { src: hex(client), dst: hex(vip), sport, dport: port }, reply: { src: hex(replyFrom), dst: hex(client), sport: 5353, dport: sport }, zone: 0 };
}

/** a table in memory; while `held`, a dump waits until release() */
class MemoryTable implements ConntrackTable {
  entries: ConntrackEntry[] = [];
  dumps: ConntrackFamily[] = [];
  failWith?: string;
  onDump?: () => void;
  /** what happened, in order: the dump's reads, and what the test notes */
  events: string[] = [];
  private gate?: { promise: Promise<void>; open: () => void };

  hold(): void {
    let open!: () => void;
    this.gate = { promise: new Promise((r) => (open = r)), open };
  }
  release(): void {
    this.gate?.open();
    this.gate = undefined;
  }
  async list(family: ConntrackFamily, proto: number, select: (e: ConntrackEntry) => boolean, between?: () => Promise<void>): Promise<ConntrackEntry[]> {
    this.dumps.push(family);
    this.onDump?.();
    await this.gate?.promise;
    if (this.failWith) throw new Error(this.failWith);
    // a dump of two reads: the first half, then the rest
    const half = Math.ceil(this.entries.length / 2);
    const first = this.entries.slice(0, half).filter((e) => e.family === family && e.proto === proto && select(e));
    this.events.push('read');
    await between?.();
    this.events.push('read');
    return [...first, ...this.entries.slice(half).filter((e) => e.family === family && e.proto === proto && select(e))];
  }
  async delete(entries: readonly ConntrackEntry[]): Promise<ConntrackBatchResult> {
    const before = this.entries.length;
    this.entries = this.entries.filter((e) => !entries.includes(e));
    const done = before - this.entries.length;
    return { done, gone: entries.length - done, failed: 0 };
  }
  close(): void {}
}

/** a series of a metric for an IP family (series: e.g. a histogram's NAME_count) */
async function metric(name: string, family: string, series = name): Promise<number> {
  const values: { value: number; labels: Record<string, unknown>; metricName?: string }[] = (await registry.getSingleMetric(name)!.get()).values;
  return values.find((v) => v.labels.ip_family === family && (v.metricName ?? name) === series)?.value ?? 0;
}

const cluster = (dnsEndpoints: string[]) => [
  node('n1', 'z1', ['192.168.0.2']),
  serviceCIDR('kubernetes', ['172.30.0.0/16']),
  service('ns', 'dns', { clusterIP: '172.30.0.53', ports: [{ name: 'dns', port: 53, protocol: 'UDP', targetPort: 5353 }] }),
  slice('ns', 'dns-1', 'dns', dnsEndpoints.map((ip) => ({ ip, node: 'n2' })), [{ name: 'dns', port: 5353, protocol: 'UDP' }]),
];
const dnsSlice = (ips: string[]) => cluster(ips)[3];

function harness(table: MemoryTable, nft = new FakeNft()) {
  const config = defaultConfig();
  config.clusterCIDRs = ['10.0.0.0/8'];
  config.nftables.minSyncPeriodMs = 0;
  const { log, lines } = recordingLogger('info');
  const store = syncedStore(cluster(['10.2.0.1', '10.2.0.2']));
  const proxier = new NftProxier({ nodeName: 'n1', config, log, nft, once: true, healthChecks: false, conntrack: table });
  return { store, nft, lines, ...driveProxier(store, proxier) };
}

test('no sync waits for the cleanup, which starts once the rules are committed; syncs meanwhile wait for the next round, together', { timeout: 20_000 }, async () => {
  const table = new MemoryTable();
  const h = harness(table);
  await h.sync();
  table.entries = [entry('172.30.0.53', 53, '10.2.0.1'), entry('172.30.0.53', 53, '10.2.0.2', '10.9.0.2'), entry('172.30.0.53', 53, '10.2.0.3', '10.9.0.3')];
  let committedAtDump = '';
  table.onDump = () => (committedAtDump = h.nft.dump());
  table.hold();
  // 10.2.0.1 goes: the sync ends while its cleanup's dump is held
  load(h.store, [dnsSlice(['10.2.0.2'])]);
  await h.sync();
  assert.deepEqual(table.dumps, [4]);
  assert.doesNotMatch(committedAtDump, /10\.2\.0\.1 \. 5353/, 'the dump began before the rules without the endpoint were committed');
  // two more syncs during the round: 10.2.0.3 comes and goes, 10.2.0.2 goes
  load(h.store, [dnsSlice(['10.2.0.2', '10.2.0.3'])]);
  await h.sync();
  load(h.store, [dnsSlice(['10.2.0.4'])]);
  await h.sync();
  assert.deepEqual(table.dumps, [4], 'a second round began while the first ran');
  table.release();
  await (h.proxier as unknown as { conntrack: ConntrackCleaner }).conntrack.idle();
  // the first round, then one for both syncs
  assert.deepEqual(table.dumps, [4, 4]);
  assert.deepEqual(table.entries, []);
  assert.equal(h.proxier.conntrackDeleted, 3);
  await h.close();
});

test('an endpoint that comes back before its round keeps its entries', { timeout: 20_000 }, async () => {
  const table = new MemoryTable();
  const h = harness(table);
  await h.sync();
  const kept = entry('172.30.0.53', 53, '10.2.0.1');
  table.entries = [kept];
  table.hold();
  // a round is busy (10.2.0.2 went) when 10.2.0.1 goes, and comes back before the next round
  load(h.store, [dnsSlice(['10.2.0.1'])]);
  await h.sync();
  load(h.store, [dnsSlice(['10.2.0.2'])]);
  await h.sync();
  load(h.store, [dnsSlice(['10.2.0.1', '10.2.0.2'])]);
  await h.sync();
  table.release();
  const cleaner = (h.proxier as unknown as { conntrack: ConntrackCleaner }).conntrack;
  await cleaner.idle();
  assert.deepEqual(table.entries, [kept]);
  // during its own dump, likewise
  table.hold();
  load(h.store, [dnsSlice(['10.2.0.2'])]);
  await h.sync();
  assert.equal(table.dumps.length, 2);
  load(h.store, [dnsSlice(['10.2.0.1', '10.2.0.2'])]);
  await h.sync();
  table.release();
  await cleaner.idle();
  assert.deepEqual(table.entries, [kept]);
  await h.close();
});

test('a dump reads no further while a sync runs', async () => {
  const table = new MemoryTable();
  const { log } = recordingLogger();
  let syncing = true;
  const cleaner = new ConntrackCleaner(log, table, { stillStale: () => true, syncing: () => syncing });
  table.entries = [entry('172.30.0.53', 53, '10.2.0.1'), entry('172.30.0.53', 53, '10.2.0.1', '10.9.0.2')];
  let dumping!: () => void;
  const dumped = new Promise<void>((r) => (dumping = r));
  table.onDump = () => dumping();
  cleaner.schedule([{ family: 4, owner: 'ns/dns', vip: '172.30.0.53', port: 53, endpoint: '10.2.0.1' }]);
  await dumped;
  // time enough for the dump to read on, were it not waiting
  await new Promise((r) => setTimeout(r, 100));
  table.events.push('sync ended');
  syncing = false;
  await cleaner.idle();
  assert.deepEqual(table.events, ['read', 'sync ended', 'read']);
  assert.deepEqual(table.entries, []);
});

test('which entries a flow means: its service IP and port answered by the endpoint; a NodePort at any address; a service IP that answered itself; IPv6', async () => {
  const table = new MemoryTable();
  const { log } = recordingLogger();
  const cleaner = new ConntrackCleaner(log, table, { stillStale: () => true });
  const flow = (vip: string, port: number, endpoint: string, family: 4 | 6 = 4): StaleFlow => ({ family, owner: 'ns/x', vip, port, endpoint });
  const stale = [entry('172.30.0.53', 53, '10.2.0.1'), entry('192.168.0.2', 30053, '10.2.0.1', '203.0.113.9'), entry('10.0.0.7', 30053, '10.2.0.1'), entry('172.30.0.54', 53, '172.30.0.54'), entry('fd00::53', 53, 'fd00:1::1')];
  const other = [entry('172.30.0.53', 54, '10.2.0.1'), entry('172.30.0.53', 53, '10.2.0.9'), entry('172.30.0.55', 53, '10.2.0.1'), entry('192.168.0.2', 30054, '10.2.0.1'), entry('fd00::53', 53, 'fd00:1::2')];
  table.entries = [...stale, ...other];
  cleaner.schedule([flow('172.30.0.53', 53, '10.2.0.1'), flow('', 30053, '10.2.0.1'), flow('172.30.0.54', 53, ''), flow('fd00::53', 53, 'fd00:1::1', 6)]);
  await cleaner.idle();
  assert.deepEqual(table.entries, other);
  assert.equal(cleaner.deleted, stale.length);
  assert.deepEqual(table.dumps.sort(), [4, 6]);
});

test('a failing round: one log line and one count per family, the entries stay, and the next round runs', async () => {
  const table = new MemoryTable();
  const { log, lines } = recordingLogger();
  const cleaner = new ConntrackCleaner(log, table, { stillStale: () => true });
  const failures = { v4: await metric('kpng_conntrack_reconciler_failures_total', 'IPv4'), v6: await metric('kpng_conntrack_reconciler_failures_total', 'IPv6') };
  const duration = 'kubeproxy_conntrack_reconciler_sync_duration_seconds';
  const rounds = await metric(duration, 'IPv4', `${duration}_count`);
  const deleted = await metric('kubeproxy_conntrack_reconciler_deleted_entries_total', 'IPv4');
  table.entries = [entry('172.30.0.53', 53, '10.2.0.1'), entry('fd00::53', 53, 'fd00:1::1')];
  table.failWith = 'netlink recv: errno 105';
  const flows: StaleFlow[] = [];
  for (let i = 1; i <= 50; i++) flows.push({ family: 4, owner: `ns/s${i}`, vip: '172.30.0.53', port: 53, endpoint: `10.2.0.${i}` });
  flows.push({ family: 6, owner: 'ns/v6', vip: 'fd00::53', port: 53, endpoint: 'fd00:1::1' });
  cleaner.schedule(flows);
  await cleaner.idle();
  const warned = lines.filter((l) => /conntrack cleanup failed/.test(l));
  assert.equal(warned.length, 1, lines.join(''));
  assert.match(warned[0], /"level":40/);
  assert.match(warned[0], /IPv4: netlink recv: errno 105; IPv6: netlink recv: errno 105/);
  assert.equal(cleaner.failures, 1);
  assert.equal(await metric('kpng_conntrack_reconciler_failures_total', 'IPv4'), failures.v4 + 1);
  assert.equal(await metric('kpng_conntrack_reconciler_failures_total', 'IPv6'), failures.v6 + 1);
  assert.equal(table.entries.length, 2);
  // the next round runs, timed and counted
  table.failWith = undefined;
  cleaner.schedule(flows);
  await cleaner.idle();
  assert.equal(table.entries.length, 0);
  assert.equal(await metric(duration, 'IPv4', `${duration}_count`), rounds + 2);
  assert.equal(await metric('kubeproxy_conntrack_reconciler_deleted_entries_total', 'IPv4'), deleted + 1);
});
