// Bad input from a brain (issue 12): a fake brain sends, among good ops,
// values that do not decode, values that decode but are invalid (an IP with
// a zone, a port out of range, a name that is not a DNS label), unknown sets
// and paths of the wrong shape. `kpng local` (to-log, as a process) and
// `kpng api` (in-process, into a store) log each once, apply the rest, keep
// the last good version of what was refused, and neither reconnects nor
// crashes because of it.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { create, toBinary } from '@bufbuild/protobuf';
import * as grpc from '@grpc/grpc-js';
import { join } from 'node:path';
import * as L from '../../src/api/gen/api/localv1/api_pb.js';
import * as G from '../../src/api/gen/api/globalv1/api_pb.js';
import { LocalSet, Protocol, newIPSet } from '../../src/api/model.js';
import { GLOBAL_WATCH_PATH, LOCAL_WATCH_PATH } from '../../src/api/grpc/wire.js';
import { ApiSource } from '../../src/sources/api/index.js';
import { QuietResyncSink, ValidatingSink, watchLocalApi } from '../../src/sinks/local/remote.js';
import { describeOp, type LocalOp } from '../../src/diff/ops.js';
import { Store } from '../../src/store/store.js';
import { kpngSpawn } from '../helpers/cli.js';
import { TempDirs } from './helpers.js';
import { until } from '../helpers/until.js';
import { recordingLogger } from '../helpers/logs.js';

const dirs = new TempDirs();
const stops: (() => unknown)[] = [];
after(async () => {
  for (const s of stops.reverse()) await s();
  dirs.cleanup();
});

const item = (op: L.OpItem['Op']): Buffer => Buffer.from(toBinary(L.OpItemSchema, create(L.OpItemSchema, { Op: op })));
const set = (s: LocalSet, path: string, bytes: Uint8Array) => item({ case: 'Set', value: create(L.ValueSchema, { Ref: create(L.RefSchema, { Set: s, Path: path }), Bytes: bytes }) });
const del = (s: LocalSet, path: string) => item({ case: 'Delete', value: create(L.RefSchema, { Set: s, Path: path }) });
const RESET = item({ case: 'Reset', value: create(L.EmptyOpSchema) });
const SYNC = item({ case: 'Sync', value: create(L.EmptyOpSchema) });

function svc(ns: string, name: string, clusterIP: string, port = 80): L.Service {
  return create(L.ServiceSchema, {
    Namespace: ns,
    Name: name,
    Type: 'ClusterIP',
    IPs: create(L.ServiceIPsSchema, { ClusterIPs: newIPSet([clusterIP]), ExternalIPs: newIPSet(), LoadBalancerIPs: newIPSet() }),
    Ports: [create(L.PortMappingSchema, { Name: 'http', Protocol: Protocol.TCP, Port: port, TargetPort: 8080 })],
  });
}
const svcBytes = (s: L.Service) => toBinary(L.ServiceSchema, s);
const epBytes = (ip: string) => toBinary(L.EndpointSchema, create(L.EndpointSchema, { IPs: newIPSet([ip]), PortOverrides: [create(L.PortNameSchema, { Name: 'http', Protocol: Protocol.TCP, Port: 8080 })] }));
const rawIPs = (v4: string) => create(L.IPSetSchema, { V4: [v4] });

const bytesIn = (b: Buffer) => b;
/** a Watch method on grpc-js's server (not kpng's): requests and responses as bytes */
const watchDefinition = (path: string): grpc.ServiceDefinition => ({
  Watch: { path, requestStream: true, responseStream: true, requestSerialize: bytesIn, requestDeserialize: bytesIn, responseSerialize: bytesIn, responseDeserialize: bytesIn },
});
const localServerDefinition = watchDefinition(LOCAL_WATCH_PATH);
const globalServerDefinition = watchDefinition(GLOBAL_WATCH_PATH);

/**
 * A brain that sends the scripted diffs, one per WatchReq: streams[i] on the
 * i-th Watch, which it ends when asked for more (but on the last Watch).
 */
async function fakeBrain(def: grpc.ServiceDefinition, ...streams: Buffer[][][]): Promise<{ address: string; watches: () => number }> {
  const server = new grpc.Server();
  let watches = 0;
  server.addService(def, {
    Watch: (call: grpc.ServerDuplexStream<unknown, Buffer>) => {
      const diffs = streams[Math.min(watches++, streams.length - 1)];
      const last = watches >= streams.length;
      let n = 0;
      call.on('data', () => {
        if (n < diffs.length) for (const f of diffs[n++]) call.write(f);
        else if (!last) call.end();
      });
      call.on('error', () => {});
    },
  });
  const sock = join(dirs.make(), 'brain.sock');
  await new Promise<void>((res, rej) => server.bindAsync(`unix://${sock}`, grpc.ServerCredentials.createInsecure(), (e) => (e ? rej(e) : res())));
  stops.push(() => new Promise<void>((r) => server.tryShutdown(() => r())));
  return { address: `unix://${sock}`, watches: () => watches };
}

/** the warnings a bad op gives, one line each */
const ignoringLines = (text: string) => text.split('\n').filter((l) => /WARN|"level":40/.test(l) && l.includes('ignoring'));

/** each fragment in exactly one line, and as many lines as fragments: one line per bad op */
function assertOneLineEach(lines: string[], fragments: string[]) {
  for (const f of fragments) assert.equal(lines.filter((l) => l.includes(f)).length, 1, `one line with ${f}\n${lines.join('\n')}`);
  assert.equal(lines.length, fragments.length, `one line per bad op\n${lines.join('\n')}`);
}

const localNode = (ip: string) => toBinary(L.NodeSchema, create(L.NodeSchema, { Name: 'node-a', IPs: rawIPs(ip) }));
const localCIDR = (name: string, cidr: string) => toBinary(L.ServiceCIDRSchema, create(L.ServiceCIDRSchema, { Name: name, CIDRs: [cidr] }));
const withClusterIPs = (s: L.Service, ips: { V4?: string[]; V6?: string[] }) => create(L.ServiceSchema, { ...s, IPs: create(L.ServiceIPsSchema, { ClusterIPs: create(L.IPSetSchema, ips) }) });

test('kpng local: bad ops from a brain are logged once each, the rest applied, the last good values kept', { timeout: 60_000 }, async () => {
  const good = svc('demo', 'web', '10.96.0.10');
  const badProtocol = svc('demo', 'proto', '10.96.0.14');
  badProtocol.Ports[0].Protocol = 7 as Protocol;
  const brain = await fakeBrain(localServerDefinition, [
    [
      RESET,
      set(LocalSet.NodesSet, 'node-a', localNode('192.168.0.2')),
      set(LocalSet.ServiceCIDRsSet, 'default', localCIDR('default', '10.96.0.0/16')),
      set(LocalSet.ServicesSet, 'demo/web', svcBytes(good)),
      set(LocalSet.EndpointsSet, 'demo/web/p1', epBytes('10.244.1.10')),
      SYNC,
    ],
    [
      set(LocalSet.NodesSet, 'node-a', localNode('fe80::1%eth0')),
      set(LocalSet.ServiceCIDRsSet, 'default', localCIDR('default', 'nope')),
      set(LocalSet.ServiceCIDRsSet, 'other', localCIDR('another', '10.97.0.0/16')),
      set(LocalSet.ServicesSet, 'demo/web', svcBytes(svc('demo', 'web', '10.96.0.10', 70000))), // port out of range
      set(LocalSet.ServicesSet, 'demo/zoned', svcBytes(withClusterIPs(svc('demo', 'zoned', '10.96.0.12'), { V6: ['fd00::1%eth0'] }))),
      set(LocalSet.ServicesSet, 'demo/words', svcBytes(withClusterIPs(svc('demo', 'words', '10.96.0.12'), { V6: ['fd00:1:2:3:4:5:6:7:8'] }))),
      set(LocalSet.ServicesSet, 'demo/empty', svcBytes(withClusterIPs(svc('demo', 'empty', '10.96.0.12'), { V4: [''] }))),
      set(LocalSet.ServicesSet, 'demo/proto', svcBytes(badProtocol)),
      set(LocalSet.ServicesSet, 'demo/Bad_Name', svcBytes(svc('demo', 'Bad_Name', '10.96.0.13'))),
      set(LocalSet.ServicesSet, 'demo/elsewhere', svcBytes(svc('demo', 'moved', '10.96.0.15'))),
      set(LocalSet.ServicesSet, 'demo/garbage', new Uint8Array([0xff, 0xff, 0xff, 0xff, 0x0f])),
      set(LocalSet.EndpointsSet, 'demo/web/p1', toBinary(L.EndpointSchema, create(L.EndpointSchema, { IPs: rawIPs('10.244.1.0x') }))),
      set(LocalSet.EndpointsSet, 'demo/web/p2', toBinary(L.EndpointSchema, create(L.EndpointSchema, { IPs: rawIPs('10.244.1.11'), PortOverrides: [create(L.PortNameSchema, { Name: 'http', Port: 0 })] }))),
      set(LocalSet.EndpointsSet, 'not-a-path', epBytes('10.244.1.12')),
      set(LocalSet.EndpointsSet, 'Demo/web/p3', epBytes('10.244.1.13')),
      del(LocalSet.ServicesSet, 'no/such/path'),
      set(99 as LocalSet, 'demo/x', new Uint8Array()),
      del(98 as LocalSet, 'demo/y'),
      set(LocalSet.ServicesSet, 'demo/api', svcBytes(svc('demo', 'api', '10.96.0.20'))),
      set(LocalSet.EndpointsSet, 'demo/api/a1', epBytes('10.244.1.20')),
      SYNC,
    ],
    // the stream goes on
    [set(LocalSet.ServicesSet, 'demo/web', svcBytes(svc('demo', 'web', '10.96.0.10', 81))), SYNC],
  ]);
  const k = kpngSpawn(['local', '--api', brain.address, 'to-log', '--all-sets', '--node-name', 'node-a']);
  stops.push(() => k.stop());
  await k.until('three syncs', () => (k.stdout.match(/> sync/g) ?? []).length === 3, { timeoutMs: 20_000 });
  const diffs = k.stdout.split('> sync\n');
  assert.match(diffs[1], /\+ ServicesSet demo\/api /);
  assert.match(diffs[1], /\+ EndpointsSet demo\/api\/a1 /);
  // nothing bad reached the backend: the second diff is the good ops only
  assert.deepEqual(diffs[1].trim().split('\n').map((l) => l.split(' ').slice(0, 3).join(' ')), ['+ ServicesSet demo/api', '+ EndpointsSet demo/api/a1']);
  assert.match(diffs[2], /\+ ServicesSet demo\/web .*"Port":81/);
  assertOneLineEach(ignoringLines(k.stderr), [
    'NodesSet node-a (IPs.V4[0]: "fe80::1%eth0"',
    'ServiceCIDRsSet default (CIDRs[0]',
    'ServiceCIDRsSet other (Name "another" is not its path',
    'ServicesSet demo/web (Ports[0].Port',
    'demo/zoned (IPs.ClusterIPs.V6[0]: "fd00::1%eth0"',
    'demo/words (IPs.ClusterIPs.V6[0]',
    'demo/empty (IPs.ClusterIPs.V4[0]',
    'demo/proto (Ports[0].Protocol',
    '"demo/Bad_Name" (path (name)',
    'demo/elsewhere (Namespace/Name demo/moved is not its path',
    'demo/garbage (does not decode',
    'EndpointsSet demo/web/p1 (IPs.V4[0]',
    'demo/web/p2 (PortOverrides[0].Port',
    '"not-a-path" (path: not ns/name/key',
    '"Demo/web/p3" (path (namespace)',
    'Delete of ServicesSet "no/such/path" (path: not ns/name',
    'Set of 99 "demo/x" (set 99 is not a set of the node-local stream',
    'Delete of 98 "demo/y" (set 98',
  ]);
  assert.equal(brain.watches(), 1, 'no reconnect');
  assert.equal(k.process.exitCode, null);
});

test('kpng local: a bad value in the resend after a reconnect keeps the last good one (no Delete)', { timeout: 30_000 }, async () => {
  const brain = await fakeBrain(
    localServerDefinition,
    [[RESET, set(LocalSet.ServicesSet, 'demo/web', svcBytes(svc('demo', 'web', '10.96.0.10'))), set(LocalSet.EndpointsSet, 'demo/web/p1', epBytes('10.244.1.10')), SYNC]],
    [
      [
        RESET,
        set(LocalSet.ServicesSet, 'demo/web', svcBytes(svc('demo', 'web', '10.96.0.10', 70000))),
        set(LocalSet.EndpointsSet, 'demo/web/p1', epBytes('10.244.1.10')),
        set(LocalSet.ServicesSet, 'demo/api', svcBytes(svc('demo', 'api', '10.96.0.20'))),
        SYNC,
      ],
    ],
  );
  const { log, lines } = recordingLogger('warn');
  const seen: string[] = [];
  const backend = { send: (op: LocalOp) => void seen.push(describeOp(op)) };
  const ac = new AbortController();
  const done = watchLocalApi({ address: brain.address, log, signal: ac.signal, minBackoffMs: 20, maxBackoffMs: 100 }, 'node-a', [], new QuietResyncSink(new ValidatingSink(backend, log)));
  stops.push(() => (ac.abort(), done));
  await until('the resend', () => seen.filter((o) => o === 'sync').length === 2, { timeoutMs: 10_000 });
  assert.equal(brain.watches(), 2);
  assert.deepEqual(seen, ['reset', 'set ServicesSet demo/web', 'set EndpointsSet demo/web/p1', 'sync', 'set ServicesSet demo/api', 'sync']);
  assertOneLineEach(ignoringLines(lines.join('')), ['ServicesSet demo/web (Ports[0].Port']);
});

test('kpng api: bad values from a brain are logged once each, the rest stored, the last good values kept', { timeout: 30_000 }, async () => {
  const info = (s: L.Service) => toBinary(G.ServiceInfoSchema, create(G.ServiceInfoSchema, { Service: s }));
  const ep = (ip: string, ns = 'demo') =>
    toBinary(G.EndpointInfoSchema, create(G.EndpointInfoSchema, { Namespace: ns, SourceName: 'web-1', ServiceName: 'web', Endpoint: create(L.EndpointSchema, { IPs: rawIPs(ip) }) }));
  const nodeInfo = (ip: string) => toBinary(G.NodeInfoSchema, create(G.NodeInfoSchema, { Node: create(G.NodeSchema, { Name: 'node-a', IPs: rawIPs(ip) }) }));
  const cidrInfo = (cidr: string) => toBinary(G.ServiceCIDRInfoSchema, create(G.ServiceCIDRInfoSchema, { ServiceCIDR: create(L.ServiceCIDRSchema, { Name: 'default', CIDRs: [cidr] }) }));
  const brain = await fakeBrain(globalServerDefinition, [
    [
      RESET,
      set(LocalSet.GlobalNodeInfos, '|node-a||', nodeInfo('192.168.0.2')),
      set(LocalSet.GlobalServiceCIDRInfos, '|default||', cidrInfo('10.96.0.0/16')),
      set(LocalSet.GlobalServiceInfos, 'demo|web||', info(svc('demo', 'web', '10.96.0.10'))),
      set(LocalSet.GlobalEndpointInfos, 'demo||web-1|e1', ep('10.244.1.10')),
      SYNC,
    ],
    [
      RESET, // a resend: what is refused in it keeps its last good version, not a Delete
      set(LocalSet.GlobalNodeInfos, '|node-a||', nodeInfo('fe80::1%eth0')),
      set(LocalSet.GlobalNodeInfos, '|node-b||', toBinary(G.NodeInfoSchema, create(G.NodeInfoSchema))), // no Node in it
      set(LocalSet.GlobalServiceCIDRInfos, '|default||', cidrInfo('10.96.0.0/99')),
      set(LocalSet.GlobalServiceInfos, 'demo|web||', info(svc('demo', 'web', '10.96.0.10', 0))),
      set(LocalSet.GlobalEndpointInfos, 'demo||web-1|e1', ep('fd00::1%eth0')),
      set(LocalSet.GlobalEndpointInfos, 'demo||web-1|e2', ep('10.244.1.11', 'other')),
      set(LocalSet.GlobalServiceInfos, 'demo|api||', info(svc('demo', 'api', '10.96.0.20'))),
      set(LocalSet.GlobalServiceInfos, 'demo|junk||', new Uint8Array([0x0a, 0xff])),
      set(LocalSet.GlobalServiceInfos, 'demo|elsewhere||', info(svc('demo', 'moved', '10.96.0.21'))),
      set(LocalSet.GlobalServiceInfos, 'bad-path', info(svc('demo', 'x', '10.96.0.30'))),
      set(LocalSet.GlobalServiceInfos, 'Demo|x||', info(svc('Demo', 'x', '10.96.0.30'))),
      set(99 as LocalSet, 'demo|x||', new Uint8Array()),
      del(LocalSet.GlobalServiceInfos, 'demo|web'),
      SYNC,
    ],
    // the stream goes on
    [set(LocalSet.GlobalServiceInfos, 'demo|api||', info(svc('demo', 'api', '10.96.0.20', 81))), SYNC],
  ]);
  const { log, lines } = recordingLogger('warn');
  const store = new Store();
  const src = new ApiSource(store, log, { address: brain.address });
  src.start();
  stops.push(() => src.stop());
  await until('three diffs', () => src.applied === 3, { timeoutMs: 10_000 }).catch(() => assert.fail(`${src.applied} diffs applied\n${lines.join('')}`));
  assert.equal(store.getService('demo/api')!.service.Ports[0].Port, 81);
  assert.equal(store.getService('demo/web')!.service.Ports[0].Port, 80);
  assert.deepEqual(store.slicesOfService('demo/web')[0]?.endpoints.map((e) => e.Endpoint?.IPs?.V4[0]), ['10.244.1.10']);
  assert.deepEqual(store.getNode('node-a')?.node.IPs?.V4, ['192.168.0.2']);
  assert.equal(store.getNode('node-b'), undefined);
  assert.deepEqual(store.serviceCIDRs().map((c) => c.cidr.CIDRs), [['10.96.0.0/16']]);
  for (const k of ['demo/junk', 'demo/elsewhere', 'demo/moved', 'demo/x', 'Demo/x']) assert.equal(store.getService(k), undefined, k);
  assertOneLineEach(ignoringLines(lines.join('')), [
    'Node node-a (IPs.V4[0]: \\"fe80::1%eth0\\"',
    'Node node-b (no value',
    'ServiceCIDR default (CIDRs[0]',
    'Service demo/web (Ports[0].Port',
    'endpoint e1 of EndpointSlice demo/web-1 (IPs.V4[0]: \\"fd00::1%eth0\\"',
    'endpoint e2 of EndpointSlice demo/web-1 (Namespace \\"other\\"',
    'Service demo/junk (does not decode',
    'Service demo/elsewhere (Namespace/Name \\"demo/moved\\"',
    '\\"bad-path\\" (path: not ns|name|source|key',
    '\\"Demo|x||\\" (path (namespace)',
    'Set of 99 \\"demo|x||\\" (set 99 is not a set of the global stream',
    'Delete of GlobalServiceInfos \\"demo|web\\" (path: not',
  ]);
  assert.equal(brain.watches(), 1, 'no reconnect');
});
