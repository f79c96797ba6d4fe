// The lab itself, proven without kpng: hand-written nftables rules in the node
// namespace, and the outcomes the lab must tell apart (DNAT to an endpoint,
// masquerade, REJECT, DROP, "" = untouched), kept connections, cleanup.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { spawn, spawnSync } from 'node:child_process';
import { Lab, POD_GATEWAY, labUnsupported, listNamespaces, removeLeftovers, verdict, masqueraded, seenSource, spread, describeOutcome } from '../../src/lab/index.js';
import { checkFlow, labSpecFor, loadScenario, serveScenario } from '../helpers/lab-flows.js';
import { skipOrFailInCI } from '../helpers/ci.js';

const skip = skipOrFailInCI(labUnsupported());
const RULES = new URL('../data/lab/', import.meta.url);

const SYSCTLS = ['net/ipv4/ip_forward', 'net/ipv6/conf/all/forwarding', 'net/ipv4/conf/all/rp_filter', 'net/ipv4/conf/default/rp_filter', 'net/ipv4/conf/all/send_redirects', 'net/ipv6/conf/default/accept_dad', 'net/ipv6/ip_nonlocal_bind'];

/** The root namespace as far as the lab could touch it: links, addresses, routes, rules, sysctls, nftables. */
function rootSnapshot(): string {
  const sh = (cmd: string, args: string[]) => spawnSync(cmd, args, { encoding: 'utf8' }).stdout;
  return [
    sh('ip', ['-o', 'link']),
    sh('ip', ['-o', 'addr']),
    sh('ip', ['route', 'show', 'table', 'all']),
    sh('ip', ['-6', 'route', 'show', 'table', 'all']),
    sh('ip', ['rule']),
    sh('ip', ['-6', 'rule']),
    sh('nft', ['list', 'ruleset']),
    ...SYSCTLS.map((k) => `${k}=${readFileSync(`/proc/sys/${k}`, 'utf8').trim()}`),
  ]
    .join('\n')
    .replace(/^\d+: /gm, '');
}

async function nft(lab: Lab, rules: string) {
  const r = await lab.exec(lab.nodeName, ['nft', '-f', '-'], { input: rules });
  assert.equal(r.code, 0, r.stderr);
}

describe('lab: outcomes with hand-written rules', { skip }, () => {
  let lab: Lab;
  let root = '';
  let mine: string[] = [];

  before(async () => {
    root = rootSnapshot();
    lab = await Lab.create({
      tag: 'labtest',
      node: { name: 'node-a', interfaces: [{ name: 'lo', addresses: ['127.0.0.1/8', '::1/128'] }, { name: 'eth0', addresses: ['192.168.0.2/24', '192.168.1.2/24', '2001:db8::1/64'] }] },
      pods: [
        { name: 'web-1', ips: ['10.180.0.1', 'fd00:10::1'] },
        { name: 'web-2', ips: ['10.180.2.1'] },
        { name: 'client', ips: ['10.0.0.2', 'fd00:10::2'] },
        { name: 'far', ips: ['10.244.2.10'], node: 'node-b' },
      ],
      peers: [{ name: 'node-b', ips: ['192.168.50.3'] }],
    });
    mine = lab.namespaces;
    await Promise.all([
      lab.serve('web-1', { tcp: [80], udp: [53] }),
      lab.serve('web-2', { tcp: [80], udp: [53] }),
      lab.serve('far', { tcp: [80] }),
      lab.serve('node-a', { tcp: [80, 3001] }),
      lab.serve('world', { tcp: [80], udp: [53], udpHosts: ['172.30.0.50'] }),
    ]);
    await nft(
      lab,
      `table ip t {
  chain pre { type nat hook prerouting priority dstnat; policy accept;
    ip daddr 172.30.0.41 tcp dport 80 dnat to numgen random mod 2 map { 0 : 10.180.0.1, 1 : 10.180.2.1 };
    ip daddr 172.30.0.41 udp dport 53 dnat to numgen random mod 2 map { 0 : 10.180.0.1, 1 : 10.180.2.1 };
    ip daddr 172.30.0.43 tcp dport 80 dnat to 10.180.0.1:81;
    ip daddr 172.30.0.44 tcp dport 80 dnat to 10.244.2.10:80;
    ip daddr 1.2.3.4 tcp dport 80 dnat to 10.180.0.1:80; }
  chain out { type nat hook output priority -100; policy accept; ip daddr 192.168.0.2 tcp dport 3001 dnat to 10.180.0.1:80; }
  chain post { type nat hook postrouting priority srcnat; policy accept; ip saddr != 10.0.0.0/8 ip daddr 10.0.0.0/8 masquerade; ip saddr 10.180.0.1 ip daddr 10.180.0.1 masquerade; }
  chain fw { type filter hook forward priority 0; policy accept; ip daddr 172.30.0.99 reject; ip daddr 172.30.0.98 drop; }
}
table ip6 t {
  chain pre { type nat hook prerouting priority dstnat; policy accept; ip6 daddr fd00:172::1 tcp dport 80 dnat to [fd00:10::1]:80; }
  chain post { type nat hook postrouting priority srcnat; policy accept; ip6 saddr != fd00:10::/64 masquerade; }
}`,
    );
  });

  after(async () => {
    await lab?.close();
    const left = listNamespaces().filter((n) => mine.includes(n));
    assert.deepEqual(left, [], 'every namespace of the lab is deleted');
    assert.equal(rootSnapshot(), root, 'the root network namespace is unchanged');
  });

  it('builds in well under a few seconds, with unique kpng- namespaces', () => {
    assert.ok(lab.buildMs < 5000, `built in ${lab.buildMs} ms`);
    assert.ok(lab.closedPortsMarked, 'the lab could not mark closed ports (nft socket expression missing?)');
    assert.ok(mine.every((n) => n.startsWith('kpng-labtest-') && listNamespaces().includes(n)));
    console.log(`lab built in ${lab.buildMs} ms (${mine.length} namespaces)`);
  });

  it('sees DNAT to an endpoint, spread over both, with the client address kept', async () => {
    const out = await lab.burst({ from: '10.0.0.2', to: '172.30.0.41', port: 80, count: 24 });
    const s = spread(out);
    assert.deepEqual([...s.keys()].sort(), ['10.180.0.1:80', '10.180.2.1:80'], JSON.stringify([...s]));
    for (const o of out) assert.equal(seenSource(o), '10.0.0.2');
    assert.ok(!out.some(masqueraded));
  });

  it('sees masquerade: the endpoint sees the node, not the client', async () => {
    const cases: [string, string, number][] = [
      ['203.0.113.2', '1.2.3.4', 80],
      ['1.2.3.4', '1.2.3.4', 80], // an LB IP as the source (a cloud LB's SNAT)
      ['192.168.0.2', '192.168.0.2', 3001], // the node itself: masquerade still visible
    ];
    for (const [from, to, port] of cases) {
      const o = await lab.connect({ from, to, port });
      assert.equal(verdict(o, to, port), '10.180.0.1:80', describeOutcome(o));
      assert.equal(seenSource(o), POD_GATEWAY[4], describeOutcome(o));
      assert.ok(lab.isNodeAddress(seenSource(o)!));
    }
  });

  it('sees a hairpin (a pod reaching itself) only when masqueraded', async () => {
    const out = await lab.burst({ from: '10.180.0.1', to: '172.30.0.41', port: 80, count: 16 });
    for (const o of out) {
      assert.equal(o.kind, 'answered', describeOutcome(o));
      if (verdict(o, '172.30.0.41', 80) === '10.180.0.1:80') assert.equal(seenSource(o), POD_GATEWAY[4]);
      else assert.equal(seenSource(o), '10.180.0.1');
    }
  });

  it('tells REJECT (fast) from DROP (timeout) from a port nobody listens on', async () => {
    const [rej, drop, closed, udpRej] = await Promise.all([
      lab.connect({ from: '10.0.0.2', to: '172.30.0.99', port: 80 }),
      lab.connect({ from: '10.0.0.2', to: '172.30.0.98', port: 80, timeoutMs: 800 }),
      lab.connect({ from: '10.0.0.2', to: '172.30.0.43', port: 80 }),
      lab.connect({ from: '10.0.0.2', to: '172.30.0.99', port: 53, protocol: 'UDP' }),
    ]);
    assert.equal(verdict(rej, '172.30.0.99', 80), 'REJECT');
    assert.ok(rej.ms < 500, `REJECT took ${rej.ms} ms`);
    assert.equal(verdict(drop, '172.30.0.98', 80), 'DROP');
    assert.ok(drop.ms >= 700);
    // DNAT to an endpoint port without a server: not mistaken for kpng's REJECT
    assert.match(verdict(closed, '172.30.0.43', 80), /^UNREACHABLE/);
    assert.equal(verdict(udpRej, '172.30.0.99', 53), 'REJECT');
  });

  it('sees "" (untouched) as an answer from the destination itself: the node, or the world beyond it', async () => {
    const [node, world, udp] = await Promise.all([
      lab.connect({ from: '203.0.113.2', to: '192.168.1.2', port: 3001 }),
      lab.connect({ from: '10.0.0.2', to: '172.30.0.50', port: 80 }),
      lab.connect({ from: '10.0.0.2', to: '172.30.0.50', port: 53, protocol: 'UDP' }),
    ]);
    assert.equal(verdict(node, '192.168.1.2', 3001), '');
    assert.equal(node.kind === 'answered' && node.by, 'node-a');
    assert.equal(verdict(world, '172.30.0.50', 80), '');
    assert.equal(world.kind === 'answered' && world.by, 'world');
    assert.equal(verdict(udp, '172.30.0.50', 53), '');
    assert.ok(![node, world, udp].some(masqueraded));
  });

  it('reaches pods behind another node, and IPv6', async () => {
    const far = await lab.connect({ from: '203.0.113.2', to: '172.30.0.44', port: 80 });
    assert.equal(verdict(far, '172.30.0.44', 80), '10.244.2.10:80', describeOutcome(far));
    assert.equal(seenSource(far), POD_GATEWAY[4]);
    const v6pod = await lab.connect({ from: 'fd00:10::2', to: 'fd00:172::1', port: 80 });
    assert.equal(verdict(v6pod, 'fd00:172::1', 80), '[fd00:10::1]:80', describeOutcome(v6pod));
    assert.equal(seenSource(v6pod), 'fd00:10::2');
    const v6ext = await lab.connect({ from: '2600:5200::1', to: 'fd00:172::1', port: 80 });
    assert.equal(verdict(v6ext, 'fd00:172::1', 80), '[fd00:10::1]:80', describeOutcome(v6ext));
    assert.equal(seenSource(v6ext), POD_GATEWAY[6]);
  });

  it('keeps a TCP connection and a UDP socket open across a rule change; new connections follow the rules', async () => {
    const tcp = await lab.open({ from: '10.0.0.2', to: '172.30.0.41', port: 80 });
    const udp = await lab.open({ from: '10.0.0.2', to: '172.30.0.41', port: 53, protocol: 'UDP' });
    assert.equal(tcp.first.kind, 'answered');
    assert.equal(udp.first.kind, 'answered');
    await nft(lab, 'flush chain ip t pre\nadd rule ip t pre ip daddr 172.30.0.41 dnat to 10.244.2.10\n');
    const [t2, u2] = [await tcp.send(), await udp.send()];
    assert.equal(t2.kind === 'answered' && t2.local, tcp.first.kind === 'answered' && tcp.first.local, 'the open TCP connection keeps its endpoint');
    assert.equal(u2.kind === 'answered' && u2.local, udp.first.kind === 'answered' && udp.first.local, 'the UDP socket keeps its conntrack entry');
    const fresh = await lab.connect({ from: '10.0.0.2', to: '172.30.0.41', port: 80 });
    assert.equal(verdict(fresh, '172.30.0.41', 80), '10.244.2.10:80');
    // deleting the UDP conntrack entry moves the "connection" (what kpng's cleanup does)
    await lab.serve('far', { udp: [53] });
    const del = await lab.exec('node-a', ['conntrack', '-D', '-p', 'udp', '--orig-dst', '172.30.0.41']);
    assert.equal(del.code, 0, del.stderr);
    const u3 = await udp.send();
    assert.equal(verdict(u3, '172.30.0.41', 53), '10.244.2.10:53', describeOutcome(u3));
    await Promise.all([tcp.close(), udp.close()]);
  });
});

// The flow runner against hand-written upstream-style rulesets: every flow
// passes; with no rules at all, every flow fails (the checks are not vacuous).
for (const file of ['nftables_test_cluster_ip_general.json', 'nftables_test_load_balancer.json']) {
  describe(`lab: flow runner on a hand-written ruleset (${file})`, { skip }, () => {
    const s = loadScenario(file);
    let lab: Lab;
    before(async () => {
      lab = await Lab.create(labSpecFor(s, 'labtest'));
      await serveScenario(lab, s);
    });
    after(() => lab?.close());

    it('every flow fails with no rules', async () => {
      const results = await Promise.all(s.flows.filter((f) => f.protocol !== 'SCTP').map((f) => checkFlow(lab, s, f, 600)));
      const passed = results.map((r, i) => (r.problems.length ? undefined : s.flows[i].name)).filter(Boolean);
      assert.deepEqual(passed, []);
    });

    it('every flow passes with the hand-written rules', async () => {
      await nft(lab, readFileSync(new URL(file.replace('.json', '.nft'), RULES), 'utf8'));
      const flows = s.flows.filter((f) => f.protocol !== 'SCTP');
      const results = await Promise.all(flows.map((f) => checkFlow(lab, s, f)));
      const failed = results.flatMap((r, i) => (r.problems.length ? [`${flows[i].name}: ${r.problems.join('; ')}`] : []));
      assert.deepEqual(failed, []);
    });
  });
}

/** A process that builds a lab, prints its namespaces, then does `then` (in its own process group with `group`). */
function child(then: string, group = false): { p: ReturnType<typeof spawn>; namespaces: Promise<string[]> } {
  const lab = new URL('../../src/lab/index.ts', import.meta.url).pathname;
  const code = `import { Lab } from ${JSON.stringify(lab)};
const lab = await Lab.create({ tag: 'crashtest', node: { name: 'n' }, pods: [{ name: 'p', ips: ['10.0.0.5'] }] });
console.log(JSON.stringify(lab.namespaces));
${then}`;
  const p = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', code], { stdio: ['ignore', 'pipe', 'pipe'], detached: group });
  let out = '';
  const namespaces = new Promise<string[]>((resolve, reject) => {
    p.stdout!.on('data', (d) => {
      out += d;
      if (out.includes('\n')) resolve(JSON.parse(out.split('\n')[0]));
    });
    p.on('exit', () => reject(new Error(`child exited before building its lab: ${out}`)));
  });
  return { p, namespaces };
}

describe('lab: a test process that dies', { skip }, () => {
  it('throwing: its exit hook deletes the namespaces', async () => {
    const c = child(`throw new Error('test failed');`);
    const names = await c.namespaces;
    const code = await new Promise((r) => c.p.on('exit', r));
    assert.equal(code, 1);
    assert.deepEqual(listNamespaces().filter((n) => names.includes(n)), []);
  });

  it('killed: the next lab of the same tag removes the leftovers (and what ran in them)', async () => {
    const c = child(`setInterval(() => {}, 1000);`);
    const names = await c.namespaces;
    c.p.kill('SIGKILL');
    await new Promise((r) => c.p.on('exit', r));
    try {
      assert.deepEqual(listNamespaces().filter((n) => names.includes(n)).sort(), [...names].sort(), 'a killed process cannot clean up');
      const removed = removeLeftovers('crashtest', Date.now() + 1000);
      assert.deepEqual(removed.sort(), [...names].sort());
      assert.deepEqual(listNamespaces().filter((n) => names.includes(n)), []);
    } finally {
      for (const n of names) spawnSync('ip', ['netns', 'del', n]);
    }
  });
});

describe('lab: its owner interrupted', { skip }, () => {
  it('a Ctrl-C (SIGINT to the process group) reaches the owner, not the agents or kpng it runs: they answer while it cleans up', async () => {
    // as kpng demo on Ctrl-C: one last probe through the agents, then close
    const c = child(
      `await lab.serve('p', { tcp: [80] });
const kpng = lab.startKpng(['file', '--input', '/nonexistent-kpng-test', 'to-local', 'to-log']);
await kpng.until('kpng started', () => kpng.stderr.length > 0);
process.on('SIGINT', async () => {
  await new Promise((r) => setTimeout(r, 300));
  const o = await lab.connect({ from: '192.168.0.2', to: '10.0.0.5', port: 80 }).catch((e) => ({ kind: String(e) }));
  const running = kpng.process.exitCode === null && kpng.process.signalCode === null;
  await lab.close();
  console.log(JSON.stringify({ probe: o.kind, kpngRunning: running }));
  process.exit(0);
});
console.log('ready');`,
      true,
    );
    const names = await c.namespaces;
    let out = '';
    c.p.stdout!.on('data', (d) => (out += d));
    try {
      for (let i = 0; i < 200 && !out.includes('ready'); i++) await new Promise((r) => setTimeout(r, 50));
      assert.ok(out.includes('ready'), out);
      process.kill(-c.p.pid!, 'SIGINT');
      const code = await new Promise((r) => c.p.on('exit', r));
      assert.equal(code, 0, out);
      assert.deepEqual(JSON.parse(out.trim().split('\n').at(-1)!), { probe: 'answered', kpngRunning: true });
      assert.deepEqual(listNamespaces().filter((n) => names.includes(n)), []);
    } finally {
      if (c.p.exitCode === null) process.kill(-c.p.pid!, 'SIGKILL');
      for (const n of names) spawnSync('ip', ['netns', 'del', n], { stdio: 'ignore' });
    }
  });
});

describe('lab: leftovers of a crashed run', { skip }, () => {
  it('removes only its own tag, from runs that are gone', async () => {
    // a pid that is not running: past the kernel's pid_max
    const dead = `kpng-leftovertest-4194400-abcdef-node`;
    const live = `kpng-leftovertest-1-abcdef-node`; // pid 1 is alive: a parallel run
    const other = `kpng-otherleftover-4194400-abcdef-node`;
    const names = [dead, live, other];
    try {
      for (const n of names) assert.equal(spawnSync('ip', ['netns', 'add', n]).status, 0);
      // (namespace files cannot be backdated: count them as older than now)
      const removed = removeLeftovers('leftovertest', Date.now() + 1000);
      assert.deepEqual(removed, [dead]);
      const now = listNamespaces();
      assert.ok(!now.includes(dead) && now.includes(live) && now.includes(other));
    } finally {
      for (const n of names) spawnSync('ip', ['netns', 'del', n]);
    }
  });
});
