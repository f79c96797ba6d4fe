// Credentials for API requests. Those that can go stale (a rotated token
// file, an exec plugin's expiring token) refresh themselves, and are
// refreshed at once when the server answers 401.
import { spawn } from 'node:child_process';
import { readFile } from 'node:fs/promises';

export interface Auth {
  /** Authorization: Bearer */
  token?: string;
  /** Authorization: Basic (base64 user:password) */
  basic?: string;
  /** client certificate from an exec plugin (kubeconfig certificates are in TLSConfig) */
  cert?: Buffer;
  key?: Buffer;
}

export interface Credentials {
  get(): Promise<Auth>;
  /** The server refused what get() gave: forget it. True if asking again may help. */
  invalidate(): boolean;
}

export class NoCredentials implements Credentials {
  async get(): Promise<Auth> { return {}; }
  invalidate(): boolean { return false; }
}

export class StaticCredentials implements Credentials {
  constructor(private readonly auth: Auth) {}
  async get(): Promise<Auth> { return this.auth; }
  invalidate(): boolean { return false; }
}

/**
 * A token file (tokenFile, or the service-account token), re-read every
 * minute as client-go does: kubelet rotates projected tokens in place.
 */
export class TokenFileCredentials implements Credentials {
  private token?: string;
  private readAt = 0;

  constructor(
    readonly path: string,
    private readonly maxAgeMs = 60_000,
  ) {}

  async get(): Promise<Auth> {
    if (this.token === undefined || Date.now() - this.readAt >= this.maxAgeMs) {
      try {
        const t = (await readFile(this.path, 'utf8')).trim();
        if (!t) throw new Error('empty');
        this.token = t;
        this.readAt = Date.now();
      } catch (e) {
        // mid-rotation: keep using the last token we had
        if (this.token === undefined) throw new Error(`cannot read token file ${this.path}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
      }
    }
    return { token: this.token };
  }

  invalidate(): boolean {
    this.readAt = 0;
    return true;
  }
}

export interface ExecConfig {
  apiVersion: string;
  command: string;
  args: string[];
  env: Record<string, string>;
  provideClusterInfo: boolean;
  installHint: string;
}

export interface ClusterInfo {
  server: string;
  ca?: Buffer;
  insecure: boolean;
}

/** Refresh an exec credential this long before it expires. */
const EXPIRY_MARGIN_MS = 10_000;
const EXEC_TIMEOUT_MS = 60_000;

/**
 * client-go exec credential plugins (client.authentication.k8s.io/v1 and
 * v1beta1): runs the command, caches status.token or the client certificate
 * until status.expirationTimestamp (forever without one), runs it again on
 * expiry or on 401.
 */
export class ExecCredentials implements Credentials {
  private cached?: { auth: Auth; expiresAt: number };
  private running?: Promise<Auth>;
  /** how many times the plugin ran (for tests and logs) */
  runs = 0;

  constructor(
    private readonly cfg: ExecConfig,
    private readonly cluster: ClusterInfo,
    private readonly env: Record<string, string | undefined> = process.env,
  ) {}

  get(): Promise<Auth> {
    if (this.cached && Date.now() < this.cached.expiresAt - EXPIRY_MARGIN_MS) return Promise.resolve(this.cached.auth);
    // one run at a time: every reflector asks at once after an expiry
    this.running ??= this.run().finally(() => (this.running = undefined));
    return this.running;
  }

  invalidate(): boolean {
    this.cached = undefined;
    return true;
  }

  private execInfo(): string {
    const spec: Record<string, unknown> = { interactive: false };
    if (this.cfg.provideClusterInfo) {
      const cluster: Record<string, unknown> = { server: this.cluster.server, 'insecure-skip-tls-verify': this.cluster.insecure };
      if (this.cluster.ca) cluster['certificate-authority-data'] = this.cluster.ca.toString('base64');
      spec.cluster = cluster;
    }
    return JSON.stringify({ apiVersion: this.cfg.apiVersion, kind: 'ExecCredential', spec });
  }

  private async run(): Promise<Auth> {
    this.runs++;
    const { stdout } = await runCommand(this.cfg, { ...this.env, ...this.cfg.env, KUBERNETES_EXEC_INFO: this.execInfo() });
    let cred: any;
    try {
      cred = JSON.parse(stdout);
    } catch {
      throw new Error(`exec plugin ${this.cfg.command}: output is not JSON`);
    }
    if (cred?.kind !== 'ExecCredential') throw new Error(`exec plugin ${this.cfg.command}: output kind is ${JSON.stringify(cred?.kind)}, not ExecCredential`);
    if (cred.apiVersion !== this.cfg.apiVersion) {
      throw new Error(`exec plugin ${this.cfg.command}: answered ${cred.apiVersion}, the kubeconfig asked for ${this.cfg.apiVersion}`);
    }
    const st = cred.status ?? {};
    const auth: Auth = {};
    if (typeof st.token === 'string' && st.token) auth.token = st.token;
    if (st.clientCertificateData || st.clientKeyData) {
      if (!st.clientCertificateData || !st.clientKeyData) throw new Error(`exec plugin ${this.cfg.command}: clientCertificateData and clientKeyData go together`);
      auth.cert = Buffer.from(String(st.clientCertificateData));
      auth.key = Buffer.from(String(st.clientKeyData));
    }
    if (!auth.token && !auth.cert) throw new Error(`exec plugin ${this.cfg.command}: status has neither token nor clientCertificateData`);
    let expiresAt = Infinity;
    if (st.expirationTimestamp) {
      expiresAt = Date.parse(String(st.expirationTimestamp));
      if (Number.isNaN(expiresAt)) throw new Error(`exec plugin ${this.cfg.command}: bad expirationTimestamp ${JSON.stringify(st.expirationTimestamp)}`);
    }
    this.cached = { auth, expiresAt };
    return auth;
  }
}

function runCommand(cfg: ExecConfig, env: Record<string, string | undefined>): Promise<{ stdout: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(cfg.command, cfg.args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
    // not spawn's own timeout: its timer outlives a command that failed to start
    const timer = setTimeout(() => child.kill('SIGKILL'), EXEC_TIMEOUT_MS);
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on('data', (b) => out.push(b));
    child.stderr.on('data', (b) => err.push(b));
    child.on('error', (e: NodeJS.ErrnoException) => {
      clearTimeout(timer);
      const hint = e.code === 'ENOENT' && cfg.installHint ? ` (${cfg.installHint.trim()})` : '';
      reject(new Error(`exec plugin ${cfg.command}: ${e.code ?? e.message}${hint}`));
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      if (code === 0) return resolve({ stdout: Buffer.concat(out).toString('utf8') });
      const stderr = Buffer.concat(err).toString('utf8').trim().split('\n').slice(-3).join(' | ');
      reject(new Error(`exec plugin ${cfg.command} failed (${signal ?? `exit ${code}`})${stderr ? `: ${stderr}` : ''}`));
    });
  });
}
