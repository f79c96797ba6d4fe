// to-file streams its documents (src/sinks/file/stream.ts): the text must
// be byte for byte what rendering the whole document gives (yaml with
// lineWidth 0, JSON.stringify(doc, null, 2)), for real states and for any
// JSON value the writer might meet.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, mkdtempSync, rmSync, readdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseAllDocuments, stringify as toYAML } from 'yaml';
import { FullStateSink, type FullState } from '../../src/diff/fullstate.js';
import { documentChunks } from '../../src/sinks/file/stream.js';
import { formatDocument, nodeStateDocument, nodeStateChunks, globalStateDocument, globalStateChunks, writeChunksAtomically } from '../../src/sinks/file/index.js';
import { syncedStore, watch, service, slice, node, serviceCIDR } from '../helpers/k8s.js';
import { spawnSync } from 'node:child_process';
import { kpngSync, KPNG, ROOT } from '../helpers/cli.js';
import { nodeStateOnce } from '../../src/sinks/file/once.js';
import { LocalSet } from '../../src/api/model.js';

type Obj = Record<string, any>;

const join0 = (chunks: Iterable<string>) => [...chunks].join('');

/** the example cluster, plus objects whose values are awkward in YAML */
function objects(): Obj[] {
  const example = parseAllDocuments(readFileSync(join(ROOT, 'examples/cluster.yaml'), 'utf8'))
    .flatMap((d) => (d.toJS() as Obj).items ?? [d.toJS()])
    .filter((o: Obj) => ['Service', 'EndpointSlice', 'Node', 'ServiceCIDR'].includes(o.kind));
  const odd = [
    node('n-odd', 'true', ['fd00::5', '10.1.0.5']),
    serviceCIDR('v6', ['fd00:10::/108']),
    // names YAML reads as other types: true, null, 1e3, 0x1F, 012
    service('true', 'null', { clusterIP: '10.96.7.7', ports: [{ name: 'yes', port: 53, protocol: 'UDP' }, { name: '0x1f', port: 54 }] }),
    slice('true', 'null-1', 'null', [{ ip: '10.9.0.1', node: 'n-odd', zone: 'true', zoneHints: ['true'] }, { ip: '10.9.0.2', node: 'node-b', ready: false, serving: true, terminating: true }], [{ name: 'yes', port: 5353, protocol: 'UDP' }, { name: '0x1f', port: 54 }]),
    service('1e3', '012', { clusterIP: 'fd00:10::12', ipFamilies: ['IPv6'], type: 'LoadBalancer', ports: [{ name: 'h', port: 80, nodePort: 30012 }], externalIPs: ['fd00::99'], loadBalancerSourceRanges: ['fd00::/64'] }, { status: { loadBalancer: { ingress: [{ ip: 'fd00::1', ipMode: 'Proxy' }] } } }),
    slice('1e3', '012-1', '012', [{ ip: 'fd00:1::1', node: 'n-odd', pod: 'p:1' }], [{ name: 'h', port: 8080 }]),
  ];
  return [...example, ...odd];
}

/** as to-file's stream gives it: with the node and the ServiceCIDRs */
function nodeState(nodeName: string): FullState {
  const store = syncedStore(objects());
  let state: FullState | undefined;
  const sink = new FullStateSink((s) => void (state = s));
  for (const op of watch(store, nodeName, [LocalSet.NodesSet, LocalSet.ServiceCIDRsSet]).next()) void sink.send(op);
  assert.ok(state, 'a Sync');
  return state;
}

test('a node state streams to the same text as the whole document, YAML and JSON', () => {
  const nodes = ['n-odd', ...syncedStore(objects()).allNodes()].map((n) => (typeof n === 'string' ? n : n.node.Name));
  for (const name of [...new Set(nodes), 'nowhere']) {
    const state = nodeState(name);
    for (const format of ['yaml', 'json'] as const) {
      assert.equal(join0(nodeStateChunks(state, format)), formatDocument(nodeStateDocument(state), format), `${name} ${format}`);
    }
  }
});

test('the global state streams to the same text as the whole document', () => {
  const store = syncedStore(objects());
  for (const format of ['yaml', 'json'] as const) assert.equal(join0(globalStateChunks(store, format)), formatDocument(globalStateDocument(store), format), format);
  const empty = syncedStore([]);
  for (const format of ['yaml', 'json'] as const) assert.equal(join0(globalStateChunks(empty, format)), formatDocument(globalStateDocument(empty), format), `empty ${format}`);
});

// any JSON value: strings YAML could read as something else, quoting, lines, empty collections, nesting
const STRINGS = [
  '', ' ', ' a', 'a ', 'a: b', 'a:b', ':a', '#x', 'a #b', 'a#b', '- x', '-', '-1', '+1', '.5', '1.5', '1e3', '0x1F', '0o7', '012', '.inf', '-.Inf', '.nan', '~', 'null', 'Null', 'NULL', 'nUll',
  'true', 'True', 'TRUE', 'tRue', 'false', 'yes', 'no', 'on', 'off', 'y', '::1', 'fe80::1%eth0', '10.0.0.1', '10.0.0.1/24', '2026-01-01', '12:30:00', 'a\nb', 'a\n', '\nb', 'x\n\ny', '\t', 'a\tb',
  'é', 'ü-x', '"q"', "'s'", "it's", '@x', '`x', '%x', '!x', '&x', '*x', '|', '>', '?', '?x', 'x?', ',', 'a,b', '[a]', '{a}', 'a]', 'x'.repeat(300), 'a b', 'a  b', '\u2028', '\ufeff', '\u0001', '\\', 'a\\b',
  '10.0.0.1', '10.0.0.0/8', '1.2.3', '1.2.3/4', '1.2e3.4', '1..2', '1.2.', '1.2.3:4', '1.2.3 4', '0.0.0.0/0/1', '1.-2.3', '1._.3', '1.2.3e4', '1.2.3-rc.1',
  'name', 'web_1', 'demo/web', 'p-1.2', 'A_b.c/d-e', '_x', '.x', '/x', 'x/', '<<', '=', '--- x', '...', '---',
];
const NUMBERS = [0, 1, -1, 42, 65535, 1.5, -0.25, 1e21, 2 ** 53 + 2, -0, 1e-7, 123456789012];

function rng(seed: number) {
  return () => ((seed = (seed * 1103515245 + 12345) & 0x7fffffff) / 0x80000000);
}

function randomValue(r: () => number, depth: number): unknown {
  const x = r();
  if (depth > 3 || x < 0.45) {
    const y = r();
    if (y < 0.6) return STRINGS[Math.floor(r() * STRINGS.length)];
    if (y < 0.8) return NUMBERS[Math.floor(r() * NUMBERS.length)];
    if (y < 0.9) return r() < 0.5;
    return null;
  }
  const n = Math.floor(r() * 4);
  if (x < 0.7) return Array.from({ length: n }, () => randomValue(r, depth + 1));
  const o: Obj = {};
  for (let i = 0; i < n; i++) o[r() < 0.7 ? ['service', 'endpoints', 'name', 'ips', 'V4', 'port'][Math.floor(r() * 6)] + i : STRINGS[Math.floor(r() * STRINGS.length)]] = randomValue(r, depth + 1);
  return o;
}

test('any JSON value streams to what the yaml library and JSON.stringify write', () => {
  const r = rng(7);
  for (let i = 0; i < 3000; i++) {
    const head: Obj = {};
    const nHead = Math.floor(r() * 3);
    for (let h = 0; h < nHead; h++) head[h === 0 ? 'node' : STRINGS[Math.floor(r() * STRINGS.length)] || 'k'] = randomValue(r, 1);
    if ('services' in head) delete head.services;
    const items = Array.from({ length: Math.floor(r() * 4) }, () => randomValue(r, 1));
    const doc = { ...head, services: items };
    for (const format of ['yaml', 'json'] as const) {
      const want = format === 'json' ? JSON.stringify(doc, null, 2) + '\n' : toYAML(doc, { lineWidth: 0 });
      assert.equal(join0(documentChunks(format, head, 'services', items)), want, `${format} ${JSON.stringify(doc)}`);
    }
  }
});

test('the streamed file is written atomically: a failure mid-way leaves the old file and no temporary one', () => {
  const dir = mkdtempSync(join(tmpdir(), 'kpng-to-file-'));
  try {
    const path = join(dir, 'state.yaml');
    writeChunksAtomically(path, ['a: 1\n']);
    assert.equal(readFileSync(path, 'utf8'), 'a: 1\n');
    function* failing() {
      yield 'x'.repeat(3 << 20);
      throw new Error('boom');
    }
    assert.throws(() => writeChunksAtomically(path, failing()), /boom/);
    assert.equal(readFileSync(path, 'utf8'), 'a: 1\n');
    assert.deepEqual(readdirSync(dir), ['state.yaml']);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('the streamed file holds exactly the chunks, UTF-8, small and large and across its write buffer', () => {
  const dir = mkdtempSync(join(tmpdir(), 'kpng-to-file-'));
  try {
    const path = join(dir, 'state.yaml');
    const r = rng(3);
    const pieces = ['a', 'é', '€', '😀', 'name: x\n', '"\\u0000"'];
    const chunks: string[] = [];
    for (let i = 0; i < 20_000; i++) chunks.push(pieces[Math.floor(r() * pieces.length)].repeat(1 + Math.floor(r() * 200)));
    chunks.splice(5000, 0, '€'.repeat(400_000), 'b'.repeat(2 << 20));
    writeChunksAtomically(path, chunks);
    assert.ok(readFileSync(path).equals(Buffer.from(chunks.join(''), 'utf8')));
    writeChunksAtomically(path, []);
    assert.equal(readFileSync(path, 'utf8'), '');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('kpng file ... to-file --node-name N --once writes the node state document', () => {
  const dir = mkdtempSync(join(tmpdir(), 'kpng-to-file-'));
  try {
    for (const format of ['yaml', 'json']) {
      const out = join(dir, `state.${format}`);
      const r = kpngSync(['file', '--input', join(ROOT, 'examples/cluster.yaml'), '--no-watch', 'to-file', '--node-name', 'node-a', '--once', '--format', format, '--output', out]);
      assert.equal(r.status, 0, r.stderr);
      const text = readFileSync(out, 'utf8');
      const doc = format === 'json' ? JSON.parse(text) : parseAllDocuments(text)[0].toJS();
      assert.deepEqual(Object.keys(doc), ['node', 'serviceCIDRs', 'services']);
      assert.ok(doc.services.length > 0);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('to-file --output - --once prints a state of several megabytes whole, the same as to a file', () => {
  const dir = mkdtempSync(join(tmpdir(), 'kpng-to-file-'));
  try {
    // 3,000 Services x 5 endpoints on the node: about 5 MB of YAML, more than one write
    const items: Obj[] = [node('n1', 'z1', ['10.1.0.1'])];
    for (let s = 0; s < 3000; s++) {
      items.push(service('big', `s-${s}`, { clusterIP: `10.96.${s >> 8}.${s & 255}` }));
      items.push(slice('big', `s-${s}-1`, `s-${s}`, Array.from({ length: 5 }, (_, e) => ({ ip: `10.2.${(s * 5 + e) >> 8 & 255}.${(s * 5 + e) & 255}`, node: 'n1' }))));
    }
    const input = join(dir, 'cluster.json');
    writeFileSync(input, JSON.stringify({ apiVersion: 'v1', kind: 'List', items }));
    // the node's state, and the global state
    for (const nodeArgs of [['--node-name', 'n1'], []]) {
      const out = join(dir, 'state.yaml');
      const toFile = kpngSync(['file', '--input', input, '--no-watch', 'to-file', ...nodeArgs, '--once', '--output', out], { timeoutMs: 120_000 });
      assert.equal(toFile.status, 0, toFile.stderr);
      // kpngSync's spawnSync would cut stdout at 1 MiB
      const printed = spawnSync(KPNG[0], [...KPNG.slice(1), 'file', '--input', input, '--no-watch', 'to-file', ...nodeArgs, '--once', '--output', '-'], { cwd: ROOT, encoding: 'utf8', timeout: 120_000, maxBuffer: 1 << 30 });
      assert.equal(printed.status, 0, printed.stderr);
      const expected = readFileSync(out, 'utf8');
      assert.ok(expected.length > 3 << 20, `${expected.length} bytes`);
      assert.equal(printed.stdout.length, expected.length, nodeArgs.join(' '));
      assert.ok(printed.stdout === expected);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('--once computes the node state from the store one Service at a time: the same state and text as the diff stream gives', () => {
  const store = syncedStore(objects());
  const nodes = ['n-odd', ...[...store.allNodes()].map((n) => n.node.Name), 'nowhere'];
  for (const name of new Set(nodes)) {
    const want = nodeState(name);
    const once = nodeStateOnce(store, name, '');
    const services = [...once.services].map(({ service, endpoints }) => ({ service, endpoints }));
    assert.deepEqual({ ...once, services }, want, name);
    for (const format of ['yaml', 'json'] as const) {
      assert.equal(join0(nodeStateChunks(nodeStateOnce(store, name, ''), format)), join0(nodeStateChunks(want, format)), `${name} ${format}`);
    }
  }
});

