// to-log: prints each op of the node-local diff stream (for debugging).
import { toJsonString, type DescMessage } from '@bufbuild/protobuf';
import * as L from '../../api/gen/api/localv1/api_pb.js';
import { LocalSet } from '../../api/model.js';
import type { LocalOp } from '../../diff/ops.js';
import { registerBackend } from '../registry.js';

const SCHEMAS: Partial<Record<LocalSet, DescMessage>> = {
  [LocalSet.ServicesSet]: L.ServiceSchema,
  [LocalSet.EndpointsSet]: L.EndpointSchema,
  [LocalSet.NodesSet]: L.NodeSchema,
  [LocalSet.ServiceCIDRsSet]: L.ServiceCIDRSchema,
};

export function formatOp(op: LocalOp): string {
  switch (op.kind) {
    case 'reset': return '~ reset';
    case 'sync': return '> sync';
    case 'set': {
      const schema = SCHEMAS[op.set];
      const value = schema ? toJsonString(schema, op.value as never) : '';
      return `+ ${LocalSet[op.set]} ${op.path} ${value}`;
    }
    case 'delete': return `- ${LocalSet[op.set]} ${op.path}`;
  }
}

registerBackend({
  name: 'log',
  description: 'print each op of the node-local diff stream on stdout (debugging)',
  options(cmd) {
    cmd.option('--all-sets', 'also receive the node itself and the ServiceCIDRs');
  },
  create(opts) {
    return {
      sets: opts.allSets ? [LocalSet.NodesSet, LocalSet.ServiceCIDRsSet] : [],
      sink: { send: (op) => void process.stdout.write(formatOp(op) + '\n') },
    };
  },
});
