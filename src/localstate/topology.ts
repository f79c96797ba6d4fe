// Endpoint selection for one service port and one IP family, as upstream
// kube-proxy's CategorizeEndpoints (pkg/proxy/topology.go) does it.
import type { EndpointConditions, TopologyHints, TopologyInfo } from '../api/gen/api/globalv1/api_pb.js';

/** what endpoint selection reads of an endpoint: an EndpointInfo's fields, or the same scanned from its bytes (ScannedEndpoint) */
export interface EndpointFacts {
  readonly PodName: string;
  readonly Conditions?: EndpointConditions;
  readonly Hints?: TopologyHints;
  readonly Topology?: TopologyInfo;
  readonly Endpoint?: { readonly Hostname: string };
}

export interface Candidate {
  readonly info: EndpointFacts;
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

/** Whether one endpoint is used for a kind of traffic on a node, and why (or why not). */
export interface Use {
  readonly used: boolean;
  readonly why: string;
}

/**
 * Why categorize() took or left each candidate, for the list a policy uses
 * (Cluster: the cluster-wide list, Local: this node's), in kpng get's words.
 * It calls categorize itself and reads its result: the reasons are the
 * selection the dataplane gets, explained with the same predicates.
 */
export function explainCategorized(cands: readonly Candidate[], node: NodeContext, itpLocal: boolean, etpLocal: boolean): { internal: Use; external: Use }[] {
  // the cluster-wide list is always computed here: what Cluster would use is shown even when unused
  const cat = categorize(cands, node, true, itpLocal || etpLocal);
  const inCluster = new Set(cat.cluster ?? []);
  const inLocal = new Set(cat.local ?? []);
  const anyReady = (list: readonly Candidate[]) => list.some(ready);
  const hintWords = (c: Candidate) => {
    const h = c.info.Hints;
    if (cat.topology === 'PreferSameNode') return `hinted for node${(h?.Nodes.length ?? 0) > 1 ? 's' : ''} ${h?.Nodes.join(', ') || '(none)'}`;
    return `hinted for zone${(h?.Zones.length ?? 0) > 1 ? 's' : ''} ${h?.Zones.join(', ') || '(none)'}`;
  };
  const cluster = (c: Candidate): Use => {
    if (inCluster.has(c)) {
      if (!ready(c)) return { used: true, why: 'serving and terminating: the fallback (no ready endpoint)' };
      if (cat.topology === 'PreferSameZone') return { used: true, why: `ready; topology hint for zone ${node.zone}` };
      if (cat.topology === 'PreferSameNode') return { used: true, why: `ready; topology hint for node ${node.name}` };
      return { used: true, why: 'ready' };
    }
    if (ready(c)) return { used: false, why: `topology: ${hintWords(c)}, not ${cat.topology === 'PreferSameNode' ? `node ${node.name}` : `zone ${node.zone || '(unknown)'}`}` };
    if (servingTerminating(c)) return { used: false, why: 'terminating: ready endpoints exist' };
    return { used: false, why: (c.info.Conditions?.Serving ?? true) ? 'not ready' : 'not serving' };
  };
  const local = (c: Candidate): Use => {
    if (inLocal.has(c)) return { used: true, why: ready(c) ? 'ready, on this node (Local policy)' : 'serving and terminating, on this node: the fallback (no ready local endpoint)' };
    if (!c.local) return { used: false, why: `not on this node (Local policy${c.info.Topology?.Node ? `; on ${c.info.Topology.Node}` : '; its node is unknown'})` };
    if (servingTerminating(c) && anyReady(cands.filter((x) => x.local))) return { used: false, why: 'terminating: ready local endpoints exist' };
    return { used: false, why: (c.info.Conditions?.Serving ?? true) ? 'not ready' : 'not serving' };
  };
  return cands.map((c) => ({ internal: itpLocal ? local(c) : cluster(c), external: etpLocal ? local(c) : cluster(c) }));
}
