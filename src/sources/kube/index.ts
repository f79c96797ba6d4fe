// The kube source: lists and watches a real Kubernetes API server (Services,
// EndpointSlices, Nodes, ServiceCIDRs) with our own reflector, and keeps the
// store equal to what the server has. See docs/kube-source.md.
import type { Logger } from '../../runtime/log.js';
import type { Store } from '../../store/store.js';
import { HEADLESS_LABEL, SERVICE_NAME_LABEL } from '../objects.js';
import { SERVICE_PROXY_NAME_LABEL } from '../../api/model.js';
import { version } from '../../runtime/version.js';
import { KubeClient } from './client.js';
import { resolveConnection, type Connection } from './config.js';
import { DEFAULT_REFLECTOR_OPTIONS, Reflector, StoreWriter, type ReflectorOptions, type Resource } from './reflector.js';
import { ParserThread } from '../parser-thread.js';

export { resolveConnection, type Connection } from './config.js';

export interface KubeSourceOptions {
  connection: Connection;
  /** --service-proxy-name: only Services (and their slices) labelled with it */
  serviceProxyName?: string;
  /** --watch-node: watch only this Node (a node-local proxy); default all */
  watchNode?: string;
  reflector?: Partial<ReflectorOptions>;
}

/** What to watch, with the selectors that keep out what a proxy never uses. */
export function kubeResources(opts: { serviceProxyName?: string; watchNode?: string }): Resource[] {
  // kube-proxy's own selector, on Services and EndpointSlices alike (the
  // EndpointSlice controller copies a Service's labels to its slices)
  const proxyName = opts.serviceProxyName ? `${SERVICE_PROXY_NAME_LABEL}=${opts.serviceProxyName}` : `!${SERVICE_PROXY_NAME_LABEL}`;
  return [
    { kind: 'Service', storeKind: 'services', plural: 'services', path: '/api/v1/services', namespaced: true, labelSelector: proxyName },
    {
      kind: 'EndpointSlice',
      storeKind: 'endpointSlices',
      plural: 'endpointslices',
      path: '/apis/discovery.k8s.io/v1/endpointslices',
      namespaced: true,
      labelSelector: `${SERVICE_NAME_LABEL},!${HEADLESS_LABEL},${proxyName}`,
    },
    {
      kind: 'Node',
      storeKind: 'nodes',
      plural: 'nodes',
      path: '/api/v1/nodes',
      namespaced: false,
      fieldSelector: opts.watchNode ? `metadata.name=${opts.watchNode}` : undefined,
    },
    {
      kind: 'ServiceCIDR',
      storeKind: 'serviceCIDRs',
      plural: 'servicecidrs',
      path: '/apis/networking.k8s.io/v1/servicecidrs',
      namespaced: false,
      groupVersion: 'networking.k8s.io/v1',
      optional: true,
    },
  ];
}

function userAgent(): string {
  return `kpng/${version()} (node ${process.version})`;
}

export class KubeSource {
  readonly client: KubeClient;
  readonly writer: StoreWriter;
  readonly reflectors: Reflector[];
  /** large list pages of slices are parsed here (it ends when idle: after the first list) */
  private readonly parser = new ParserThread();
  private readonly started = performance.now();

  constructor(
    private readonly store: Store,
    private readonly log: Logger,
    opts: KubeSourceOptions,
  ) {
    this.client = new KubeClient(opts.connection, userAgent());
    const ropts = { ...DEFAULT_REFLECTOR_OPTIONS, ...opts.reflector };
    this.writer = new StoreWriter((fn) => this.apply(fn), log);
    this.reflectors = kubeResources(opts).map((r) => new Reflector(this.client, r, this.writer, log, ropts, this.parser));
  }

  private apply(fn: Parameters<Store['update']>[0]): void {
    const change = this.store.update(fn);
    if (change?.becameSynced) {
      const counts = Object.fromEntries(this.reflectors.map((r) => [r.resource.plural, r.size]));
      this.log.info({ ...counts, ms: Math.round(performance.now() - this.started) }, 'kube source: initial state complete');
    }
  }

  start(): void {
    for (const r of this.reflectors) r.start();
  }

  async stop(): Promise<void> {
    await Promise.all(this.reflectors.map((r) => r.stop()));
    await this.parser.close();
    this.writer.flush();
    this.client.close();
  }

  /** Applies the writes queued so far now (tests; normally on the next tick). */
  flush(): void {
    this.writer.flush();
  }
}
