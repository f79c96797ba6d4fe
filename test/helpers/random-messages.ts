// Random messages for the hand-written protobuf codecs' tests (fast-decode,
// fast-encode, the store's slice encoder), compared with protobuf-es: every
// field, empty and odd values, unicode, long strings, int32 extremes and
// negatives, 64-bit hashes, maps with many keys (integer-like ones too,
// which JavaScript puts first), every oneof case. Seeded: a failure repeats.
import { create } from '@bufbuild/protobuf';
import { EndpointInfoSchema, type EndpointInfo } from '../../src/api/gen/api/globalv1/api_pb.js';
import { EndpointSchema, ServiceSchema, type Endpoint, type Service } from '../../src/api/gen/api/localv1/api_pb.js';

export function randomMessages(seed: number) {
  const rnd = (n: number) => ((seed = (seed * 1103515245 + 12345) % 2 ** 31), seed % n);
  const str = () => ['', 'a', 'pod-0123456789', 'é-ü-ñ-中', '😀', 'x'.repeat(300)][rnd(6)];
  const strs = () => Array.from({ length: rnd(3) }, str);
  const int32 = () => [0, 0, 1, 127, 128, 8080, 30000, 65535, 300000, -1, -2147483648, 2147483647][rnd(12)];
  const ipSet = () => ({ V4: Array.from({ length: rnd(3) }, () => `10.${rnd(256)}.${rnd(256)}.${rnd(256)}`), V6: Array.from({ length: rnd(3) }, () => `fd00::${rnd(65536).toString(16)}`) });
  const maybeIPSet = () => (rnd(3) ? ipSet() : undefined);
  const key = () => ['', 'app', 'k8s.io/name', '0', '7', '10', '-1', '01', 'é', 'x'.repeat(200), `k${rnd(1000)}`][rnd(11)];
  const map = () => {
    const m: { [key: string]: string } = {};
    const n = [0, 0, 1, 2, 3, 5, 40][rnd(7)];
    for (let i = 0; i < n; i++) m[key()] = rnd(20) ? str() : 'v'.repeat(20_000);
    return m;
  };
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
    service: (): Service =>
      create(ServiceSchema, {
        Namespace: str(),
        Name: str(),
        Type: ['', 'ClusterIP', 'NodePort', 'LoadBalancer', 'ExternalName', str()][rnd(6)],
        Labels: map(),
        Annotations: map(),
        IPs: rnd(5) ? { ClusterIPs: maybeIPSet(), ExternalIPs: maybeIPSet(), LoadBalancerIPs: maybeIPSet(), Headless: !!rnd(2), ProxyLoadBalancerIPs: maybeIPSet() } : undefined,
        IPFilters: Array.from({ length: rnd(3) }, () => ({ TargetIPs: maybeIPSet(), SourceRanges: Array.from({ length: rnd(3) }, () => ['', '0.0.0.0/0', '10.0.0.0/8', 'fd00::/64'][rnd(4)]) })),
        MapIP: !!rnd(2),
        Ports: Array.from({ length: rnd(5) }, () => ({
          Name: str(),
          Protocol: rnd(5),
          Port: int32(),
          NodePort: int32(),
          TargetPort: int32(),
          TargetPortName: str(),
          HasEndpointsV4: !!rnd(2),
          HasEndpointsV6: !!rnd(2),
        })),
        ExternalTrafficToLocal: !!rnd(2),
        SessionAffinity: rnd(2) ? { case: 'ClientIP', value: { TimeoutSeconds: int32() } } : { case: undefined },
        InternalTrafficToLocal: !!rnd(2),
        HealthCheckNodePort: int32(),
        TrafficDistribution: ['', 'PreferClose', 'PreferSameZone', 'PreferSameNode', str()][rnd(5)],
      }),
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
