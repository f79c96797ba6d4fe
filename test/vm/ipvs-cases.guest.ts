// The guest half of ipvs.test.ts: one lab, one kpng (to-ipvs) following a
// state directory, the cases one after the other on real packets; each case
// returns its problems (empty: it held). IPVS's own view comes from
// `ipvsadm -Sn` (Debian's ipvsadm), not from kpng's netlink client.
import { describeOutcome, seenSource, verdict, type LabConnection } from '../../src/lab/index.js';
import { node, service, serviceCIDR, slice } from '../helpers/k8s.js';
import { KpngLab, answeredBy, backendLabUnsupported, kubeProxyConfig, pollUntil } from '../helpers/lab-kpng.js';
import { guestMain, isMain } from '../helpers/kernel-lab.js';

type Obj = Record<string, any>;
export type IpvsCases = Record<string, string[]>;

const NODE_IP = '192.168.0.2';
const NODE_IP6 = '2001:db8::2';
const A = '10.244.1.10';
const B = '10.244.1.11';
const C = '10.244.1.12';
const A6 = 'fd00:10::a';
const B6 = 'fd00:10::b';
const CLIENT = '10.244.1.50';
const CLIENT6 = 'fd00:10::50';
const VIP = { rr: '10.96.0.10', sh: '10.96.0.11', mh: '10.96.0.12', bogus: '10.96.0.13', sticky: '10.96.0.14', drain: '10.96.0.15', sctp: '10.96.0.16' };
const VIP6 = 'fd00:96::10';
// TCG: the guest is 10-30 times slower than the host
const timeoutMs = 5000;

const http = (extra: Obj = {}) => ({ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080, ...extra });
const annotated = (scheduler: string, flags?: string) => ({ metadata: { annotations: { 'kpng.io/ipvs-scheduler': scheduler, ...(flags ? { 'kpng.io/ipvs-scheduler-flags': flags } : {}) } } });
const eps = (ips: string[]) => ips.map((ip) => ({ ip, node: ip === C ? 'node-b' : 'node-a' }));

/** The cluster, with the endpoints of some Services replaced. */
function state(over: { rr?: string[]; drain?: string[] } = {}): Obj[] {
  const rr = over.rr ?? [A, B];
  return [
    node('node-a', undefined, [NODE_IP, NODE_IP6]),
    serviceCIDR('kubernetes', ['10.96.0.0/16', 'fd00:96::/112']),
    service('demo', 'rr', {
      type: 'NodePort',
      clusterIP: VIP.rr,
      clusterIPs: [VIP.rr, VIP6],
      ipFamilies: ['IPv4', 'IPv6'],
      ipFamilyPolicy: 'RequireDualStack',
      ports: [http({ nodePort: 30080 }), { name: 'dns', port: 53, protocol: 'UDP', targetPort: 5353 }],
    }),
    slice('demo', 'rr-4', 'rr', eps(rr), [{ name: 'http', port: 8080 }, { name: 'dns', port: 5353, protocol: 'UDP' }]),
    slice('demo', 'rr-6', 'rr', eps([A6, B6]), [{ name: 'http', port: 8080 }, { name: 'dns', port: 5353, protocol: 'UDP' }]),
    service('demo', 'sh', { clusterIP: VIP.sh, ports: [http()] }, annotated('sh')),
    slice('demo', 'sh', 'sh', eps([A, B, C])),
    service('demo', 'mh', { clusterIP: VIP.mh, ports: [http()] }, annotated('mh', 'mh-port')),
    slice('demo', 'mh', 'mh', eps([A, B, C])),
    service('demo', 'bogus', { clusterIP: VIP.bogus, ports: [http()] }, annotated('fancy')),
    slice('demo', 'bogus', 'bogus', eps([A, B])),
    service('demo', 'sticky', { clusterIP: VIP.sticky, ports: [http()], sessionAffinity: 'ClientIP', sessionAffinityConfig: { clientIP: { timeoutSeconds: 60 } } }),
    slice('demo', 'sticky', 'sticky', eps([A, B, C])),
    service('demo', 'drain', { clusterIP: VIP.drain, ports: [http()] }),
    slice('demo', 'drain', 'drain', eps(over.drain ?? [A, B, C])),
    service('demo', 'sctp', { type: 'NodePort', clusterIP: VIP.sctp, ports: [{ name: 'sig', port: 9000, protocol: 'SCTP', targetPort: 9000, nodePort: 30900 }] }),
    slice('demo', 'sctp', 'sctp', eps([A, B]), [{ name: 'sig', port: 9000, protocol: 'SCTP' }]),
  ];
}

/** IPVS as ipvsadm saves it: virtual server ("-t 10.96.0.10:80") -> its options, and its real servers with their weights. */
async function ipvsadm(kl: KpngLab): Promise<Map<string, { options: string; real: Map<string, number> }>> {
  const r = await kl.lab.exec(kl.lab.nodeName, ['ipvsadm', '-Sn']);
  if (r.code !== 0) throw new Error(`ipvsadm -Sn: ${r.stderr}`);
  const out = new Map<string, { options: string; real: Map<string, number> }>();
  for (const line of r.stdout.split('\n')) {
    // ipvsadm saves SCTP as --sctp-service: kept as -s here (the -t/-u of the others)
    const l = line.replace(/--sctp-service/g, '-s');
    let m = /^-A (-[tus] \S+) ?(.*)$/.exec(l);
    if (m) out.set(m[1], { options: m[2].trim(), real: new Map() });
    m = /^-a (-[tus] \S+) -r (\S+) .*-w (\d+)/.exec(l);
    if (m) out.get(m[1])?.real.set(m[2], Number(m[3]));
  }
  return out;
}

async function cases(): Promise<IpvsCases> {
  const out: IpvsCases = {};
  const why = await backendLabUnsupported({ name: 'ipvs' });
  if (why) throw new Error(why);
  const kl = await KpngLab.create(
    { name: 'ipvs' },
    {
      tag: 'vmipvs',
      node: { name: 'node-a', interfaces: [{ name: 'eth0', addresses: [`${NODE_IP}/24`, `${NODE_IP6}/64`] }] },
      pods: [
        { name: 'web-a', ips: [A, A6] },
        { name: 'web-b', ips: [B, B6] },
        { name: 'web-c', ips: [C] },
        { name: 'client', ips: [CLIENT, CLIENT6] },
      ],
    },
    state(),
    kubeProxyConfig({ mode: 'ipvs', clusterCIDR: '10.244.0.0/16,fd00:10::/64', syncPeriod: '2s', minSyncPeriod: '0s' }),
  );
  const lab = kl.lab;
  const run = async (name: string, fn: (p: string[]) => Promise<void>) => {
    const p: string[] = [];
    const t0 = Date.now();
    try {
      await fn(p);
    } catch (e) {
      p.push(`failed: ${(e as Error).stack ?? e}\n${kl.kpng?.stderr.slice(-3000) ?? ''}`);
    }
    console.log(`${name}: ${Date.now() - t0} ms${p.length ? ` (${p.length} problem(s))` : ''}`);
    if (p.length) p.push(await diagnostics());
    out[name] = p;
  };
  /** what a failed case shows besides its problems: IPVS, kube-ipvs0, kpng's warnings */
  const diagnostics = async () => {
    const v = await lab.exec(lab.nodeName, ['ipvsadm', '-Sn']);
    const a = await lab.exec(lab.nodeName, ['ip', '-br', 'addr', 'show', 'dev', 'kube-ipvs0']);
    const logs = (kl.kpng?.stderr ?? '').split('\n').filter((l) => /WARN|ERROR|synced/.test(l)).slice(-30);
    return `diagnostics:\n${v.stdout}${a.stdout}${a.stderr}kpng:\n${logs.join('\n')}`;
  };
  const burst = (to: string, count: number, from = CLIENT, port = 80) => lab.burst({ from, to, port, count, timeoutMs });
  const check = (p: string[], ok: boolean, what: string) => (ok ? undefined : p.push(what));

  try {
    await Promise.all([...['web-a', 'web-b', 'web-c'].map((w) => lab.serve(w, { tcp: [8080], udp: [5353], sctp: [9000] })), lab.serve('node-a', { tcp: [2222] })]);
    await kl.startAndWait(() => lab.connect({ from: CLIENT, to: VIP.rr, port: 80, timeoutMs }), { pre: ['--log-level', 'debug'], timeoutMs: 120_000 });

    await run('schedulers per Service', async (p) => {
      const v = await ipvsadm(kl);
      check(p, /-s rr\b/.test(v.get(`-t ${VIP.rr}:80`)?.options ?? ''), `${VIP.rr}:80 (no annotation) is not rr: ${v.get(`-t ${VIP.rr}:80`)?.options}`);
      check(p, /-s sh\b/.test(v.get(`-t ${VIP.sh}:80`)?.options ?? ''), `${VIP.sh}:80 (sh) is not sh: ${v.get(`-t ${VIP.sh}:80`)?.options}`);
      check(p, /-s mh\b.*mh-port/.test(v.get(`-t ${VIP.mh}:80`)?.options ?? ''), `${VIP.mh}:80 (mh, mh-port) is not: ${v.get(`-t ${VIP.mh}:80`)?.options}`);
      check(p, /-s rr\b/.test(v.get(`-t ${VIP.bogus}:80`)?.options ?? ''), `${VIP.bogus}:80 (an unknown scheduler) did not fall back to rr: ${v.get(`-t ${VIP.bogus}:80`)?.options}`);
      check(p, /demo\/bogus.*"fancy" is not an IPVS scheduler/.test(kl.kpng!.stderr), 'no log line names demo/bogus and its unknown scheduler');
      // behaviour: rr alternates; sh keeps a source on one real server; mh hashing the source port spreads one client's connections
      const rr = answeredBy(await burst(VIP.rr, 12));
      check(p, rr.join() === `${A}:8080,${B}:8080`, `rr reached ${rr.join(', ')}`);
      const sh = answeredBy(await burst(VIP.sh, 12));
      check(p, sh.length === 1 && sh[0] !== 'TIMEOUT', `sh: one client reached ${sh.join(', ')} (one real server expected)`);
      const mh = answeredBy(await burst(VIP.mh, 24));
      check(p, mh.length > 1 && mh.every((x) => /:8080$/.test(x)), `mh with mh-port: one client's 24 connections reached ${mh.join(', ')}`);
    });

    await run('service addresses answer only their Service ports', async (p) => {
      // the node serves 2222 on every address: through a cluster IP it must not be reachable
      const o = await lab.connect({ from: CLIENT, to: VIP.rr, port: 2222, timeoutMs });
      check(p, verdict(o, VIP.rr, 2222) === 'REJECT', `${VIP.rr}:2222 (the node's own server): ${describeOutcome(o)}`);
      const unallocated = await lab.connect({ from: CLIENT, to: '10.96.0.99', port: 80, timeoutMs });
      check(p, verdict(unallocated, '10.96.0.99', 80) === 'DROP', `an unallocated address of the ServiceCIDR: ${describeOutcome(unallocated)}`);
    });

    await run('ClientIP affinity as IPVS persistence', async (p) => {
      const v = await ipvsadm(kl);
      check(p, /-p 60\b/.test(v.get(`-t ${VIP.sticky}:80`)?.options ?? ''), `${VIP.sticky}:80 is not persistent for 60 s: ${v.get(`-t ${VIP.sticky}:80`)?.options}`);
      const one = answeredBy(await burst(VIP.sticky, 12));
      check(p, one.length === 1 && one[0] !== 'TIMEOUT', `one client reached ${one.join(', ')}`);
      // 12 clients: all on one real server by chance has p = 3^-11
      const clients = Array.from({ length: 12 }, (_, i) => `203.0.113.${i + 1}`);
      const firsts = await Promise.all(clients.map((c) => lab.connect({ from: c, to: VIP.sticky, port: 80, timeoutMs })));
      const spread = answeredBy(firsts);
      check(p, spread.length > 1, `12 clients all reached ${spread.join(', ')}`);
      const again = await Promise.all(clients.map((c) => lab.burst({ from: c, to: VIP.sticky, port: 80, count: 3, timeoutMs })));
      clients.forEach((c, i) => check(p, answeredBy(again[i]).join() === answeredBy([firsts[i]]).join(), `client ${c} moved: ${answeredBy([firsts[i]])} then ${answeredBy(again[i])}`));
    });

    await run('IPv6: cluster IP and NodePort', async (p) => {
      const o = await burst(VIP6, 8, CLIENT6);
      check(p, answeredBy(o).join() === `[${A6}]:8080,[${B6}]:8080`, `[${VIP6}]:80 reached ${answeredBy(o).join(', ')}`);
      check(p, o.every((x) => seenSource(x) === CLIENT6), `a pod to the cluster IP was masqueraded: ${o.map(seenSource).join(', ')}`);
      const np = await lab.connect({ from: '2001:db8:ff::99', to: NODE_IP6, port: 30080, timeoutMs });
      check(p, /^\[fd00:10::[ab]\]:8080$/.test(verdict(np, NODE_IP6, 30080)), `[${NODE_IP6}]:30080 from outside: ${describeOutcome(np)}`);
      check(p, lab.isNodeAddress(seenSource(np) ?? ''), `the NodePort from outside was not masqueraded: the endpoint saw ${seenSource(np)}`);
    });

    await run('graceful termination: weight 0 while a connection is open', async (p) => {
      let conn: LabConnection | undefined;
      try {
        conn = await lab.open({ from: CLIENT, to: VIP.drain, port: 80, timeoutMs });
        const x = verdict(conn.first, VIP.drain, 80);
        const others = [A, B, C].map((ip) => `${ip}:8080`).filter((e) => e !== x);
        if (!others.includes(x) && others.length !== 2) throw new Error(`the first connection: ${describeOutcome(conn.first)}`);
        // x (an open connection) and the second of the others (none) go away
        const [keep, unused] = others;
        kl.setState(state({ drain: [keep.split(':')[0]] }));
        // no connection before IPVS has it: the one without connections must stay so
        const v = await pollUntil(() => ipvsadm(kl), (m) => m.get(`-t ${VIP.drain}:80`)?.real.get(x) === 0 && !m.get(`-t ${VIP.drain}:80`)?.real.has(unused), 30_000, 200);
        const real = v.value.get(`-t ${VIP.drain}:80`)?.real ?? new Map<string, number>();
        check(p, real.get(x) === 0, `the real server with an open connection, ${x}: weight ${real.get(x)} (0 expected, kept until its connections end)`);
        check(p, !real.has(unused), `the real server without connections, ${unused}, was not deleted: ${[...real].join(' ')}`);
        const only = answeredBy(await burst(VIP.drain, 6));
        check(p, only.join() === keep, `new connections reach ${only.join(', ')} (only ${keep} expected)`);
        const again = await conn.send();
        check(p, verdict(again, VIP.drain, 80) === x, `the open connection after its endpoint went: ${describeOutcome(again)}`);
        // UDP has no graceful termination (kube-proxy's rule): its real server goes at once
        kl.setState(state({ rr: [A], drain: [keep.split(':')[0]] }));
        const u = await pollUntil(() => ipvsadm(kl), (m) => !m.get(`-u ${VIP.rr}:53`)?.real.has(`${B}:5353`), 20_000, 200);
        check(p, u.ok, `UDP ${VIP.rr}:53 still has ${B}:5353`);
        check(p, u.value.get(`-t ${VIP.rr}:80`)?.real.get(`${B}:8080`) === 0, `TCP ${VIP.rr}:80: ${B}:8080 (connections in TIME_WAIT) is not at weight 0: ${[...(u.value.get(`-t ${VIP.rr}:80`)?.real ?? [])].join(' ')}`);
      } finally {
        await conn?.close();
      }
    });

    await run('SCTP: cluster IP and NodePort', async (p) => {
      const v = await ipvsadm(kl);
      const real = [...(v.get(`-s ${VIP.sctp}:9000`)?.real.keys() ?? [])].sort();
      check(p, real.join() === `${A}:9000,${B}:9000`, `SCTP ${VIP.sctp}:9000 has real servers ${real.join(', ') || 'none'}`);
      const o = await lab.burst({ from: CLIENT, to: VIP.sctp, port: 9000, protocol: 'SCTP', count: 6, timeoutMs });
      check(p, answeredBy(o).join() === `${A}:9000,${B}:9000`, `SCTP ${VIP.sctp}:9000 reached ${answeredBy(o).join(', ')}`);
      const np = await lab.connect({ from: '203.0.113.41', to: NODE_IP, port: 30900, protocol: 'SCTP', timeoutMs });
      check(p, /^10\.244\.1\.1[01]:9000$/.test(verdict(np, NODE_IP, 30900)), `SCTP NodePort ${NODE_IP}:30900 from outside: ${describeOutcome(np)}`);
    });

    await run('drift: a deleted virtual server and a removed address come back', async (p) => {
      const del = await lab.exec(lab.nodeName, ['ipvsadm', '-D', '-t', `${VIP.sh}:80`]);
      check(p, del.code === 0, `ipvsadm -D: ${del.stderr}`);
      const addr = await lab.exec(lab.nodeName, ['ip', 'addr', 'del', `${VIP.mh}/32`, 'dev', 'kube-ipvs0']);
      check(p, addr.code === 0, `ip addr del: ${addr.stderr}`);
      const back = await pollUntil(() => ipvsadm(kl), (m) => m.has(`-t ${VIP.sh}:80`), 20_000, 250);
      check(p, back.ok, `${VIP.sh}:80 was not restored`);
      const o = await pollUntil(() => lab.connect({ from: CLIENT, to: VIP.mh, port: 80, timeoutMs }), (x) => /:8080$/.test(verdict(x, VIP.mh, 80)), 20_000, 250);
      check(p, o.ok, `${VIP.mh} was not bound again: ${describeOutcome(o.value)}`);
      check(p, /repairing it/.test(kl.kpng!.stderr), 'no log line says the dataplane was repaired');
    });

    await run('restart with connections open', async (p) => {
      const conns: { c: LabConnection; to: string; port: number }[] = [];
      try {
        for (const [to, port, from] of [[VIP.rr, 80, CLIENT], [NODE_IP, 30080, '203.0.113.40']] as const) {
          const c = await lab.open({ from, to, port, timeoutMs });
          check(p, c.first.kind === 'answered', `before: ${describeOutcome(c.first)}`);
          conns.push({ c, to, port });
        }
        const code = await kl.kpng!.stop('SIGTERM', 20_000);
        check(p, code === 0, `kpng's exit on SIGTERM: ${code}`);
        const down = await lab.connect({ from: CLIENT, to: VIP.rr, port: 80, timeoutMs });
        check(p, verdict(down, VIP.rr, 80) === `${A}:8080`, `a new connection while kpng is down: ${describeOutcome(down)}`);
        kl.start({ pre: ['--log-level', 'debug'] });
        await kl.kpng!.until('the first sync after the restart', () => /ipvs: synced/.test(kl.kpng!.stderr), { timeoutMs: 90_000 });
        const line = kl.kpng!.stderr.split('\n').find((l) => /ipvs: synced/.test(l)) ?? '';
        check(p, /full=true/.test(line) && /operations=0\b/.test(line) && /elementChanges=0\b/.test(line) && /addresses=0\b/.test(line), `the restarted kpng changed something: ${line}`);
        for (const { c, to, port } of conns) {
          const o = await c.send();
          check(p, verdict(o, to, port) === verdict(c.first, to, port), `the open connection to ${to}:${port} after the restart: ${describeOutcome(o)}`);
        }
        // and it is at work: a change after its start shows
        kl.setState(state({ rr: [A, C], drain: [C] }));
        const r = await pollUntil(() => burst(VIP.rr, 8), (o) => answeredBy(o).includes(`${C}:8080`), 30_000, 250);
        check(p, r.ok, `the restarted kpng never added ${C}: ${answeredBy(r.value).join(', ')}`);
      } finally {
        for (const { c } of conns) await c.close().catch(() => undefined);
      }
    });

    await run('kpng cleanup removes what is kpng and nothing else', async (p) => {
      await kl.kpng!.stop('SIGTERM', 20_000);
      const foreign = await lab.exec(lab.nodeName, ['ipvsadm', '-A', '-t', `${NODE_IP}:9999`, '-s', 'wlc']);
      check(p, foreign.code === 0, `ipvsadm -A: ${foreign.stderr}`);
      const r = await lab.runKpng(['cleanup']);
      check(p, r.code === 0, `kpng cleanup: ${r.signal ? `killed by ${r.signal}` : `status ${r.code}`}\n${r.stderr.slice(-2000)}`);
      const left = [...(await ipvsadm(kl)).keys()];
      check(p, left.join() === `-t ${NODE_IP}:9999`, `virtual servers left: ${left.join(' ') || 'none'}`);
      const link = await lab.exec(lab.nodeName, ['ip', 'link', 'show', 'kube-ipvs0']);
      check(p, link.code !== 0, 'kube-ipvs0 is still there');
      for (const family of ['ip', 'ip6']) {
        const t = await lab.exec(lab.nodeName, ['nft', 'list', 'table', family, 'kpng-ipvs']);
        check(p, t.code !== 0, `table ${family} kpng-ipvs is still there`);
      }
    });
  } finally {
    await kl.close();
  }
  return out;
}

if (isMain(import.meta.url)) await guestMain(cases);

