// Legal but extreme Kubernetes objects: the longest names the API server
// accepts, every protocol, IPv6 edge forms, many ports and endpoints. Every
// backend must program all of them (issue 19: one such Service froze a node).
import { node, service, slice, type EndpointSpec } from './k8s.js';
import { canonicalIP } from '../../src/api/ip.js';

type Obj = Record<string, any>;

/** a DNS label of exactly n characters (n <= 63) */
export const label = (stem: string, n = 63) => (stem + '-' + 'x'.repeat(63)).slice(0, n - 1) + '9';

export interface Extreme {
  readonly objects: Obj[];
  /** "ns/name" -> the service IPs (cluster, external, LB; canonical) that must be programmed */
  readonly expect: Map<string, string[]>;
}

export function extremeCluster(): Extreme {
  const objects: Obj[] = [node('n1', 'z1', ['192.168.0.2', 'fd00::2'])];
  const expect = new Map<string, string[]>();
  const add = (ns: string, name: string, spec: Obj, status: Obj = {}, slices: Obj[] = []) => {
    objects.push(service(ns, name, spec, { status }), ...slices);
    const ips = [...(spec.clusterIPs ?? [spec.clusterIP]), ...(spec.externalIPs ?? []), ...(status.loadBalancer?.ingress ?? []).map((i: Obj) => i.ip)];
    expect.set(`${ns}/${name}`, ips.map((ip) => canonicalIP(ip)!));
  };
  // the longest names: 63-character namespace, name and port names, every protocol
  const ns = label('ns');
  const name = label('svc');
  const ports = ['TCP', 'UDP', 'SCTP'].map((protocol, i) => ({ name: label(`p${protocol.toLowerCase()}`), port: 65535 - i, protocol, targetPort: 65535 - i, nodePort: 32767 - i }));
  add(
    ns,
    name,
    {
      type: 'LoadBalancer',
      clusterIP: '172.30.1.1',
      ports,
      externalIPs: ['198.51.100.1'],
      loadBalancerSourceRanges: ['203.0.113.0/24', '0.0.0.0/0'],
      externalTrafficPolicy: 'Local',
      healthCheckNodePort: 32000,
      sessionAffinity: 'ClientIP',
      sessionAffinityConfig: { clientIP: { timeoutSeconds: 86400 } },
    },
    { loadBalancer: { ingress: [{ ip: '198.51.100.2' }] } },
    [slice(ns, label('slice', 63), name, [{ ip: '10.1.1.1', node: 'n1', pod: label('pod') }, { ip: '10.2.1.1', node: 'n2' }], ports.map((p) => ({ name: p.name, port: p.targetPort, protocol: p.protocol })))],
  );
  // IPv6 edge forms: all-ones, a zero run in the middle, an address ending in zeros
  const v6ports = [{ name: 'http', port: 80, protocol: 'TCP', nodePort: 30080 }];
  add(
    'v6',
    'edges',
    { type: 'NodePort', clusterIP: 'fd00:ffff:ffff:ffff:ffff:ffff:ffff:fffe', ipFamilies: ['IPv6'], ports: v6ports, externalIPs: ['2001:db8:0:0:1:0:0:1'] },
    {},
    [slice('v6', 'edges-1', 'edges', [{ ip: '2001:db8::' }, { ip: 'fd00:0:0:1::1', node: 'n1' }, { ip: '2001:DB8:0:0:0:0:0:2' }], [{ name: 'http', port: 8080 }])],
  );
  // an IPv4-mapped endpoint address is IPv4 for Kubernetes
  add('v4', 'mapped', { clusterIP: '172.30.1.3' }, {}, [slice('v4', 'mapped-1', 'mapped', [{ ip: '::ffff:10.1.1.3' } as EndpointSpec], [{ name: 'http', port: 8080 }], { addressType: 'IPv4' })]);
  // many ports, many endpoints
  const many = Array.from({ length: 100 }, (_, i) => ({ name: `p${i}`, port: 1000 + i, protocol: i % 2 ? 'UDP' : 'TCP' }));
  const eps = (n: number): EndpointSpec[] => Array.from({ length: n }, (_, i) => ({ ip: `10.3.${i >> 7}.${(i & 127) + 1}`, node: i % 3 ? 'n2' : 'n1' }));
  add('many', 'ports', { clusterIP: '172.30.1.4', ports: many }, {}, [slice('many', 'ports-1', 'ports', eps(8), many.map((p) => ({ name: p.name, port: p.port + 1000, protocol: p.protocol })))]);
  add('many', 'endpoints', { clusterIP: '172.30.1.8' }, {}, [slice('many', 'endpoints-1', 'endpoints', eps(500), [{ name: 'http', port: 8080 }])]);
  // dual-stack, headless-adjacent: no ports at all, and no endpoints
  add('edge', 'noports', { clusterIP: '172.30.1.5', ports: [] });
  expect.set('edge/noports', []); // nothing to program
  add('edge', 'noendpoints', { type: 'NodePort', clusterIP: '172.30.1.6', ports: [{ name: '', port: 1, protocol: 'UDP', nodePort: 30000 }] });
  // a plain one, which must keep working beside the others
  add('plain', 'web', { clusterIP: '172.30.1.7' }, {}, [slice('plain', 'web-1', 'web', [{ ip: '10.1.1.7', node: 'n1' }])]);
  return { objects, expect };
}
