// The aggregator on the real kernel, as a user runs it: kpng (file source,
// to-local to-nft) in a lab node's namespace with its tenant socket, and
// tenants connecting from this process with the TypeScript client. Real
// packets go from a client pod through a Service to its endpoints.
//
// - a tenant's rule that drops traffic to one endpoint blocks that flow
//   through the Service while the other endpoint still answers;
// - a change the kernel refuses goes back to its tenant with nft's message,
//   while another tenant's change and kpng's own, in the same sync, apply;
// - a tenant that reconnects and declares the same content changes nothing,
//   nor does a restarted kpng (no transaction touches a tenant table);
// - a tenant table flushed by someone else is written back within syncPeriod;
// - the allow-list and quotas refuse with errors that say why;
// - kpng get tenants, the metrics and kpng trace show the tenants.
import { it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describeOutcome, type Outcome } from '../../src/lab/index.js';
import { NftNetlink } from '../../src/kernel/nftables.js';
import { TenantClient, type DeclareInit } from '../../src/aggregator/client.js';
import { node, service, slice } from '../helpers/k8s.js';
import { KpngLab, answeredBy, backendConfig, describeBackends, pollUntil } from '../helpers/lab-kpng.js';
import { ROOT, kpngSync } from '../helpers/cli.js';

const VIP = '10.96.0.10';
const A = '10.244.1.10';
const B = '10.244.1.11';
const C = '10.244.1.12';
const CLIENT = '10.244.1.50';
const SYNC_PERIOD_MS = 4000;
const MIN_SYNC_PERIOD_MS = 1500;

const objects = (endpoints: string[]) => [
  node('node-a', undefined, ['192.168.0.2']),
  service('demo', 'web', { clusterIP: VIP, ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }] }),
  slice('demo', 'web-1', 'web', endpoints.map((ip) => ({ ip, node: 'node-a' }))),
];

/** kube-network-policies' shape: one inet table, postrouting at srcnat - 5 (after DNAT), a set of isolated pods */
const policy = (isolated: string[]): DeclareInit => ({
  nftables: {
    tables: [
      {
        family: 'inet',
        name: 'policy',
        sets: [{ name: 'isolated', type: 'ipv4_addr', elements: isolated.map((key) => ({ key })) }],
        chains: [
          { name: 'postrouting', hook: { hook: 'postrouting', priority: 95 }, rules: [{ rule: 'ct state new jump check' }] },
          { name: 'check', rules: [{ rule: 'ip daddr @isolated counter drop', comment: 'isolated pods' }] },
        ],
      },
    ],
  },
});

/** a tenant whose set holds marks (a type kpng leaves to nft to check) */
const marks: DeclareInit = {
  nftables: { tables: [{ family: 'inet', name: 'marks', sets: [{ name: 'seen', type: 'typeof meta mark', elements: [{ key: '0x00000001' }] }], chains: [{ name: 'c', rules: [{ rule: 'meta mark @seen accept' }] }] }] },
};

await describeBackends(
  'tenants through kpng',
  (b) => {
    let kl: KpngLab;
    const dir = mkdtempSync(join(tmpdir(), 'kpng-tenants-'));
    const socket = `unix://${join(dir, 'rules.sock')}`;
    const stateSocket = join(dir, 'node.sock');
    const clients: TenantClient[] = [];
    const connect = async (name: string) => {
      const c = await TenantClient.connect(socket, name);
      clients.push(c.client);
      return c;
    };
    const local = ['--rules-socket', socket, '--tenants-config', join(dir, 'tenants.yaml'), '--state-socket', `unix://${stateSocket}`];
    /** kpng started, its first (full) sync done and its tenant API serving */
    const start = async () => {
      const k = await kl.startAndWait(() => kl.lab.connect({ from: CLIENT, to: VIP, port: 80 }), { local, pre: ['--log-level', 'debug'] });
      await k.until('the first sync and the tenant API', () => /nft: synced .*full=true/.test(k.stderr) && k.stderr.includes('tenant API: serving'), { timeoutMs: 20_000 });
    };
    const nft = async (...args: string[]) => {
      const r = await kl.lab.exec('node-a', ['nft', ...args]);
      assert.equal(r.code, 0, `nft ${args.join(' ')}: ${r.stdout}`);
      return r.stdout;
    };
    const through = async (n: number): Promise<Outcome[]> => {
      const out: Outcome[] = [];
      for (let i = 0; i < n; i++) out.push(await kl.lab.connect({ from: CLIENT, to: VIP, port: 80, timeoutMs: 700 }));
      return out;
    };

    before(async () => {
      writeFileSync(
        join(dir, 'tenants.yaml'),
        ['graceSeconds: 120', 'minChangeIntervalMs: 0', 'allow:', '  - name: netpol', '    hooks: [postrouting, forward]', '  - name: marks', '  - name: small', '    quotas: { chains: 1, elements: 2 }', ''].join('\n'),
      );
      kl = await KpngLab.create(
        b,
        { tag: 'tenants', node: { name: 'node-a', interfaces: [{ name: 'eth0', addresses: ['192.168.0.2/24'] }] }, pods: [{ name: 'web-a', ips: [A] }, { name: 'web-b', ips: [B] }, { name: 'web-c', ips: [C] }, { name: 'client', ips: [CLIENT] }] },
        objects([A, B]),
        backendConfig(b, { clusterCIDR: '10.244.0.0/16', syncPeriod: `${SYNC_PERIOD_MS / 1000}s`, minSyncPeriod: `${MIN_SYNC_PERIOD_MS}ms` }),
      );
      await Promise.all(['web-a', 'web-b', 'web-c'].map((p) => kl.lab.serve(p, { tcp: [8080] })));
      await start();
    });
    after(async () => {
      for (const c of clients) c.close();
      await kl?.close();
      rmSync(dir, { recursive: true, force: true });
    });

    it("a tenant's drop of one endpoint blocks that flow through the Service; the other endpoint still answers", async () => {
      const both = await pollUntil(() => through(12), (o) => answeredBy(o).join() === `${A}:8080,${B}:8080`, 20_000, 0);
      assert.ok(both.ok, `both endpoints answer without tenants: ${both.value.map(describeOutcome).join('; ')}`);
      const { client, held } = await connect('netpol');
      assert.equal(held, false);
      const r = await client.declare(policy([A]));
      assert.ok(r.applied, r.error);
      assert.ok(r.changes > 0);
      // until both B answered and a connection sent to A was dropped (each endpoint is picked at random); A never answers
      const seen: Outcome[] = [];
      for (let round = 0; round < 6 && answeredBy(seen).join() !== `${B}:8080,TIMEOUT`; round++) seen.push(...(await through(8)));
      assert.deepEqual(answeredBy(seen), [`${B}:8080`, 'TIMEOUT'], `only B answers, connections sent to A are dropped: ${seen.map(describeOutcome).join('; ')}`);
      // element-level: A is no longer isolated
      const back = await client.changeElements({ changes: [{ family: 'inet', table: 'policy', set: 'isolated', delete: [A] }] });
      assert.ok(back.applied, back.error);
      assert.equal(back.changes, 1, 'one element deleted, nothing else written');
      const again = await pollUntil(() => through(12), (o) => answeredBy(o).join() === `${A}:8080,${B}:8080`, 10_000, 0);
      assert.ok(again.ok, again.value.map(describeOutcome).join('; '));
    });

    it("a change the kernel refuses goes back to its tenant with nft's message; the others in the same sync apply", async () => {
      const { client: m } = await connect('marks');
      assert.ok((await m.declare(marks)).applied);
      const netpol = clients[0]!;
      // a sync just ended: what follows within minSyncPeriod goes to the kernel in one transaction
      assert.ok((await netpol.changeElements({ changes: [{ family: 'inet', table: 'policy', set: 'isolated', add: [{ key: C }] }] })).applied);
      kl.setState(objects([A, B, C]));
      const [bad, good] = await Promise.all([
        m.changeElements({ changes: [{ family: 'inet', table: 'marks', set: 'seen', add: [{ key: 'not-a-mark' }] }] }),
        netpol.changeElements({ changes: [{ family: 'inet', table: 'policy', set: 'isolated', delete: [C] }] }),
      ]);
      assert.equal(bad.applied, false);
      assert.match(bad.error, /^the kernel refused it: .*not-a-mark/);
      assert.ok(good.applied, good.error);
      // kpng's own change (endpoint C) and netpol's (C no longer isolated) are in
      const c = await pollUntil(() => through(12), (o) => answeredBy(o).includes(`${C}:8080`), 15_000, 0);
      assert.ok(c.ok, c.value.map(describeOutcome).join('; '));
      // the refused tenant keeps its last good content
      assert.match(await nft('list', 'set', 'inet', 'kpng.marks.marks', 'seen'), /elements = \{ 0x00000001 \}/);
      assert.match(kl.kpng!.stderr, /tenant marks: the kernel refused its change; its last good content stays/);
      assert.doesNotMatch(kl.kpng!.stderr, /sync failed; the last good rules stay in place/);
    });

    it('the tenant socket is for root only; the allow-list and quotas refuse, saying why', async () => {
      assert.equal(statSync(join(dir, 'rules.sock')).mode & 0o777, 0o600);
      await assert.rejects(TenantClient.connect(socket, 'stranger'), /allow-list: tenant stranger is not allowed on this node/);
      const netpol = clients[0]!;
      const pre = await netpol.declare({ nftables: { tables: [{ family: 'inet', name: 'x', chains: [{ name: 'c', hook: { hook: 'prerouting', priority: 0 } }] }] } });
      assert.match(pre.error, /allow-list: tenant netpol may not hook prerouting \(it may hook postrouting, forward\)/);
      const { client: small } = await connect('small');
      const chains = await small.declare({ nftables: { tables: [{ family: 'inet', name: 't', chains: [{ name: 'a' }, { name: 'b' }] }] } });
      assert.match(chains.error, /quota: 2 chains, at most 1 for tenant small/);
      assert.ok((await small.declare({ nftables: { tables: [{ family: 'inet', name: 't', chains: [{ name: 'a' }], sets: [{ name: 's', type: 'ipv4_addr', elements: [{ key: '10.0.0.1' }] }] }] } })).applied);
      const more = await small.changeElements({ changes: [{ family: 'inet', table: 't', set: 's', add: [{ key: '10.0.0.2' }, { key: '10.0.0.3' }] }] });
      assert.match(more.error, /quota: 3 elements, at most 2 for tenant small/);
      // netpol's content is as it was
      assert.match(await nft('list', 'table', 'inet', 'kpng.netpol.policy'), /ip daddr @isolated counter packets \d+ bytes \d+ drop comment "kpng:[0-9a-f]+ isolated pods"/);
    });

    it('a tenant that reconnects and declares the same content changes nothing in the kernel', async () => {
      const nl = new NftNetlink(kl.lab.nodeNs);
      try {
        clients[0]!.close();
        const g0 = nl.generation();
        const { client, held } = await connect('netpol');
        assert.equal(held, true, 'kpng held its content meanwhile');
        const r = await client.declare(policy([]));
        assert.ok(r.applied, r.error);
        assert.equal(r.changes, 0);
        assert.equal(nl.generation(), g0, 'no transaction');
      } finally {
        nl.close();
      }
    });

    it('a tenant table flushed by someone else is written back within syncPeriod, and the tenant told', async () => {
      const netpol = clients[clients.length - 1]!;
      let told = 0;
      netpol.onRepaired = () => told++;
      await nft('flush', 'table', 'inet', 'kpng.netpol.policy');
      const t0 = Date.now();
      const back = await pollUntil(() => nft('list', 'chain', 'inet', 'kpng.netpol.policy', 'check'), (s) => /isolated pods/.test(s), SYNC_PERIOD_MS + 3000, 200);
      assert.ok(back.ok, `not written back ${Date.now() - t0} ms after the flush:\n${back.value}\n${kl.kpng!.stderr.slice(-2000)}`);
      assert.ok(Date.now() - t0 <= SYNC_PERIOD_MS + 1500, `written back after ${Date.now() - t0} ms`);
      const notice = await pollUntil(async () => told, (n) => n > 0, 2000, 50);
      assert.ok(notice.ok, 'the tenant got a REPAIRED notice');
    });

    it('kpng get tenants, the metrics and kpng trace show the tenants', async () => {
      const r = kpngSync(['get', 'tenants', '--socket', stateSocket, '-o', 'json']);
      assert.equal(r.status, 0, r.stderr);
      const list = JSON.parse(r.stdout);
      assert.equal(list.dataplane, 'nftables');
      const netpol = list.items.find((t: { name: string }) => t.name === 'netpol');
      assert.deepEqual({ connected: netpol.connected, tables: netpol.tables, chains: netpol.chains, rules: netpol.rules, sets: netpol.sets }, { connected: true, tables: ['inet kpng.netpol.policy'], chains: 2, rules: 2, sets: 1 });
      assert.deepEqual(netpol.hooks, ['postrouting 95 inet kpng.netpol.policy postrouting (filter)']);
      const marks = list.items.find((t: { name: string }) => t.name === 'marks');
      assert.match(marks.lastError, /not-a-mark/);
      const metrics = await kl.lab.exec('node-a', [process.execPath, '-e', "fetch('http://127.0.0.1:10249/metrics').then((r) => r.text()).then((t) => console.log(t.split('\\n').filter((l) => l.startsWith('kpng_tenant_')).join('\\n')))"]);
      assert.match(metrics.stdout, /^kpng_tenant_changes_total\{tenant="netpol"\} [1-9]/m);
      assert.match(metrics.stdout, /^kpng_tenant_refusals_total\{tenant="marks"\} 1$/m);
      assert.match(metrics.stdout, /^kpng_tenant_elements\{tenant="small"\} 1$/m);
      assert.match(metrics.stdout, /^kpng_tenant_change_duration_seconds_count\{tenant="netpol"\} [1-9]/m);
      const trace = await kl.lab.exec('node-a', [process.execPath, join(ROOT, 'bin/kpng.js'), 'trace', '--src', CLIENT, '--dst', VIP, '--dport', '80', '--iif', 'eth0']);
      assert.equal(trace.code, 0, trace.stdout);
      // at postrouting: the tenant's chain (srcnat - 5), then kpng's masquerading (srcnat)
      assert.match(trace.stdout, /postrouting:\n\s+95 {2}inet kpng\.netpol\.policy postrouting\s+filter\s+tenant netpol\n\s+100 {2}ip kpng nat-postrouting\s+nat\s+kpng/);
    });

    it('kpng restarted with tenants present changes nothing in their tables, and they find their content held', async () => {
      const touched: string[] = [];
      const nl = new NftNetlink(kl.lab.nodeNs, { event: (e) => void (e.table.startsWith('kpng.') && touched.push(e.table)), generation: () => {} });
      try {
        nl.subscribe(true);
        const drain = () => nl.read();
        await kl.kpng!.stop('SIGTERM', 5000);
        await start();
        drain();
        assert.deepEqual(touched, [], 'the restarted kpng wrote no tenant table');
        const g0 = nl.generation();
        const { client, held } = await connect('netpol');
        assert.equal(held, true);
        const r = await client.declare(policy([]));
        assert.ok(r.applied, r.error);
        assert.equal(r.changes, 0);
        drain();
        assert.deepEqual(touched, []);
        assert.equal(nl.generation(), g0, 'no transaction at all');
        // and the tenant it was not told about is still there, untouched
        assert.match(await nft('list', 'table', 'inet', 'kpng.small.t'), /elements = \{ 10\.0\.0\.1 \}/);
      } finally {
        nl.close();
      }
    });
  },
  [{ name: 'nft' }],
);
