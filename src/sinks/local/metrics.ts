// kpng local's own metric (in the process's registry): whether a brain feeds
// this node, so an alert can name a node left without one.
import { Gauge } from 'prom-client';
import { registry } from '../../runtime/metrics.js';

export const localMetrics = {
  brainConnected: new Gauge({
    name: 'kpng_local_brain_connected',
    help: "kpng local: 1 while this brain (its address) feeds the node: its stream is open and has delivered the node's state; 0 otherwise",
    labelNames: ['brain'] as const,
    registers: [registry],
  }),
};
