// Where the API server is and how to authenticate, as any Kubernetes client
// finds it: --kubeconfig, else the kube-proxy configuration's
// clientConnection.kubeconfig, else $KUBECONFIG (a list; the first file to set
// a key wins), else --master (with the pod's service-account token and CA when
// it is https and they are mounted, as Cilium's k8s-api-server), else
// in-cluster service-account credentials, else ~/.kube/config. --master
// overrides the server URL of whatever was found.
//
// A node without kube-proxy cannot reach the API server through the
// `kubernetes` Service (nothing programs its ClusterIP until kpng runs), so a
// pod points kpng at the API server's real address: --master, or
// KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT set in its spec (they win
// over the ones kubelet injects), both with the pod's own credentials.
import { existsSync, readFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { delimiter, dirname, isAbsolute, join, resolve } from 'node:path';
import { yaml } from '../../runtime/lazy.js';
import { ConfigError } from '../../runtime/errors.js';
import { ExecCredentials, NoCredentials, StaticCredentials, TokenFileCredentials, type Credentials, type ExecConfig } from './credentials.js';

export const SERVICEACCOUNT_DIR = '/var/run/secrets/kubernetes.io/serviceaccount';

export interface TLSConfig {
  ca?: Buffer;
  cert?: Buffer;
  key?: Buffer;
  /** insecure-skip-tls-verify */
  insecure: boolean;
  /** tls-server-name: the name to verify instead of the URL's host */
  servername?: string;
}

export interface Connection {
  server: URL;
  tls: TLSConfig;
  credentials: Credentials;
  /** where this came from, for logs: "kubeconfig ~/.kube/config context kind-kind" */
  origin: string;
}

export interface ConnectionOptions {
  kubeconfig?: string;
  /** the kube-proxy configuration's clientConnection.kubeconfig (kube-proxy's own way to name the server) */
  configKubeconfig?: string;
  master?: string;
  context?: string;
}

type Env = Record<string, string | undefined>;
type Obj = Record<string, unknown>;

const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);

/** Resolves the connection; throws ConfigError naming the flag, file or field at fault. */
export function resolveConnection(opts: ConnectionOptions, env: Env = process.env): Connection {
  let conn: Connection;
  const explicit = opts.kubeconfig ? { file: opts.kubeconfig, field: '--kubeconfig' } : opts.configKubeconfig ? { file: opts.configKubeconfig, field: 'clientConnection.kubeconfig' } : undefined;
  if (explicit) {
    const path = resolve(explicit.file);
    if (!existsSync(path)) throw new ConfigError(explicit.field, `${path} does not exist`);
    conn = fromKubeconfig([path], opts.context, env);
  } else if (env.KUBECONFIG) {
    const paths = env.KUBECONFIG.split(delimiter).filter(Boolean).map((p) => resolve(p));
    const present = paths.filter((p) => existsSync(p));
    if (!present.length) throw new ConfigError('KUBECONFIG', `none of ${paths.join(', ')} exists`);
    conn = fromKubeconfig(present, opts.context, env);
  } else if (opts.master) {
    conn = masterOnly(parseServer(opts.master, '--master'), env);
  } else if (env.KUBERNETES_SERVICE_HOST && env.KUBERNETES_SERVICE_PORT) {
    conn = inCluster(env);
  } else {
    const path = join(env.HOME || homedir(), '.kube', 'config');
    if (!existsSync(path)) {
      throw new ConfigError('--kubeconfig', 'no kubeconfig: give --kubeconfig or --master, set KUBECONFIG, or run in a pod (KUBERNETES_SERVICE_HOST)');
    }
    conn = fromKubeconfig([path], opts.context, env);
  }
  if (opts.master) conn.server = parseServer(opts.master, '--master');
  return conn;
}

function parseServer(s: string, field: string): URL {
  let u: URL;
  try {
    u = new URL(s);
  } catch {
    throw new ConfigError(field, `${JSON.stringify(s)} is not a URL`);
  }
  if (u.protocol !== 'https:' && u.protocol !== 'http:') throw new ConfigError(field, `${JSON.stringify(s)}: only https:// and http:// are supported`);
  return u;
}

const serviceAccountDir = (env: Env) => env.KPNG_SERVICEACCOUNT_DIR || SERVICEACCOUNT_DIR;

/** The pod's service-account credentials: its token (re-read as it rotates) and the cluster's CA. */
function serviceAccount(dir: string): Pick<Connection, 'tls' | 'credentials'> {
  const caPath = join(dir, 'ca.crt');
  return {
    tls: { ca: existsSync(caPath) ? readFileSync(caPath) : undefined, insecure: false },
    credentials: new TokenFileCredentials(join(dir, 'token')),
  };
}

/**
 * --master without a kubeconfig. An https server gets the pod's
 * service-account token and CA when they are mounted (the API server's real
 * address with in-cluster credentials, as Cilium's k8s-api-server); an http
 * one, or none mounted, gets no credentials (as kube-proxy's --master).
 */
function masterOnly(server: URL, env: Env): Connection {
  const dir = serviceAccountDir(env);
  if (server.protocol === 'https:' && existsSync(join(dir, 'token'))) {
    return { server, ...serviceAccount(dir), origin: `--master ${server.host} with the service-account credentials (${dir})` };
  }
  return { server, tls: { insecure: false }, credentials: new NoCredentials(), origin: `--master ${server.host} without credentials` };
}

/** In-cluster: KUBERNETES_SERVICE_HOST/PORT and the service-account credentials. */
export function inCluster(env: Env = process.env): Connection {
  const dir = serviceAccountDir(env);
  const host = env.KUBERNETES_SERVICE_HOST!;
  const server = parseServer(`https://${host.includes(':') ? `[${host}]` : host}:${env.KUBERNETES_SERVICE_PORT}`, 'KUBERNETES_SERVICE_HOST');
  const tokenPath = join(dir, 'token');
  if (!existsSync(tokenPath)) throw new ConfigError('in-cluster', `${tokenPath} does not exist (no service-account token mounted?)`);
  return { server, ...serviceAccount(dir), origin: `in-cluster ${server.host} (${dir})` };
}

interface Named {
  value: Obj;
  /** the file that defined it: relative paths are relative to its directory */
  file: string;
}

/** Merges kubeconfig files: for each name (and current-context) the first file wins. */
function mergeKubeconfigs(paths: string[]): { clusters: Map<string, Named>; users: Map<string, Named>; contexts: Map<string, Named>; current: string } {
  const clusters = new Map<string, Named>();
  const users = new Map<string, Named>();
  const contexts = new Map<string, Named>();
  let current = '';
  for (const file of paths) {
    let doc: unknown;
    try {
      doc = yaml().parse(readFileSync(file, 'utf8'));
    } catch (e) {
      throw new ConfigError(file, `cannot read kubeconfig: ${(e as Error).message}`);
    }
    if (doc === null || doc === undefined) continue; // empty file
    if (!isObj(doc)) throw new ConfigError(file, 'a kubeconfig must be a mapping');
    const take = (field: 'clusters' | 'users' | 'contexts', inner: string, into: Map<string, Named>) => {
      const list = doc[field] ?? [];
      if (!Array.isArray(list)) throw new ConfigError(`${file}: ${field}`, 'must be a list');
      list.forEach((e, i) => {
        if (!isObj(e) || typeof e.name !== 'string') throw new ConfigError(`${file}: ${field}[${i}].name`, 'missing');
        if (!into.has(e.name)) into.set(e.name, { value: isObj(e[inner]) ? (e[inner] as Obj) : {}, file });
      });
    };
    take('clusters', 'cluster', clusters);
    take('users', 'user', users);
    take('contexts', 'context', contexts);
    if (!current && typeof doc['current-context'] === 'string') current = doc['current-context'];
  }
  return { clusters, users, contexts, current };
}

export function fromKubeconfig(paths: string[], contextName: string | undefined, env: Env = process.env): Connection {
  const kc = mergeKubeconfigs(paths);
  const where = paths.join(delimiter);
  const name = contextName || kc.current;
  if (!name) throw new ConfigError(where, 'no current-context; give --context');
  const ctx = kc.contexts.get(name);
  if (!ctx) throw new ConfigError(contextName ? '--context' : `${where}: current-context`, `context ${JSON.stringify(name)} not found in ${where}`);
  const clusterName = str(ctx.value.cluster, `contexts[${name}].context.cluster`, ctx.file);
  const cluster = kc.clusters.get(clusterName);
  if (!cluster) throw new ConfigError(`${ctx.file}: contexts[${name}].context.cluster`, `cluster ${JSON.stringify(clusterName)} not found`);
  const userName = str(ctx.value.user, `contexts[${name}].context.user`, ctx.file);
  const user = userName ? kc.users.get(userName) : undefined;
  if (userName && !user) throw new ConfigError(`${ctx.file}: contexts[${name}].context.user`, `user ${JSON.stringify(userName)} not found`);

  const c = cluster.value;
  const cf = (k: string) => `${cluster.file}: clusters[${clusterName}].cluster.${k}`;
  const server = parseServer(str(c.server, 'server', cluster.file) || '', cf('server'));
  if (c['proxy-url']) throw new ConfigError(cf('proxy-url'), 'proxies are not supported');
  const tls: TLSConfig = {
    ca: fileOrData(c, 'certificate-authority', cluster.file, cf),
    insecure: c['insecure-skip-tls-verify'] === true,
    servername: typeof c['tls-server-name'] === 'string' && c['tls-server-name'] ? c['tls-server-name'] : undefined,
  };

  let credentials: Credentials = new NoCredentials();
  if (user) {
    const u = user.value;
    const uf = (k: string) => `${user.file}: users[${userName}].user.${k}`;
    tls.cert = fileOrData(u, 'client-certificate', user.file, uf);
    tls.key = fileOrData(u, 'client-key', user.file, uf);
    if (!tls.cert !== !tls.key) throw new ConfigError(uf(tls.cert ? 'client-key' : 'client-certificate'), 'a client certificate needs both a certificate and a key');
    if (u['auth-provider']) throw new ConfigError(uf('auth-provider'), 'auth-provider plugins are not supported; use an exec plugin');
    if (isObj(u.exec)) {
      credentials = new ExecCredentials(parseExec(u.exec, user.file, uf), { server: server.href, ca: tls.ca, insecure: tls.insecure }, env);
    } else if (typeof u.token === 'string' && u.token) {
      credentials = new StaticCredentials({ token: u.token });
    } else if (typeof u.tokenFile === 'string' && u.tokenFile) {
      credentials = new TokenFileCredentials(relativeTo(user.file, u.tokenFile));
    } else if (typeof u.username === 'string' && u.username) {
      credentials = new StaticCredentials({ basic: Buffer.from(`${u.username}:${String(u.password ?? '')}`).toString('base64') });
    }
  }
  return { server, tls, credentials, origin: `kubeconfig ${where} context ${name}` };
}

function parseExec(e: Obj, file: string, field: (k: string) => string): ExecConfig {
  const apiVersion = String(e.apiVersion ?? '');
  if (apiVersion !== 'client.authentication.k8s.io/v1' && apiVersion !== 'client.authentication.k8s.io/v1beta1') {
    throw new ConfigError(field('exec.apiVersion'), `${JSON.stringify(apiVersion)}: use client.authentication.k8s.io/v1 or v1beta1`);
  }
  if (typeof e.command !== 'string' || !e.command) throw new ConfigError(field('exec.command'), 'missing');
  const args = Array.isArray(e.args) ? e.args.map(String) : [];
  const env: Record<string, string> = {};
  if (Array.isArray(e.env)) {
    e.env.forEach((v, i) => {
      if (!isObj(v) || typeof v.name !== 'string') throw new ConfigError(field(`exec.env[${i}].name`), 'missing');
      env[v.name] = String(v.value ?? '');
    });
  }
  // kubectl: a command with a path separator is relative to the kubeconfig's directory
  const command = e.command.includes('/') && !isAbsolute(e.command) ? relativeTo(file, e.command) : e.command;
  return { apiVersion, command, args, env, provideClusterInfo: e.provideClusterInfo === true, installHint: typeof e.installHint === 'string' ? e.installHint : '' };
}

function str(v: unknown, field: string, file: string): string {
  if (v === undefined || v === null) return '';
  if (typeof v !== 'string') throw new ConfigError(`${file}: ${field}`, 'must be a string');
  return v;
}

function relativeTo(file: string, p: string): string {
  return isAbsolute(p) ? p : resolve(dirname(file), p);
}

/** "<k>-data" (base64) wins over "<k>" (a path relative to the file). */
function fileOrData(o: Obj, k: string, file: string, field: (k: string) => string): Buffer | undefined {
  const data = o[`${k}-data`];
  if (typeof data === 'string' && data) return Buffer.from(data, 'base64');
  const p = o[k];
  if (typeof p !== 'string' || !p) return undefined;
  const path = relativeTo(file, p);
  try {
    return readFileSync(path);
  } catch (e) {
    throw new ConfigError(field(k), `cannot read ${path}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
  }
}
