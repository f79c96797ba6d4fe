// Fuzz (issue 19): rounds of random mutations of valid Services,
// EndpointSlices and Nodes (field types, lengths, IP forms, nesting) go to
// the real `kpng file ... to-local to-nft` in a namespace. In every round the
// process lives on, every valid object is programmed, and every invalid one
// is reported by name. Seeded: KPNG_FUZZ_SEED=<seed> replays a run (the seed
// is in every failure message); KPNG_FUZZ_ROUNDS sets the number of rounds.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, renameSync, rmSync, writeFileSync, unlinkSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { stringify } from 'yaml';
import { canUseNetns, createNetns, type TestNetns } from '../helpers/netns.js';
import { kpngSpawn } from '../helpers/cli.js';
import { node, service, slice } from '../helpers/k8s.js';

type Obj = Record<string, any>;

const SEED = Number(process.env.KPNG_FUZZ_SEED ?? Math.floor(Math.random() * 2 ** 31));
const ROUNDS = Number(process.env.KPNG_FUZZ_ROUNDS ?? 8);
const PER_ROUND = 24;

/** mulberry32: small, seedable, good enough to pick mutations */
function rng(seed: number) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return { next, int: (n: number) => Math.floor(next() * n), pick: <T>(xs: readonly T[]): T => xs[Math.floor(next() * xs.length)], chance: (p: number) => next() < p };
}
type Rng = ReturnType<typeof rng>;

/** A generated object: what kpng must do with it. */
interface Case {
  readonly object: Obj;
  /** "Service ns/name", as kpng names it in its log */
  readonly ref: string;
  readonly valid: boolean;
  /** valid Services: the cluster IP that must be programmed; invalid ones: that must not be */
  readonly clusterIP?: string;
  /** for the log when it fails */
  readonly mutation: string;
}

const label = (r: Rng, n: number) => Array.from({ length: n }, (_, i) => (i === 0 || i === n - 1 ? 'abcdefghij'[r.int(10)] : 'abcdefghij0123456789-'[r.int(21)])).join('');

/** valid IPv4 forms and IPv6 forms of one address; the canonical one first */
const v4Forms = (r: Rng, a: number, b: number) => [`10.${50 + a}.${b >> 8}.${(b & 255) || 1}`];
const invalidIPs = ['fd00::1%eth0', '::ffff:10.244.1.77%eth0', '::%0:0:0:0:0:0:0:0:0:0:0', '10.1.2.256', '', '1.2.3', '::g', '10.0.0.1/32', ' ', 'fd00::1::2'];

function mutateService(r: Rng, round: number, i: number): Case {
  const ns = `fz${round}`;
  const name = `s${i}-${label(r, 1 + r.int(8))}`;
  const clusterIP = `10.${100 + round}.${i >> 8}.${(i & 255) + 1}`;
  const ports = Array.from({ length: 1 + r.int(3) }, (_, j) => ({ name: `p${j}`, port: 1 + r.int(65535), protocol: r.pick(['TCP', 'UDP', 'SCTP']), targetPort: 1 + r.int(65535) }));
  const base = service(ns, name, { clusterIP, ports });
  const ok = (object: Obj, mutation: string): Case => ({ object, ref: `Service ${ns}/${object.metadata.name}`, valid: true, clusterIP, mutation });
  const bad = (object: Obj, mutation: string): Case => ({ object, ref: `Service ${ns}/${object.metadata.name}`, valid: false, clusterIP, mutation });
  switch (r.int(16)) {
    case 0:
      return ok({ ...base, metadata: { ...base.metadata, name: `s${i}-${'x'.repeat(60 - String(i).length)}z` } }, 'a 63-character name');
    case 1:
      return bad({ ...base, metadata: { ...base.metadata, name: `s${i}-${'x'.repeat(61 - String(i).length)}z` } }, 'a 64-character name');
    case 2:
      return bad({ ...base, metadata: { ...base.metadata, name: `s${i}-"q` } }, 'a quote in the name');
    case 3:
      // ('' is no cluster IP: valid, nothing to program)
      return bad({ ...base, spec: { ...base.spec, clusterIP: r.pick(invalidIPs.filter((x) => x !== '')), clusterIPs: undefined } }, 'a bad cluster IP');
    case 4:
      return bad({ ...base, spec: { ...base.spec, ports: [{ ...ports[0], port: r.pick([0, 65536, -1, 1.5, '80', null]) }] } }, 'a bad port');
    case 5:
      return bad({ ...base, spec: { ...base.spec, ports: [{ ...ports[0], protocol: r.pick(['ICMP', 'tcp ', 7, '']) }] } }, 'a bad protocol');
    case 6:
      return bad({ ...base, spec: { ...base.spec, ports: r.pick([{ a: 1 }, 'x', 5]) } }, 'ports of the wrong type');
    case 7:
      return bad({ ...base, spec: { ...base.spec, externalIPs: ['198.51.100.1', r.pick(invalidIPs)] } }, 'a bad external IP');
    case 8:
      return ok({ ...base, spec: { ...base.spec, externalIPs: [`::ffff:198.51.${round}.${i + 1}`] } }, 'an IPv4-mapped external IP');
    case 9:
      return ok({ ...base, spec: { ...base.spec, ports: [{ ...ports[0], name: label(r, 63) }] } }, 'a 63-character port name');
    case 10:
      return bad({ ...base, spec: { ...base.spec, ports: [{ ...ports[0], name: `P${label(r, 3)}` }] } }, 'an upper-case port name');
    case 11:
      return bad({ ...base, spec: { ...base.spec, type: r.pick(['Nodeport', 7, 'ExternalIP']) } }, 'a bad type');
    case 12:
      return ok({ ...base, spec: { ...base.spec, type: 'LoadBalancer', ports: ports.map((p, j) => ({ ...p, nodePort: 30000 + ((i * 8 + j + round * 200) % 2700) })), loadBalancerSourceRanges: ['0.0.0.0/0', `10.${round}.0.0/16`] }, status: { loadBalancer: { ingress: [{ ip: `203.0.${round}.${i + 1}` }] } } }, 'a LoadBalancer with overlapping source ranges');
    case 13:
      return bad({ ...base, spec: { ...base.spec, sessionAffinity: 'ClientIP', sessionAffinityConfig: { clientIP: { timeoutSeconds: r.pick([0, 86401, 'x']) } } } }, 'a bad affinity timeout');
    case 14:
      return ok({ ...base, spec: { ...base.spec, sessionAffinity: 'ClientIP', sessionAffinityConfig: { clientIP: { timeoutSeconds: 86400 } } } }, 'the longest affinity timeout');
    default:
      return ok(base, 'none');
  }
}

function mutateSlice(r: Rng, round: number, i: number, svc: Case): Case {
  const ns = `fz${round}`;
  const svcName = svc.object.metadata.name;
  const eps = Array.from({ length: 1 + r.int(4) }, (_, j) => ({ ip: v4Forms(r, j, i * 8 + j)[0], node: r.pick(['n1', 'n2', '']) || undefined }));
  const base = slice(ns, `${svcName}-1`.slice(0, 200), svcName, eps, [{ name: 'p0', port: 8080 }]);
  const ref = `EndpointSlice ${ns}/${base.metadata.name}`;
  const ok = (object: Obj, mutation: string): Case => ({ object, ref, valid: true, mutation });
  const bad = (object: Obj, mutation: string): Case => ({ object, ref, valid: false, mutation });
  switch (r.int(8)) {
    case 0:
      return bad({ ...base, endpoints: [{ ...base.endpoints[0], addresses: [r.pick(invalidIPs.filter((x) => x.trim() !== ''))] }] }, 'a bad endpoint address');
    case 1:
      return bad({ ...base, endpoints: [{ ...base.endpoints[0], addresses: [] }] }, 'no address');
    case 2:
      return bad({ ...base, endpoints: r.pick([{}, 'x', 3]) }, 'endpoints of the wrong type');
    case 3:
      return bad({ ...base, endpoints: [{ ...base.endpoints[0], conditions: { ready: r.pick(['yes', 1]) } }] }, 'a condition of the wrong type');
    case 4:
      return ok({ ...base, endpoints: [{ ...base.endpoints[0], addresses: [`::ffff:${base.endpoints[0].addresses[0]}`] }] }, 'an IPv4-mapped endpoint');
    default:
      return ok(base, 'none');
  }
}

function mutateNode(r: Rng, round: number, i: number): Case {
  const name = `n-fz${round}-${i}`;
  const base = node(name, 'z1', [`192.168.${round}.${i + 1}`]);
  switch (r.int(4)) {
    case 0:
      return { object: { ...base, status: { addresses: [{ type: 'InternalIP', address: r.pick(invalidIPs.filter((x) => x.trim() !== '')) }] } }, ref: `Node ${name}`, valid: false, mutation: 'a bad node address' };
    case 1:
      return { object: { ...base, spec: { podCIDRs: ['10.0.0.0/33'] } }, ref: `Node ${name}`, valid: false, mutation: 'a bad pod CIDR' };
    default:
      return { object: base, ref: `Node ${name}`, valid: true, mutation: 'none' };
  }
}

/** one round's objects, some wrapped in Lists (nested, or too deep) */
function round(r: Rng, n: number): { items: Obj[]; cases: Case[] } {
  const cases: Case[] = [];
  const items: Obj[] = [];
  for (let i = 0; i < PER_ROUND; i++) {
    const s = mutateService(r, n, i);
    const sl = mutateSlice(r, n, i, s);
    cases.push(s, sl);
    items.push(s.object, sl.object);
  }
  for (let i = 0; i < 4; i++) {
    const nd = mutateNode(r, n, i);
    cases.push(nd);
    items.push(nd.object);
  }
  // nesting: a few objects inside Lists inside Lists (16 deep at most is fine)
  const nested = items.splice(0, 3);
  let wrapped: Obj = { apiVersion: 'v1', kind: 'List', items: nested };
  for (let d = 0, depth = 1 + r.int(10); d < depth; d++) wrapped = { apiVersion: 'v1', kind: 'List', items: [wrapped] };
  items.push(wrapped);
  return { items, cases };
}

/** the cluster-ips set of kpng's table ('' while there is none) */
const clusterIPs = () => spawnSync('ip', ['netns', 'exec', ns.name, 'nft', 'list', 'set', 'ip', 'kpng', 'cluster-ips'], { encoding: 'utf8' }).stdout ?? '';

const skip = canUseNetns();
let ns: TestNetns;
let dir: string;
before(() => {
  if (skip) return;
  ns = createNetns('kpng-fz');
  dir = mkdtempSync(join(tmpdir(), 'kpng-fuzz-'));
});
after(() => {
  ns?.remove();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

test(`fuzz: mutated objects through kpng file to-nft (seed ${SEED})`, { skip, timeout: 240_000 }, async () => {
  const r = rng(SEED);
  const input = join(dir, 'in');
  mkdirSync(input);
  writeFileSync(join(input, 'node.yaml'), stringify(node('n1', 'z1', ['192.168.0.2'])));
  // in the namespace: its UDP Services' stale conntrack entries are deleted there, never in this host's table
  const k = kpngSpawn(['file', '--input', input, '--debounce', '20', '--write-grace', '200', 'to-local', 'to-nft', '--node-name', 'n1', '--no-health-checks', '--healthz-bind-address', '', '--metrics-bind-address', ''], { netns: ns.name });
  const replay = `(replay: KPNG_FUZZ_SEED=${SEED})`;
  let previous: string | undefined;
  try {
    for (let n = 0; n < ROUNDS; n++) {
      const { items, cases } = round(r, n);
      const file = join(input, `round-${n}.${n % 2 ? 'json' : 'yaml'}`);
      const tmp = join(dir, 'tmp');
      writeFileSync(tmp, n % 2 ? JSON.stringify({ apiVersion: 'v1', kind: 'List', items }) : items.map((o) => stringify(o)).join('---\n'));
      const logFrom = k.stderr.length;
      renameSync(tmp, file);
      if (previous) unlinkSync(previous);
      previous = file;
      const services = cases.filter((c) => c.clusterIP);
      const wanted = services.filter((c) => c.valid).map((c) => c.clusterIP!);
      const unwanted = services.filter((c) => !c.valid).map((c) => c.clusterIP!);
      const programmed = () => {
        const set = clusterIPs();
        return wanted.every((ip) => set.includes(ip)) && !unwanted.some((ip) => new RegExp(`\\b${ip.replace(/\./g, '\\.')}\\b`).test(set)) && !/\b10\.10\d\./.test(set.replace(new RegExp(`10\\.${100 + n}\\.`, 'g'), ''));
      };
      const reported = () => cases.filter((c) => !c.valid).every((c) => k.stderr.slice(logFrom).includes(c.ref));
      const t0 = Date.now();
      while (!(programmed() && reported()) && Date.now() - t0 < 20_000) {
        assert.equal(k.process.exitCode, null, `kpng exited in round ${n} ${replay}\n${k.stderr.slice(-3000)}`);
        await new Promise((res) => setTimeout(res, 100));
      }
      const missing = cases.filter((c) => c.valid && c.clusterIP).filter((c) => !clusterIPs().includes(c.clusterIP!));
      assert.deepEqual(missing.map((c) => `${c.ref} (${c.mutation})`), [], `valid objects not programmed in round ${n} ${replay}\n${k.stderr.slice(logFrom).slice(-3000)}`);
      const unreported = cases.filter((c) => !c.valid && !k.stderr.slice(logFrom).includes(c.ref));
      assert.deepEqual(unreported.map((c) => `${c.ref} (${c.mutation})`), [], `invalid objects not reported in round ${n} ${replay}`);
      assert.ok(programmed(), `invalid or old objects programmed in round ${n} ${replay}\n${clusterIPs()}`);
      assert.doesNotMatch(k.stderr.slice(logFrom), /sync failed/, `a sync failed in round ${n} ${replay}`);
    }
    assert.equal(k.process.exitCode, null, `kpng exited ${replay}`);
  } finally {
    await k.stop();
  }
});
