// Endpoint selection for one service port and one IP family, as upstream
// kube-proxy's CategorizeEndpoints (pkg/proxy/topology.go) does it.
import type { EndpointInfo } from '../api/gen/api/globalv1/api_pb.js';

export interface Candidate {
  readonly info: EndpointInfo;
  readonly ip: string;
  /** the endpoint (target) port for this service port */
  readonly port: number;
  readonly local: boolean;
}

export interface NodeContext {
  readonly name: string;
  /** topology.kubernetes.io/zone of the node, '' when unknown */
  readonly zone: string;
}

export type TopologyMode = '' | 'PreferSameNode' | 'PreferSameZone';

export interface Categorized {
  /** what policy Cluster uses (undefined when the service never uses it) */
  readonly cluster?: readonly Candidate[];
  /** what policy Local uses (undefined when the service never uses it) */
  readonly local?: readonly Candidate[];
  /** a usable (ready, or serving and terminating) endpoint exists anywhere */
  readonly hasAny: boolean;
  readonly topology: TopologyMode;
}

const ready = (c: Candidate) => c.info.Conditions?.Ready ?? true;
const servingTerminating = (c: Candidate) => (c.info.Conditions?.Serving ?? true) && (c.info.Conditions?.Terminating ?? false);

/**
 * Hints are honoured only if every ready endpoint carries them and one of them
 * names this node (or its zone); otherwise they are ignored entirely.
 */
export function topologyMode(cands: readonly Candidate[], node: NodeContext): TopologyMode {
  let allNode = true;
  let hasNode = false;
  let allZone = true;
  let hasZone = false;
  for (const c of cands) {
    if (!ready(c)) continue;
    const h = c.info.Hints;
    if (!h || h.Nodes.length === 0) allNode = false;
    else if (node.name !== '' && h.Nodes.includes(node.name)) hasNode = true;
    if (!h || h.Zones.length === 0) allZone = false;
    else if (node.zone !== '' && h.Zones.includes(node.zone)) hasZone = true;
  }
  if (allNode && hasNode) return 'PreferSameNode';
  if (allZone && hasZone) return 'PreferSameZone';
  return '';
}

function availableForTopology(c: Candidate, mode: TopologyMode, node: NodeContext): boolean {
  switch (mode) {
    case '': return true;
    case 'PreferSameNode': return c.info.Hints?.Nodes.includes(node.name) ?? false;
    case 'PreferSameZone': return c.info.Hints?.Zones.includes(node.zone) ?? false;
  }
}

export function categorize(
  cands: readonly Candidate[],
  node: NodeContext,
  usesCluster: boolean,
  usesLocal: boolean,
): Categorized {
  let cluster: Candidate[] | undefined;
  let hasAny = false;
  let mode: TopologyMode = '';
  if (usesCluster) {
    mode = topologyMode(cands, node);
    cluster = cands.filter((c) => ready(c) && availableForTopology(c, mode, node));
    // No ready endpoint for this topology means no ready endpoint at all
    // (topology is ignored when nothing matches): fall back to terminating ones.
    if (cluster.length === 0) cluster = cands.filter(servingTerminating);
    if (cluster.length > 0) hasAny = true;
  }
  if (!usesLocal) return { cluster, hasAny, topology: mode };

  let localReady = false;
  let localServingTerminating = false;
  for (const c of cands) {
    if (ready(c)) {
      hasAny = true;
      if (c.local) localReady = true;
    } else if (servingTerminating(c)) {
      hasAny = true;
      if (c.local) localServingTerminating = true;
    }
  }
  let local: Candidate[] = [];
  if (localReady) local = cands.filter((c) => c.local && ready(c));
  else if (localServingTerminating) local = cands.filter((c) => c.local && servingTerminating(c));
  return { cluster, local, hasAny, topology: mode };
}

export function isReady(c: Candidate): boolean {
  return ready(c);
}
