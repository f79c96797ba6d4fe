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
import { Writable } from 'node:stream';
import { join } from 'node:path';
import { pino } from 'pino';
import * as L from '../../src/api/gen/api/localv1/api_pb.js';
import * as G from '../../src/api/gen/api/globalv1/api_pb.js';
import { LocalSet, Protocol, newIPSet } from '../../src/api/model.js';
import { localServerDefinition, globalServerDefinition } from '../../src/api/grpc/wire.js';
import { ApiSource } from '../../src/sources/api/index.js';
import { Store } from '../../src/store/store.js';
import { kpngSpawn } from '../helpers/cli.js';
import { TempDirs, waitFor } from './helpers.js';

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

/** a brain that sends each watcher the scripted diffs, one per WatchReq */
async function fakeBrain(def: grpc.ServiceDefinition, diffs: Buffer[][]): Promise<{ address: string; watches: () => number }> {
  const server = new grpc.Server();
  let watches = 0;
  server.addService(def, {
    Watch: (call: grpc.ServerDuplexStream<unknown, Buffer>) => {
      watches++;
      let n = 0;
      call.on('data', () => {
        for (const f of diffs[n++] ?? []) call.write(f);
      });
      call.on('error', () => {});
    },
  });
  const sock = join(dirs.make(), 'brain.sock');
  await new Promise<void>((res, rej) => server.bindAsync(`unix://${sock}`, grpc.ServerCredentials.createInsecure(), (e) => (e ? rej(e) : res())));
  stops.push(() => new Promise<void>((r) => server.tryShutdown(() => r())));
  return { address: `unix://${sock}`, watches: () => watches };
}

test('kpng local: bad ops from a brain are logged once each, the rest applied, the last good values kept', { timeout: 60_000 }, async () => {
  const good = svc('demo', 'web', '10.96.0.10');
  const brain = await fakeBrain(localServerDefinition, [
    [RESET, set(LocalSet.ServicesSet, 'demo/web', svcBytes(good)), set(LocalSet.EndpointsSet, 'demo/web/p1', epBytes('10.244.1.10')), SYNC],
    [
      set(LocalSet.ServicesSet, 'demo/web', svcBytes(svc('demo', 'web', '10.96.0.10', 70000))), // port out of range
      set(LocalSet.ServicesSet, 'demo/zoned', svcBytes(create(L.ServiceSchema, { ...svc('demo', 'zoned', '10.96.0.12'), IPs: create(L.ServiceIPsSchema, { ClusterIPs: create(L.IPSetSchema, { V6: ['fd00::1%eth0'] }) }) }))),
      set(LocalSet.ServicesSet, 'demo/Bad_Name', svcBytes(svc('demo', 'Bad_Name', '10.96.0.13'))),
      set(LocalSet.ServicesSet, 'demo/garbage', new Uint8Array([0xff, 0xff, 0xff, 0xff, 0x0f])),
      set(LocalSet.EndpointsSet, 'demo/web/p1', toBinary(L.EndpointSchema, create(L.EndpointSchema, { IPs: rawIPs('10.244.1.0x') }))),
      set(LocalSet.EndpointsSet, 'not-a-path', epBytes('10.244.1.12')),
      del(LocalSet.ServicesSet, 'no/such/path'), // nothing the node has: dropped before anything looks at it
      set(99 as LocalSet, 'demo/x', new Uint8Array()), // a set this side does not know
      set(LocalSet.ServicesSet, 'demo/api', svcBytes(svc('demo', 'api', '10.96.0.20'))),
      SYNC,
    ],
  ]);
  const k = kpngSpawn(['local', '--api', brain.address, 'to-log', '--node-name', 'node-a']);
  stops.push(() => k.stop());
  await k.until(() => (k.stdout.match(/> sync/g) ?? []).length === 2, 'two syncs', 20_000);
  const out = k.stdout;
  assert.match(out, /\+ ServicesSet demo\/api/);
  assert.doesNotMatch(out, /demo\/zoned|Bad_Name|garbage|70000|10\.244\.1\.0x|not-a-path/);
  // the last good value of web stays: no second Set, no Delete
  assert.equal((out.match(/\+ ServicesSet demo\/web /g) ?? []).length, 1);
  assert.doesNotMatch(out, /- ServicesSet demo\/web|- EndpointsSet demo\/web\/p1/);
  for (const what of ['demo/web (Ports[0].Port', 'demo/zoned (IPs.ClusterIPs.V6[0]', 'demo/Bad_Name (Name', 'demo/garbage (does not decode', 'demo/web/p1 (IPs.V4[0]', 'not-a-path (the path is not ns/name/key']) {
    assert.equal(k.stderr.split(what).length - 1, 1, `${what}: one line\n${k.stderr}`);
  }
  assert.equal(brain.watches(), 1, 'no reconnect');
  assert.equal(k.process.exitCode, null);
});

test('kpng api: bad values from a brain are logged once each, the rest stored, the last good values kept', { timeout: 30_000 }, async () => {
  const info = (s: L.Service) => toBinary(G.ServiceInfoSchema, create(G.ServiceInfoSchema, { Service: s }));
  const ep = (ip: string) =>
    toBinary(G.EndpointInfoSchema, create(G.EndpointInfoSchema, { Namespace: 'demo', SourceName: 'web-1', ServiceName: 'web', Endpoint: create(L.EndpointSchema, { IPs: rawIPs(ip) }) }));
  const gset = (s: LocalSet, path: string, bytes: Uint8Array) => set(s, path, bytes);
  const brain = await fakeBrain(globalServerDefinition, [
    [RESET, gset(LocalSet.GlobalServiceInfos, 'demo|web||', info(svc('demo', 'web', '10.96.0.10'))), gset(LocalSet.GlobalEndpointInfos, 'demo||web-1|e1', ep('10.244.1.10')), SYNC],
    [
      RESET, // a resend: what is refused in it keeps its last good version, not a Delete
      gset(LocalSet.GlobalServiceInfos, 'demo|web||', info(svc('demo', 'web', '10.96.0.10', 0))),
      gset(LocalSet.GlobalEndpointInfos, 'demo||web-1|e1', ep('fd00::1%eth0')),
      gset(LocalSet.GlobalServiceInfos, 'demo|api||', info(svc('demo', 'api', '10.96.0.20'))),
      gset(LocalSet.GlobalServiceInfos, 'demo|junk||', new Uint8Array([0x0a, 0xff])),
      gset(LocalSet.GlobalServiceInfos, 'bad-path', info(svc('demo', 'x', '10.96.0.30'))),
      SYNC,
    ],
  ]);
  const lines: string[] = [];
  const store = new Store();
  const src = new ApiSource(store, pino({ level: 'warn' }, new Writable({ write: (c, _e, cb) => (lines.push(String(c)), cb()) })), { address: brain.address });
  src.start();
  stops.push(() => src.stop());
  await waitFor('the first diff', () => !!store.getService('demo/web'), 10_000);
  // ask for the next diff (a reconnect resends everything: here the script's second diff)
  await waitFor('the second diff', () => !!store.getService('demo/api'), 10_000).catch(() => {});
  if (!store.getService('demo/api')) return assert.fail(`the second diff was not applied\n${lines.join('')}`);
  assert.equal(store.getService('demo/web')!.service.Ports[0].Port, 80);
  assert.deepEqual(store.slicesOfService('demo/web')[0]?.endpoints.map((e) => e.Endpoint?.IPs?.V4[0]), ['10.244.1.10']);
  assert.equal(store.getService('demo/junk'), undefined);
  for (const what of ['Service demo/web', 'EndpointSlice demo/web-1', 'Service demo/junk', 'bad-path']) assert.equal(lines.join('').split(what).length - 1, 1, `${what}\n${lines.join('')}`);
  assert.equal(brain.watches(), 1, 'no reconnect');
});
