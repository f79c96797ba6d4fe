// Whether the node-local stream has this agent's Node. After the first
// complete state, a node name no Node has (a mistyped --node-name or
// hostnameOverride, or a Node not registered yet) is said: one WARN at once,
// again every NODE_UNKNOWN_REPEAT_MS while it lasts, kpng_node_known 0, and
// /healthz and /readyz 503 (kube-proxy's nodeEligible is false while it has no
// Node). kpng does not exit as kube-proxy does after waiting 5 minutes for its
// Node: the Node may still register, a restart would not make it appear, and
// ClusterIPs need no Node in the meantime.
import type { Logger } from '../runtime/log.js';
import type { LocalOp } from '../diff/ops.js';
import type { LocalNode } from '../api/model.js';
import type { ProxyHealth } from '../runtime/health.js';
import { metrics, setIpFamily } from '../runtime/metrics.js';

/** how often an unknown node is said again */
export const NODE_UNKNOWN_REPEAT_MS = 10 * 60_000;

export class NodePresence {
  private known = false;
  private deleting = false;
  private repeat?: NodeJS.Timeout;

  constructor(
    private readonly nodeName: string,
    private readonly health: ProxyHealth,
    private readonly log: Logger,
    /** the stream carries the node (a backend asked for NodesSet); otherwise nothing can be told */
    private readonly carried: boolean,
  ) {
    if (!carried) health.setNode(true, false);
  }

  /** a Set or Delete of the node (NodesSet) on its way to the backends */
  op(op: Extract<LocalOp, { kind: 'set' | 'delete' }>): void {
    if (op.kind === 'delete') {
      this.known = this.deleting = false;
      return;
    }
    const node = op.value as LocalNode;
    this.known = true;
    this.deleting = node.Deleting;
    // the family of the node's addresses labels the sync metrics (IPv6 only when it has no IPv4)
    if (node.IPs?.V4.length || node.IPs?.V6.length) setIpFamily(node.IPs.V4.length ? 'IPv4' : 'IPv6');
  }

  /** a complete state reached the backends */
  synced(): void {
    if (!this.carried) return;
    this.health.setNode(this.known, this.deleting);
    metrics.nodeKnown.set(this.known ? 1 : 0);
    if (this.known) {
      if (this.repeat) this.log.info({ node: this.nodeName }, `node ${this.nodeName}: its Node is here now`);
      return this.close();
    }
    if (this.repeat) return;
    this.warn();
    this.repeat = setInterval(() => this.warn(), NODE_UNKNOWN_REPEAT_MS);
    this.repeat.unref();
  }

  private warn(): void {
    this.log.warn(
      { node: this.nodeName },
      `node ${this.nodeName}: the cluster has no Node of this name; check --node-name (or hostnameOverride). Until it appears no endpoint counts as this node's own, topology has no zone, and /healthz answers 503`,
    );
  }

  close(): void {
    clearInterval(this.repeat);
    this.repeat = undefined;
  }
}
