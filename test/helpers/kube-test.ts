// Small helpers for kube source tests: a KubeSource wired to a test API
// server with a recording logger, and bounded waiting (until.ts).
import type { Logger } from 'pino';
import { Store } from '../../src/store/store.js';
import { KubeSource, type KubeSourceOptions } from '../../src/sources/kube/index.js';
import { resolveConnection, type Connection } from '../../src/sources/kube/config.js';
import type { ReflectorOptions } from '../../src/sources/kube/reflector.js';
import type { TestApiServer } from './apiserver.js';
import { recordingLogger, type Recorded } from './logs.js';
import { until } from './until.js';

export const WARN = 40;
export const ERROR = 50;

/** Reflector timings for tests: fast retries. */
export const FAST: Partial<ReflectorOptions> = { backoffMinMs: 5, backoffMaxMs: 100, requestTimeoutMs: 2000, idleTimeoutMs: 5000 };

export interface Running {
  store: Store;
  source: KubeSource;
  log: Logger;
  records: Recorded[];
  stop(): Promise<void>;
  /** waits until every reflector has seen the server's current resourceVersion, then applies pending writes */
  caughtUp(timeoutMs?: number): Promise<void>;
}

/** kubeconfig: a kubeconfig path, or a resolved connection */
export function startSource(server: TestApiServer, kubeconfig: string | Connection, opts: Partial<KubeSourceOptions> = {}, reflector: Partial<ReflectorOptions> = {}): Running {
  const store = new Store();
  const { log, records } = recordingLogger();
  const connection = typeof kubeconfig === 'string' ? resolveConnection({ kubeconfig }, {}) : kubeconfig;
  const source = new KubeSource(store, log, { connection, ...opts, reflector: { ...FAST, ...reflector } });
  source.start();
  return {
    store,
    source,
    log,
    records,
    stop: () => source.stop(),
    async caughtUp(timeoutMs = 15_000) {
      const want = server.rv;
      // bookmarks carry the current resourceVersion to every watch
      let last = 0;
      const have = () => source.reflectors.map((r) => `${r.resource.plural}=${r.resourceVersion}`).join(' ');
      const atWant = () => {
        if (Date.now() - last > 50) (last = Date.now()), server.bookmark();
        return source.reflectors.every((r) => !r.served || Number(r.resourceVersion) >= want);
      };
      await until(`every reflector at resourceVersion ${want}`, atWant, { timeoutMs, detail: () => `(have ${have()})` });
      source.flush();
    },
  };
}
