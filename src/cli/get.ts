// kpng get services|endpoints|nodes: what a running kpng knows, from its
// read-only state socket (or a brain's API), as kubectl prints tables.
import { existsSync } from 'node:fs';
import { Option, type Command } from 'commander';
import { registerCommand } from './commands.js';
import { ipSetAll } from '../api/model.js';
import { yaml } from '../runtime/lazy.js';
import { addClientTLSOptions, clientTLSFromOpts } from '../api/grpc/tls.js';
import { DEFAULT_BRAIN_SOCKET, DEFAULT_NODE_SOCKET } from '../sinks/api/defaults.js';

const KINDS: Record<string, 'services' | 'endpoints' | 'nodes' | 'tenants'> = {
  services: 'services',
  service: 'services',
  svc: 'services',
  endpoints: 'endpoints',
  endpoint: 'endpoints',
  ep: 'endpoints',
  nodes: 'nodes',
  node: 'nodes',
  no: 'nodes',
  tenants: 'tenants',
  tenant: 'tenants',
};

const HELP = `
Asks a running kpng (its state socket: a node agent's ${DEFAULT_NODE_SOCKET.slice(7)}, else a
brain's ${DEFAULT_BRAIN_SOCKET.slice(7)}; or --socket, or a brain's API with --api) and prints:
  services    type, addresses, ports, traffic policies; on a node, how many endpoints
              internal (cluster IP) and external (NodePort, external and LB IPs) traffic
              uses; with a NAME or -o wide, each endpoint with why it is used or not
  endpoints   every endpoint of the Services with its conditions, hints and, on a node,
              whether internal and external traffic use it and why
  nodes       the Nodes kpng knows
  tenants     a node agent's tenants (other agents whose packet-filter rules kpng writes,
              docs/aggregator.md): their tables, chains, rules, sets, elements, last
              change and last error; -o wide: their base chains by hook and priority
A node agent answers for its own node; a brain for the node named with --node (without
it, no per-node reasons). A split-mode agent (kpng local) knows only the endpoints its
node was sent: why others are left out, its brain tells (--api BRAIN --node NODE).

Examples:
  kpng get services
  kpng get services web -n demo -o wide
  kpng get endpoints --api unix:///run/kpng/kpng.sock --node node-b -o json
  kpng get tenants -o wide
`;

const DEFAULT_SOCKETS = [DEFAULT_NODE_SOCKET, DEFAULT_BRAIN_SOCKET];

/** The state socket asked by default: a node agent's, else a brain's (the node agent's when neither is there). */
export function defaultSocket(): string {
  for (const s of DEFAULT_SOCKETS) if (existsSync(s.slice('unix://'.length))) return s;
  return DEFAULT_NODE_SOCKET;
}

registerCommand((program, run) => {
  const cmd = program
    .command('get')
    .description('show what a running kpng knows: get services|endpoints|nodes|tenants [NAME] (kubectl-style)')
    .argument('<kind>', 'services, endpoints, nodes or tenants')
    .argument('[name]', 'only this one')
    .option('-n, --namespace <namespace>', 'only this namespace')
    .option('--node <name>', 'explain for this node (default: the node agent\'s own)')
    .option('--socket <path>', "a kpng's state socket")
    .option('--api <address>', "a brain's API: unix:///path, tcp://host:port")
    .addOption(new Option('-o, --output <format>', 'output format').choices(['wide', 'yaml', 'json']))
    .addHelpText('after', HELP);
  addClientTLSOptions(cmd);
  cmd.action(function (this: Command, kindArg: string, name: string | undefined) {
    const o = this.opts();
    return run(async () => {
      // the client and the tables load when the command runs
      const [{ fetchState, GetError, NotRunning }, { endpointsTable, nodesOf, nodesTable, servicesOf, servicesOfLocal, servicesTable, structured, plain, terminal }] = await Promise.all([
        import('../get/fetch.js'),
        import('../get/view.js'),
      ]);
      const kind = KINDS[kindArg.toLowerCase()];
      try {
        if (!kind) throw new GetError(`unknown kind ${JSON.stringify(kindArg)}: services, endpoints, nodes or tenants`);
        if (o.socket && o.api) throw new GetError('give --socket or --api, not both');
        const address = o.api ?? (o.socket ? (o.socket.startsWith('unix:') ? o.socket : `unix://${o.socket}`) : defaultSocket());
        const format = o.output ?? 'table';
        const style = process.stdout.isTTY ? terminal : plain;
        if (kind === 'tenants') {
          const { fetchTenants, tenantsTable } = await import('../get/tenants.js');
          const { dataplane, tenants } = await fetchTenants(address, clientTLSFromOpts(o));
          const items = tenants.filter((t) => !name || t.name === name);
          if (name && !items.length) throw new GetError(`tenant ${name} not found`);
          const doc = { kind: 'TenantList', dataplane, items };
          console.log(format === 'json' ? JSON.stringify(doc, null, 2) : format === 'yaml' ? yaml().stringify(doc) : tenantsTable(items, style, format === 'wide'));
          return;
        }
        const state = await fetchState(address, clientTLSFromOpts(o), o.node);
        const node = state.node;
        if (kind === 'nodes') {
          // a kpng local node agent knows its own node only
          const nodes = state.local ? (node ? [{ name: node.Name, zone: node.Zone, ips: ipSetAll(node.IPs), podCIDRs: [...node.PodCIDRs], deleting: node.Deleting, labels: { ...node.Labels } }] : []).filter((n) => !name || n.name === name) : nodesOf(state, name);
          if (name && !nodes.length) throw new GetError(`node ${name} not found`);
          console.log(format === 'json' || format === 'yaml' ? structured('NodeList', nodes, node, format) : nodesTable(nodes, node?.Name, style, format === 'wide'));
          return;
        }
        const services = state.local ? servicesOfLocal(state, { namespace: o.namespace, name }) : servicesOf(state, node, { namespace: o.namespace, name });
        if (name && !services.length) throw new GetError(`service ${o.namespace ? `${o.namespace}/` : ''}${name} not found`);
        if (format === 'json' || format === 'yaml') {
          const items = kind === 'services' ? services : services.flatMap((s) => s.endpoints.map((e) => ({ namespace: s.namespace, service: s.name, ...e })));
          console.log(structured(kind === 'services' ? 'ServiceList' : 'EndpointList', items, node, format));
          return;
        }
        if (kind === 'endpoints') {
          console.log(endpointsTable(services, style, true));
          return;
        }
        const out = [servicesTable(services, node, style, format === 'wide')];
        if (name || format === 'wide') {
          for (const s of services) {
            const policies = `internalTrafficPolicy: ${s.internalTrafficPolicy}${s.externalTrafficPolicy ? `, externalTrafficPolicy: ${s.externalTrafficPolicy}` : ''}${s.trafficDistribution ? `, trafficDistribution: ${s.trafficDistribution}` : ''}`;
            out.push('', `${s.namespace}/${s.name}${node ? ` on ${node.Name}${node.Zone ? ` (zone ${node.Zone})` : ''}` : ''}: ${policies}`);
            out.push(s.endpoints.length ? endpointsTable([s], style, false).replace(/^/gm, '  ') : '  no endpoints');
          }
        }
        console.log(out.join('\n'));
      } catch (e) {
        // asked nowhere in particular: say where kpng looked, and what to do
        if (e instanceof NotRunning && !o.socket && !o.api) {
          throw new GetError(`no kpng is running here (looked at ${DEFAULT_SOCKETS.map((s) => s.slice('unix://'.length)).join(' and ')}); start one or use --socket/--api`);
        }
        throw e;
      }
    });
  });
});
