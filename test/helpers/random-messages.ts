// Random messages for the hand-written protobuf codecs' tests (fast-decode,
// fast-encode, the store's slice encoder), compared with protobuf-es: every
// field, empty and odd values, unicode, long strings, int32 extremes and
// negatives, 64-bit hashes. Seeded: a failure repeats.
import { create } from '@bufbuild/protobuf';
import { EndpointInfoSchema, type EndpointInfo } from '../../src/api/gen/api/globalv1/api_pb.js';
import { EndpointSchema, type Endpoint } from '../../src/api/gen/api/localv1/api_pb.js';

export function randomMessages(seed: number) {
  const rnd = (n: number) => ((seed = (seed * 1103515245 + 12345) % 2 ** 31), seed % n);
  const str = () => ['', 'a', 'pod-0123456789', 'é-ü-ñ-中', '😀', 'x'.repeat(300)][rnd(6)];
  const strs = () => Array.from({ length: rnd(3) }, str);
  const endpointFields = () => ({
    Hostname: str(),
    IPs: rnd(4) ? { V4: Array.from({ length: rnd(3) }, () => `10.${rnd(256)}.${rnd(256)}.${rnd(256)}`), V6: Array.from({ length: rnd(2) }, () => `fd00::${rnd(65536).toString(16)}`) } : undefined,
    Local: !!rnd(2),
    PortOverrides: Array.from({ length: rnd(4) }, () => ({ Name: str(), Port: [0, 1, 127, 128, 8080, 65535, 300000, -1, -2147483648, 2147483647][rnd(10)], Protocol: rnd(5) })),
    Scopes: rnd(3) ? { Internal: !!rnd(2), External: !!rnd(2), Cluster: !!rnd(2) } : undefined,
    Terminating: !!rnd(2),
    NodeName: str(),
  });
  return {
    rnd,
    str,
    endpoint: (): Endpoint => create(EndpointSchema, endpointFields()),
    endpointInfo: (): EndpointInfo =>
      create(EndpointInfoSchema, {
        Hash: [0n, 0n, 0n, 1n, 127n, 128n, 2n ** 32n - 1n, 2n ** 32n, 2n ** 63n + 5n, 2n ** 64n - 1n][rnd(10)],
        Namespace: str(),
        SourceName: str(),
        ServiceName: str(),
        PodName: str(),
        Endpoint: rnd(5) ? endpointFields() : undefined,
        Conditions: rnd(4) ? { Ready: !!rnd(2), Serving: !!rnd(2), Terminating: !!rnd(2) } : undefined,
        Topology: rnd(4) ? { Node: str(), Zone: str() } : undefined,
        Hints: rnd(3) ? { Zones: strs(), Nodes: strs() } : undefined,
      }),
  };
}
