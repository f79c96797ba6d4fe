// The IPVS proxier against an in-memory IPVS, node and nft (no root, no
// kernel; the kernel lab proves the packets, test/vm/ipvs.test.ts): what it
// sends IPVS for a change, adoption after a restart, draining, address
// refcounts, drift of flags, taking over a server left behind, schedulers.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { driveProxier, testConfig } from '../helpers/proxier-harness.js';
import { recordingLogger } from '../helpers/logs.js';
import { syncedStore, load, service, slice, node, serviceCIDR } from '../helpers/k8s.js';
import { IpvsProxier, type IpvsApi } from '../../src/backends/ipvs/proxier.js';
import { IpvsError, rsKey, vsKey, type IpvsOp, type RealServer, type VirtualServer } from '../../src/backends/ipvs/ipvs.js';
import type { IpvsNode } from '../../src/backends/ipvs/node.js';
import { FakeNft } from '../../src/backends/shared/nftables/fake.js';
import { defaultConfig } from '../../src/backends/shared/config.js';
import type { Store } from '../../src/store/store.js';

const EEXIST = 17;
const ENOENT = 2;

/** IPVS in memory, with the kernel's answers for what exists and what does not; connections per real server set by the test. */
class FakeIpvs implements IpvsApi {
  readonly servers = new Map<string, { vs: VirtualServer; real: Map<string, RealServer> }>();
  /** "vs|rs" -> active connections */
  readonly conns = new Map<string, number>();
  readonly log: string[] = [];
  timeouts?: [number, number, number];

  services(): VirtualServer[] {
    return [...this.servers.values()].map((s) => s.vs);
  }
  destinations(vs: VirtualServer): RealServer[] {
    const k = vsKey(vs);
    return [...(this.servers.get(k)?.real.values() ?? [])].map((r) => ({ ...r, activeConns: this.conns.get(`${k}|${rsKey(r)}`) ?? 0, inactiveConns: 0 }));
  }
  apply(ops: readonly IpvsOp[]): (IpvsError | undefined)[] {
    return ops.map((o) => {
      this.log.push(`${o.op} ${vsKey(o.vs)}${'rs' in o ? ` ${rsKey(o.rs)} w${o.rs.weight}` : ''}`);
      const k = vsKey(o.vs);
      const s = this.servers.get(k);
      const err = (errno: number) => new IpvsError(`${o.op} ${k}: ${errno === EEXIST ? 'File exists' : 'No such file or directory'}`, errno);
      switch (o.op) {
        case 'add-service':
          if (s) return err(EEXIST);
          this.servers.set(k, { vs: o.vs, real: new Map() });
          return undefined;
        case 'set-service':
          if (!s) return err(ENOENT);
          s.vs = o.vs;
          return undefined;
        case 'del-service':
          if (!s) return err(ENOENT);
          this.servers.delete(k);
          return undefined;
        case 'add-dest':
          if (!s) return err(ENOENT);
          if (s.real.has(rsKey(o.rs))) return err(EEXIST);
          s.real.set(rsKey(o.rs), { address: o.rs.address, port: o.rs.port, weight: o.rs.weight });
          return undefined;
        case 'set-dest':
          if (!s?.real.has(rsKey(o.rs))) return err(ENOENT);
          s.real.set(rsKey(o.rs), { address: o.rs.address, port: o.rs.port, weight: o.rs.weight });
          return undefined;
        case 'del-dest':
          if (!s?.real.delete(rsKey(o.rs))) return err(ENOENT);
          return undefined;
      }
    });
  }
  setTimeouts(tcp: number, tcpFin: number, udp: number): void {
    this.timeouts = [tcp, tcpFin, udp];
  }
  close(): void {}
  /** what is programmed, as sorted lines: "vs sched flags timeout -> rs:weight ..." */
  dump(): string[] {
    return [...this.servers.entries()]
      .map(([k, s]) => `${k} ${s.vs.scheduler} ${s.vs.flags} ${s.vs.timeout} -> ${[...s.real.values()].map((r) => `${rsKey(r)}:${r.weight}`).sort().join(' ')}`)
      .sort();
  }
}

/** kube-ipvs0 in memory */
class FakeNode implements IpvsNode {
  readonly bound = new Set<string>();
  changes = 0;
  async prepare(): Promise<void> {}
  async addresses(): Promise<Set<string>> {
    return new Set(this.bound);
  }
  /** addresses whose next add fails */
  readonly failOnce = new Set<string>();
  async change(add: readonly string[], del: readonly string[]): Promise<string[]> {
    const failed: string[] = [];
    for (const a of del) this.bound.delete(a), this.changes++;
    for (const a of add) {
      if (this.failOnce.delete(a)) failed.push(`address add ${a}/32 dev kube-ipvs0`);
      else this.bound.add(a), this.changes++;
    }
    return failed;
  }
  async remove(): Promise<boolean> {
    return true;
  }
}

function harness(store: Store, parts: { ipvs: FakeIpvs; node: FakeNode; nft: FakeNft }, o: { scheduler?: string; exclude?: string[] } = {}) {
  const config = testConfig((c) => {
    c.ipvs.minSyncPeriodMs = 0;
    if (o.scheduler) c.ipvs.scheduler = o.scheduler;
    if (o.exclude) c.ipvs.excludeCIDRs = o.exclude;
  });
  const { log, lines } = recordingLogger();
  const proxier = new IpvsProxier({
    nodeName: 'n1',
    config,
    log,
    nft: parts.nft,
    ipvs: parts.ipvs,
    node: parts.node,
    families: [4],
    once: true,
    healthChecks: false,
    conntrack: false,
    interfaceAddresses: () => ['192.168.0.2', '127.0.0.1'],
  });
  return Object.assign(driveProxier(store, proxier), { lines });
}

const parts = () => ({ ipvs: new FakeIpvs(), node: new FakeNode(), nft: new FakeNft() });
const ep = (ip: string, nodeName = 'n2') => ({ ip, node: nodeName, pod: `p-${ip}` });

const cluster = () => [
  node('n1', 'z1', ['192.168.0.2']),
  serviceCIDR('kubernetes', ['172.30.0.0/16']),
  // two ports on one cluster IP, a NodePort on one of them
  service('ns', 'web', { type: 'NodePort', clusterIP: '172.30.0.10', ports: [{ name: 'http', port: 80, nodePort: 30080 }, { name: 'alt', port: 81 }] }),
  slice('ns', 'web-1', 'web', [ep('10.1.0.1'), ep('10.1.0.2')], [{ name: 'http', port: 8080 }, { name: 'alt', port: 8081 }]),
  service('ns', 'dns', { clusterIP: '172.30.0.53', ports: [{ name: 'dns', port: 53, protocol: 'UDP' }], sessionAffinity: 'ClientIP', sessionAffinityConfig: { clientIP: { timeoutSeconds: 60 } } }),
  slice('ns', 'dns-1', 'dns', [ep('10.2.0.3'), ep('10.2.0.4')], [{ name: 'dns', port: 53, protocol: 'UDP' }]),
];

test('a cold sync programs one virtual server per address and port, persistence as ClientIP affinity, addresses bound once', async () => {
  const p = parts();
  const h = harness(syncedStore(cluster()), p);
  await h.sync();
  assert.deepEqual(p.ipvs.dump(), [
    'tcp 172.30.0.10:80 rr 0 0 -> 10.1.0.1:8080:1 10.1.0.2:8080:1',
    'tcp 172.30.0.10:81 rr 0 0 -> 10.1.0.1:8081:1 10.1.0.2:8081:1',
    'tcp 192.168.0.2:30080 rr 0 0 -> 10.1.0.1:8080:1 10.1.0.2:8080:1',
    'udp 172.30.0.53:53 rr 1 60 -> 10.2.0.3:53:1 10.2.0.4:53:1',
  ]);
  // the NodePort is a server on the node's address, not an address of kube-ipvs0
  assert.deepEqual([...p.node.bound].sort(), ['172.30.0.10', '172.30.0.53']);
  await h.close();
});

test('a restart adopts IPVS, kube-ipvs0 and the table: no operation, no address, no element', async () => {
  const store = syncedStore(cluster());
  const p = parts();
  const a = harness(store, p);
  await a.sync();
  await a.close();
  const before = p.ipvs.dump();
  const ops = p.ipvs.log.length;
  const changes = p.node.changes;
  const b = harness(store, p);
  await b.sync();
  assert.deepEqual(p.ipvs.log.slice(ops), [], 'IPVS operations after the restart');
  assert.equal(p.node.changes, changes, 'kube-ipvs0 changed');
  assert.deepEqual(p.ipvs.dump(), before);
  assert.match(b.lines.find((l) => l.includes('ipvs: synced')) ?? '', /"operations":0,"elementChanges":0,"addresses":0/);
  await b.close();
});

test('an endpoint change touches only its real servers; TCP drains at weight 0 until its connections end, UDP goes at once', async () => {
  const store = syncedStore(cluster());
  const p = parts();
  const h = harness(store, p);
  await h.sync();
  p.ipvs.conns.set('tcp 172.30.0.10:80|10.1.0.2:8080', 1);
  let seen = p.ipvs.log.length;
  load(store, [
    slice('ns', 'web-1', 'web', [ep('10.1.0.1')], [{ name: 'http', port: 8080 }, { name: 'alt', port: 8081 }]),
    slice('ns', 'dns-1', 'dns', [ep('10.2.0.3')], [{ name: 'dns', port: 53, protocol: 'UDP' }]),
  ]);
  await h.sync();
  // the change: weight 0 for the three TCP servers of 10.1.0.2, the UDP one deleted; then the drain deletes those without connections
  assert.deepEqual(p.ipvs.log.slice(seen).sort(), [
    'del-dest tcp 172.30.0.10:81 10.1.0.2:8081 w0',
    'del-dest tcp 192.168.0.2:30080 10.1.0.2:8080 w0',
    'del-dest udp 172.30.0.53:53 10.2.0.4:53 w1',
    'set-dest tcp 172.30.0.10:80 10.1.0.2:8080 w0',
    'set-dest tcp 172.30.0.10:81 10.1.0.2:8081 w0',
    'set-dest tcp 192.168.0.2:30080 10.1.0.2:8080 w0',
  ]);
  assert.equal(h.proxier.stats.draining, 1, 'the real server with a connection is still draining');
  assert.deepEqual(p.ipvs.dump().filter((l) => l.startsWith('tcp 172.30.0.10:80 ')), ['tcp 172.30.0.10:80 rr 0 0 -> 10.1.0.1:8080:1 10.1.0.2:8080:0']);
  // its connection ends: the next check deletes it, and nothing else
  p.ipvs.conns.delete('tcp 172.30.0.10:80|10.1.0.2:8080');
  seen = p.ipvs.log.length;
  await (h.proxier as unknown as { checkDrift(): Promise<string | undefined> }).checkDrift();
  assert.deepEqual(p.ipvs.log.slice(seen), ['del-dest tcp 172.30.0.10:80 10.1.0.2:8080 w0']);
  assert.equal(h.proxier.stats.draining, 0);
  await h.close();
});

test('an endpoint back before its drain ended gets its weight back, not a second server', async () => {
  const store = syncedStore(cluster());
  const p = parts();
  const h = harness(store, p);
  await h.sync();
  p.ipvs.conns.set('tcp 172.30.0.10:80|10.1.0.2:8080', 3);
  load(store, [slice('ns', 'web-1', 'web', [ep('10.1.0.1')], [{ name: 'http', port: 8080 }, { name: 'alt', port: 8081 }])]);
  await h.sync();
  const seen = p.ipvs.log.length;
  load(store, [slice('ns', 'web-1', 'web', [ep('10.1.0.1'), ep('10.1.0.2')], [{ name: 'http', port: 8080 }, { name: 'alt', port: 8081 }])]);
  await h.sync();
  assert.deepEqual(p.ipvs.log.slice(seen).sort(), ['add-dest tcp 172.30.0.10:81 10.1.0.2:8081 w1', 'add-dest tcp 192.168.0.2:30080 10.1.0.2:8080 w1', 'set-dest tcp 172.30.0.10:80 10.1.0.2:8080 w1']);
  assert.equal(h.proxier.stats.draining, 0);
  await h.close();
});

test('an address two ports share stays bound until the last goes; a deleted Service unbinds it', async () => {
  const store = syncedStore(cluster());
  const p = parts();
  const h = harness(store, p);
  await h.sync();
  // one port goes: the cluster IP stays on kube-ipvs0 for the other
  load(store, [service('ns', 'web', { type: 'NodePort', clusterIP: '172.30.0.10', ports: [{ name: 'http', port: 80, nodePort: 30080 }] })]);
  await h.sync();
  assert.ok(p.node.bound.has('172.30.0.10'));
  assert.ok(!p.ipvs.servers.has('tcp 172.30.0.10:81'));
  store.update((tx) => tx.deleteService('ns', 'web'));
  await h.sync();
  assert.deepEqual([...p.node.bound], ['172.30.0.53']);
  assert.deepEqual(p.ipvs.dump().map((l) => l.split(' ')[1]), ['172.30.0.53:53']);
  await h.close();
});

test('schedulers: the config default, a per-Service annotation with its flags, an unknown one named in one log line', async () => {
  const store = syncedStore([
    ...cluster(),
    service('ns', 'mh', { clusterIP: '172.30.0.20' }, { metadata: { annotations: { 'kpng.io/ipvs-scheduler': 'mh', 'kpng.io/ipvs-scheduler-flags': 'mh-port,sh-port' } } }),
    slice('ns', 'mh-1', 'mh', [ep('10.1.0.9')]),
    service('ns', 'odd', { clusterIP: '172.30.0.21' }, { metadata: { annotations: { 'kpng.io/ipvs-scheduler': 'fancy' } } }),
    slice('ns', 'odd-1', 'odd', [ep('10.1.0.9')]),
  ]);
  const p = parts();
  const h = harness(store, p, { scheduler: 'wlc' });
  await h.sync();
  const line = (a: string) => p.ipvs.dump().find((l) => l.startsWith(`tcp ${a}:80 `));
  assert.match(line('172.30.0.10') ?? '', / wlc 0 0 /);
  assert.match(line('172.30.0.20') ?? '', / mh 16 0 /, 'mh with mh-port (IP_VS_SVC_F_SCHED2)');
  assert.match(line('172.30.0.21') ?? '', / wlc 0 0 /);
  assert.equal(h.lines.filter((l) => /ns\/odd.*fancy.* is not an IPVS scheduler/.test(l)).length, 1);
  assert.equal(h.lines.filter((l) => /ns\/mh.*sh-port.* does not apply to mh/.test(l)).length, 1);
  await h.close();
});

test('drift: a virtual server changed (scheduler) or deleted by someone else, or an address removed from kube-ipvs0, is seen', async () => {
  const store = syncedStore(cluster());
  const p = parts();
  const h = harness(store, p);
  await h.sync();
  const check = () => (h.proxier as unknown as { checkDrift(): Promise<string | undefined> }).checkDrift();
  assert.equal(await check(), undefined);
  const s = p.ipvs.servers.get('tcp 172.30.0.10:80')!;
  s.vs = { ...s.vs, scheduler: 'lc' };
  assert.match((await check()) ?? '', /tcp 172.30.0.10:80 was changed/);
  p.ipvs.servers.delete('udp 172.30.0.53:53');
  s.vs = { ...s.vs, scheduler: 'rr' };
  assert.match((await check()) ?? '', /udp 172.30.0.53:53 is gone/);
  p.node.bound.delete('172.30.0.10');
  p.ipvs.servers.set('udp 172.30.0.53:53', { vs: { address: '172.30.0.53', protocol: 'udp', port: 53, scheduler: 'rr', flags: 1, timeout: 60 }, real: new Map() });
  assert.match((await check()) ?? '', /172.30.0.10 is no longer on kube-ipvs0/);
  await h.close();
});

test('a virtual server a Service wants, left behind without its address, is taken over at start (not refused as existing)', async () => {
  const store = syncedStore(cluster());
  const p = parts();
  // what a kpng that lost kube-ipvs0 leaves: the server, another scheduler, a stale real server
  p.ipvs.servers.set('tcp 172.30.0.10:80', { vs: { address: '172.30.0.10', protocol: 'tcp', port: 80, scheduler: 'lc', flags: 0, timeout: 0 }, real: new Map([['10.9.9.9:8080', { address: '10.9.9.9', port: 8080, weight: 1 }]]) });
  // and one that is not kpng's
  p.ipvs.servers.set('tcp 192.168.0.2:9999', { vs: { address: '192.168.0.2', protocol: 'tcp', port: 9999, scheduler: 'wlc', flags: 0, timeout: 0 }, real: new Map() });
  const h = harness(store, p);
  await h.sync();
  assert.ok(!p.ipvs.log.some((l) => l.startsWith('add-service tcp 172.30.0.10:80')), 'added again');
  assert.ok(!p.ipvs.log.some((l) => l.includes('9999')), 'a virtual server not kpng’s was touched');
  assert.equal(p.ipvs.dump().find((l) => l.startsWith('tcp 172.30.0.10:80 ')), 'tcp 172.30.0.10:80 rr 0 0 -> 10.1.0.1:8080:1 10.1.0.2:8080:1');
  assert.ok(p.ipvs.servers.has('tcp 192.168.0.2:9999'));
  await h.close();
});

test('ipvs.excludeCIDRs: a virtual server and an address of kube-ipvs0 there are left alone; elsewhere they are kpng’s', async () => {
  const store = syncedStore(cluster());
  const p = parts();
  // someone else's (e.g. a load-balancer daemon's) address on kube-ipvs0 and its server, and a stale one of kpng's
  for (const [a, port] of [['10.200.0.1', 443], ['172.30.9.9', 80]] as const) {
    p.node.bound.add(a);
    p.ipvs.servers.set(`tcp ${a}:${port}`, { vs: { address: a, protocol: 'tcp', port, scheduler: 'rr', flags: 0, timeout: 0 }, real: new Map() });
  }
  const h = harness(store, p, { exclude: ['10.200.0.0/16'] });
  await h.sync();
  assert.ok(p.ipvs.servers.has('tcp 10.200.0.1:443'), 'the excluded virtual server was deleted');
  assert.ok(p.node.bound.has('10.200.0.1'), 'the excluded address was unbound');
  assert.ok(!p.ipvs.servers.has('tcp 172.30.9.9:80'), 'kpng’s stale virtual server is still there');
  assert.ok(!p.node.bound.has('172.30.9.9'), 'kpng’s stale address is still bound');
  await h.close();
});

test('two Services wanting one virtual server: the first by name has it, named once; when it goes the other takes it over', async () => {
  const store = syncedStore([
    ...cluster(),
    service('ns', 'b-dup', { clusterIP: '172.30.0.30', externalIPs: ['203.0.113.7'] }),
    slice('ns', 'b-dup-1', 'b-dup', [ep('10.3.0.2')]),
    service('ns', 'a-dup', { clusterIP: '172.30.0.31', externalIPs: ['203.0.113.7'] }),
    slice('ns', 'a-dup-1', 'a-dup', [ep('10.3.0.1')]),
  ]);
  const p = parts();
  const h = harness(store, p);
  await h.sync();
  const shared = () => p.ipvs.dump().find((l) => l.startsWith('tcp 203.0.113.7:80 '));
  assert.equal(shared(), 'tcp 203.0.113.7:80 rr 0 0 -> 10.3.0.1:8080:1');
  assert.equal(h.lines.filter((l) => /ns\/a-dup and ns\/b-dup want the virtual server tcp 203.0.113.7:80/.test(l)).length, 1);
  store.update((tx) => tx.deleteService('ns', 'a-dup'));
  await h.sync();
  assert.equal(shared(), 'tcp 203.0.113.7:80 rr 0 0 -> 10.3.0.2:8080:1', 'b-dup has it (a-dup’s endpoint, without connections, is gone)');
  assert.ok(p.node.bound.has('203.0.113.7'), 'the shared address stays bound');
  assert.ok(!p.node.bound.has('172.30.0.31'));
  await h.close();
});

test('an address kube-ipvs0 refused is named, reported by the periodic check and bound by the repair', async () => {
  const store = syncedStore(cluster());
  const p = parts();
  p.node.failOnce.add('172.30.0.53');
  const h = harness(store, p);
  await h.sync();
  assert.ok(!p.node.bound.has('172.30.0.53'));
  assert.equal(h.lines.filter((l) => l.includes('could not be bound') && l.includes('172.30.0.53')).length, 1);
  const check = () => (h.proxier as unknown as { checkDrift(): Promise<string | undefined> }).checkDrift();
  assert.match((await check()) ?? '', /1 service address\(es\) to bind or unbind again/);
  // an unrelated change binds it too (it is still to do)
  load(store, [slice('ns', 'web-1', 'web', [ep('10.1.0.1')], [{ name: 'http', port: 8080 }, { name: 'alt', port: 8081 }])]);
  await h.sync();
  assert.ok(p.node.bound.has('172.30.0.53'));
  assert.equal(await check(), undefined);
  await h.close();
});

test('IPVS timeouts from the config are set once at start', async () => {
  const store = syncedStore(cluster());
  const p = parts();
  const config = defaultConfig();
  assert.equal(config.ipvs.tcpTimeoutMs, 0, 'the default leaves the kernel’s timeouts');
  const h = harness(store, p);
  (h.proxier as unknown as { o: { config: typeof config } }).o.config.ipvs.tcpTimeoutMs = 900_000;
  await h.sync();
  assert.deepEqual(p.ipvs.timeouts, [900, 0, 0]);
  await h.close();
});
