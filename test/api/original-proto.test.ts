// A client generated from the ORIGINAL kpng .proto files (verbatim in
// test/fixtures/kpng-original, loaded with @grpc/proto-loader as any grpc-js
// user of kpng would) works unchanged: it reaches /localv1.Sets/Watch and
// /globalv1.Sets/Watch, decodes every value with the original types, and
// never gets a set it does not know.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import protobuf from 'protobufjs';
import { LocalSet } from '../../src/api/model.js';
import { create } from '@bufbuild/protobuf';
import { WatchReqSchema } from '../../src/api/gen/api/localv1/api_pb.js';
import { localWatchMethod } from '../../src/api/grpc/wire.js';
import { TRANSPORTS, ORIGINAL_PROTO_DIR, RawWatch, apply, listenAddress, slice, smallCluster, startServer, syncedStore, testResources } from './helpers.js';
import { grpcTarget, parseAddress } from '../../src/api/grpc/address.js';
import { until } from '../helpers/until.js';

const { dirs, cleanups } = testResources();

const loaderOpts = { keepCase: true, longs: String, enums: String, defaults: true, oneofs: true, includeDirs: [ORIGINAL_PROTO_DIR] };
const def = protoLoader.loadSync(['api/localv1/api.proto', 'api/globalv1/api.proto'], loaderOpts);
const pkg = grpc.loadPackageDefinition(def) as any;

// the same files as protobufjs types, to decode Value.Bytes
const root = new protobuf.Root();
root.resolvePath = (_origin, target) => join(ORIGINAL_PROTO_DIR, target);
root.loadSync(['api/localv1/api.proto', 'api/globalv1/api.proto'], { keepCase: true });
const decode = (type: string, b: Uint8Array) => root.lookupType(type).toObject(root.lookupType(type).decode(b), { longs: String, enums: String, defaults: true }) as any;

interface Item {
  Op: 'Sync' | 'Reset' | 'Set' | 'Delete';
  Set?: { Ref: { Set: string; Path: string }; Bytes: Buffer };
  Delete?: { Set: string; Path: string };
}

function originalWatch(Client: any, address: string, request: object) {
  const client = new Client(grpcTarget(parseAddress(address)), grpc.credentials.createInsecure());
  const call = client.Watch();
  const items: Item[] = [];
  let error: Error | undefined;
  call.on('data', (i: Item) => items.push(i));
  call.on('error', (e: Error) => (error = e));
  call.write(request);
  const close = () => (call.cancel(), client.close());
  cleanups.push(close);
  return { call, items, syncs: () => items.filter((i) => i.Op === 'Sync').length, error: () => error };
}

for (const t of TRANSPORTS) {
  test(`an original localv1 client watches its node (${t})`, async () => {
    const store = syncedStore([...smallCluster(), { apiVersion: 'networking.k8s.io/v1', kind: 'ServiceCIDR', metadata: { name: 'kubernetes' }, spec: { cidrs: ['10.96.0.0/16'] } }]);
    const s = await startServer(store, listenAddress(t, dirs));
    cleanups.push(() => s.stop());
    const w = originalWatch(pkg.localv1.Sets, s.address, { NodeName: 'node-a' });
    await until('the first sync', () => w.syncs() === 1 || !!w.error());
    assert.equal(w.error(), undefined);
    assert.equal(w.items[0].Op, 'Reset');
    assert.equal(w.items.at(-1)!.Op, 'Sync');
    const sets = w.items.filter((i) => i.Op === 'Set').map((i) => i.Set!);
    // only the sets the original knows (no NodesSet / ServiceCIDRsSet: it cannot ask)
    assert.deepEqual([...new Set(sets.map((v) => v.Ref.Set))], ['ServicesSet', 'EndpointsSet']);
    const web = decode('localv1.Service', sets.find((v) => v.Ref.Path === 'ns/web')!.Bytes);
    assert.equal(web.Namespace, 'ns');
    assert.equal(web.Name, 'web');
    assert.equal(web.Type, 'ClusterIP');
    assert.deepEqual(web.IPs.ClusterIPs.V4, ['10.96.0.10']);
    assert.deepEqual(web.Ports.map((p: any) => [p.Name, p.Protocol, p.Port, p.TargetPort]), [['http', 'TCP', 80, 8080]]);
    const ep = decode('localv1.Endpoint', sets.find((v) => v.Ref.Path === 'ns/web/web-a')!.Bytes);
    assert.deepEqual(ep.IPs.V4, ['10.1.0.1']);
    assert.equal(ep.Local, true);
    assert.deepEqual(ep.PortOverrides.map((p: any) => [p.Name, p.Port]), [['http', 8080]]);
    assert.deepEqual([ep.Scopes.Internal, ep.Scopes.External], [true, true]);

    // kpng's flow control: the next request gets the next diff
    apply(store, slice('ns', 'web-1', 'web', [{ ip: '10.1.0.1', node: 'node-a', pod: 'web-a' }]));
    await new Promise((r) => setTimeout(r, 50));
    assert.equal(w.syncs(), 1, 'no diff before the client asks');
    w.call.write({ NodeName: 'node-a' });
    await until('the second sync', () => w.syncs() === 2 || !!w.error());
    const d2 = w.items.slice(w.items.findIndex((i) => i.Op === 'Sync') + 1);
    assert.deepEqual(d2.map((i) => (i.Op === 'Delete' ? `delete ${i.Delete!.Set} ${i.Delete!.Path}` : i.Op)), ['delete EndpointsSet ns/web/web-b', 'Sync']);
  });

  test(`an original globalv1 client gets kpng's global sets only (${t})`, async () => {
    const store = syncedStore([...smallCluster(), { apiVersion: 'networking.k8s.io/v1', kind: 'ServiceCIDR', metadata: { name: 'kubernetes' }, spec: { cidrs: ['10.96.0.0/16'] } }]);
    const s = await startServer(store, listenAddress(t, dirs));
    cleanups.push(() => s.stop());
    const w = originalWatch(pkg.globalv1.Sets, s.address, {});
    await until('the first sync', () => w.syncs() === 1 || !!w.error());
    assert.equal(w.error(), undefined);
    const sets = w.items.filter((i) => i.Op === 'Set').map((i) => i.Set!);
    assert.deepEqual([...new Set(sets.map((v) => v.Ref.Set))], ['GlobalNodeInfos', 'GlobalServiceInfos', 'GlobalEndpointInfos']);
    const n = decode('globalv1.NodeInfo', sets.find((v) => v.Ref.Path === '|node-a||')!.Bytes);
    assert.equal(n.Node.Name, 'node-a');
    assert.equal(n.Node.Topology.Zone, 'z1');
    assert.notEqual(n.Hash, '0');
    const si = decode('globalv1.ServiceInfo', sets.find((v) => v.Ref.Path === 'ns|db||')!.Bytes);
    assert.equal(si.Service.Name, 'db');
    for (const v of sets.filter((x) => x.Ref.Set === 'GlobalEndpointInfos')) {
      const e = decode('globalv1.EndpointInfo', v.Bytes);
      const [ns, , sl, key] = v.Ref.Path.split('|');
      assert.equal(BigInt(e.Hash).toString(16), key);
      assert.deepEqual([e.Namespace, e.SourceName], [ns, sl]);
      assert.equal(e.Conditions.Ready, true);
    }
    assert.equal(LocalSet[LocalSet.GlobalServiceCIDRInfos], 'GlobalServiceCIDRInfos');
  });
}

test('an original localv1 client still gets Reset and the full state from a brain that resumes kpng-ts clients', async () => {
  const store = syncedStore(smallCluster());
  const s = await startServer(store, listenAddress('unix', dirs));
  cleanups.push(() => s.stop());
  // a kpng-ts node that holds something else (16 buckets of zero digests): it gets a Resume
  const resuming = new RawWatch(s.address, localWatchMethod, create(WatchReqSchema, { NodeName: 'node-a', HeldDigests: new Uint8Array(16 * 8) }));
  cleanups.push(() => resuming.close());
  await resuming.waitSyncs(1);
  assert.equal(resuming.items[0].Op.case, 'Resume');
  const w = originalWatch(pkg.localv1.Sets, s.address, { NodeName: 'node-a' });
  await until('the first sync', () => w.syncs() === 1 || !!w.error());
  assert.equal(w.error(), undefined);
  assert.deepEqual(w.items.map((i) => i.Op), ['Reset', 'Set', 'Set', 'Set', 'Set', 'Set', 'Sync']);
});
