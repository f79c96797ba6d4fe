// Authentication against the test API server as a Kubernetes client does
// it: bearer token, token file (and its rotation), client certificates
// (files and -data), CA files and -data, insecure-skip-tls-verify, exec
// credential plugins (v1 and v1beta1, expiry, re-run on 401), in-cluster
// service-account credentials (and token rotation).
import { describe, it, beforeEach, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync, chmodSync, mkdirSync, copyFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { TestApiServer, tlsFile, writeKubeconfig, type KubeconfigUser } from '../helpers/apiserver.js';
import { nodeObject, serviceObject } from '../helpers/kube-cluster.js';
import { startSource, WARN, type Running } from '../helpers/kube-test.js';
import { resolveConnection } from '../../src/sources/kube/config.js';
import { ExecCredentials, TokenFileCredentials } from '../../src/sources/kube/credentials.js';
import { until } from '../helpers/until.js';

const EXEC_PLUGIN = fileURLToPath(new URL('../fixtures/kube/exec-credential.mjs', import.meta.url));
const CA = { file: tlsFile('ca.crt') };

let dir: string;
let server: TestApiServer;
let run: Running | undefined;

beforeEach(async () => {
  dir = mkdtempSync(join(tmpdir(), 'kpng-auth-'));
  server = await new TestApiServer({ tokens: ['good-token'] }).start();
  server.put(nodeObject('node-0', 0));
  server.put(serviceObject('default', 'web', '10.96.0.10'));
  run = undefined;
});

afterEach(async () => {
  await run?.stop();
  await server.close();
  rmSync(dir, { recursive: true, force: true });
});

function kubeconfig(user: KubeconfigUser, extra: { ca?: { file: string } | { data: string }; insecure?: boolean } = { ca: CA }): string {
  return writeKubeconfig(join(dir, 'kubeconfig'), { server: server.url, ...extra, user });
}

function start(kc: string, env: Record<string, string> = {}): Running {
  run = startSource(server, resolveConnection({ kubeconfig: kc }, env));
  return run;
}

const users = () => [...new Set(server.requests.map((r) => r.user))];
const refusals = (r: Running) => r.records.filter((x) => x.level === WARN && /HTTP 401/.test(x.msg));

async function receivesChanges(r: Running, name: string) {
  server.put(serviceObject('default', name, '10.96.9.9'));
  await until(`service ${name} through the watch`, () => !!r.store.getService(`default/${name}`));
}

describe('kube source auth: kubeconfig', () => {
  it('bearer token', async () => {
    const r = start(kubeconfig({ token: 'good-token' }));
    await until('synced', () => r.store.allSynced);
    assert.deepEqual(users(), ['token:good-']);
  });

  it('a refused token is retried with backoff and logged, never silently', async () => {
    const r = start(kubeconfig({ token: 'bad-token' }));
    await until('several 401 retries', () => refusals(r).length >= 8);
    assert.equal(r.store.allSynced, false);
    assert.ok(server.requests.every((q) => q.status === 401));
    server.tokens.add('bad-token'); // the admin fixes RBAC: it recovers by itself
    await until('synced after the fix', () => r.store.allSynced, { timeoutMs: 15_000 });
  });

  it('client certificate and key files, CA file', async () => {
    const r = start(kubeconfig({ 'client-certificate': tlsFile('client.crt'), 'client-key': tlsFile('client.key') }));
    await until('synced', () => r.store.allSynced);
    assert.deepEqual(users(), ['cert:system:kube-proxy']);
  });

  it('client certificate, key and CA as -data', async () => {
    const b64 = (f: string) => readFileSync(tlsFile(f)).toString('base64');
    const kc = kubeconfig({ 'client-certificate-data': b64('client.crt'), 'client-key-data': b64('client.key') }, { ca: { data: b64('ca.crt') } });
    const r = start(kc);
    await until('synced', () => r.store.allSynced);
    assert.deepEqual(users(), ['cert:system:kube-proxy']);
  });

  it('a client certificate from another CA is refused (401)', async () => {
    const r = start(kubeconfig({ 'client-certificate': tlsFile('untrusted-client.crt'), 'client-key': tlsFile('untrusted-client.key') }));
    await until('401s', () => refusals(r).length >= 2);
    assert.equal(r.store.allSynced, false);
  });

  it('insecure-skip-tls-verify works without a CA; without it the server certificate is rejected', async () => {
    const r = start(kubeconfig({ token: 'good-token' }, { insecure: true }));
    await until('synced', () => r.store.allSynced);
    await r.stop();
    const r2 = start(kubeconfig({ token: 'good-token' }, {}));
    await until('a TLS verification warning', () => r2.records.some((x) => x.level === WARN && /certificate/i.test(x.msg)));
    assert.equal(r2.store.allSynced, false);
  });

  it('tokenFile: relative to the kubeconfig, re-read after a 401 when the token rotates', async () => {
    writeFileSync(join(dir, 'token'), 'good-token\n');
    const r = start(kubeconfig({ tokenFile: 'token' }));
    await until('synced and watching', () => r.store.allSynced && server.watchCount === 4);
    // rotation: the server now only accepts the new token, the file has it
    server.tokens.clear();
    server.tokens.add('rotated-token');
    writeFileSync(join(dir, 'token'), 'rotated-token\n');
    server.dropWatches();
    await receivesChanges(r, 'after-rotation');
    assert.ok(users().includes('token:rotat'));
    assert.equal(refusals(r).length, 0, 'the 401 was answered by re-reading the file, not by a failed retry');
  });
});

describe('kube source auth: exec plugins', () => {
  const exec = (apiVersion: string, env: Record<string, string> = {}, extra: Record<string, unknown> = {}) => ({
    apiVersion,
    command: process.execPath,
    args: [EXEC_PLUGIN],
    env: Object.entries(env).map(([name, value]) => ({ name, value })),
    interactiveMode: 'Never',
    ...extra,
  });
  const runs = (log: string) => readFileSync(log, 'utf8').trim().split('\n').map((l) => JSON.parse(l));

  for (const v of ['v1', 'v1beta1']) {
    it(`client.authentication.k8s.io/${v}: token from the plugin, exec info in KUBERNETES_EXEC_INFO`, async () => {
      server.tokens.add('exec-token');
      const log = join(dir, 'exec.log');
      const r = start(kubeconfig({ exec: exec(`client.authentication.k8s.io/${v}`, { KPNG_EXEC_LOG: log }, { provideClusterInfo: true }) }));
      await until('synced', () => r.store.allSynced);
      assert.deepEqual(users(), ['token:exec-']);
      const [info] = runs(log);
      assert.equal(info.apiVersion, `client.authentication.k8s.io/${v}`);
      assert.equal(info.kind, 'ExecCredential');
      assert.equal(info.spec.interactive, false);
      assert.equal(info.spec.cluster.server, server.url + '/');
      assert.equal(info.spec.cluster['certificate-authority-data'], readFileSync(tlsFile('ca.crt')).toString('base64'));
      assert.equal(runs(log).length, 1, 'the token is cached: four reflectors, one run');
    });
  }

  it('client certificate from the plugin (clientCertificateData/clientKeyData)', async () => {
    const r = start(kubeconfig({ exec: exec('client.authentication.k8s.io/v1', { KPNG_EXEC_MODE: 'cert' }) }));
    await until('synced', () => r.store.allSynced);
    assert.deepEqual(users(), ['cert:system:kube-proxy']);
  });

  it('honours expirationTimestamp: runs again once the credential expired', async () => {
    server.tokens.add('exec-token');
    const log = join(dir, 'exec.log');
    // expires 10.5 s ahead; refreshed 10 s before expiry: stale after ~0.5 s
    const r = start(kubeconfig({ exec: exec('client.authentication.k8s.io/v1', { KPNG_EXEC_LOG: log, KPNG_EXEC_TTL_MS: '10500' }) }));
    await until('synced and watching', () => r.store.allSynced && server.watchCount === 4);
    assert.equal(runs(log).length, 1);
    await new Promise((res) => setTimeout(res, 700));
    server.dropWatches();
    await receivesChanges(r, 'after-expiry');
    assert.ok(runs(log).length >= 2, `${runs(log).length} runs`);
  });

  it('runs the plugin again on 401 (a revoked token)', async () => {
    const tokenFile = join(dir, 'plugin-token');
    writeFileSync(tokenFile, 'good-token');
    const log = join(dir, 'exec.log');
    const r = start(kubeconfig({ exec: exec('client.authentication.k8s.io/v1', { KPNG_EXEC_LOG: log, KPNG_EXEC_TOKEN_FILE: tokenFile }) }));
    await until('synced and watching', () => r.store.allSynced && server.watchCount === 4);
    server.tokens.clear();
    server.tokens.add('new-token');
    writeFileSync(tokenFile, 'new-token');
    server.dropWatches();
    await receivesChanges(r, 'after-revocation');
    assert.equal(runs(log).length, 2);
  });

  it('a failing plugin is retried and its stderr logged', async () => {
    const r = start(kubeconfig({ exec: exec('client.authentication.k8s.io/v1', { KPNG_EXEC_FAIL: '1' }) }));
    await until('the failure logged', () => r.records.some((x) => x.level === WARN && /exec plugin .* failed \(exit 3\): exec-credential: no credentials for you/.test(x.msg)));
    assert.equal(r.store.allSynced, false);
  });

  it('a relative command with a path is relative to the kubeconfig; a missing one shows the install hint', async () => {
    server.tokens.add('exec-token');
    writeFileSync(join(dir, 'plugin.sh'), `#!/bin/sh\nexec "${process.execPath}" "${EXEC_PLUGIN}"\n`);
    chmodSync(join(dir, 'plugin.sh'), 0o755);
    const r = start(kubeconfig({ exec: { apiVersion: 'client.authentication.k8s.io/v1beta1', command: './plugin.sh' } }), { PATH: process.env.PATH ?? '' });
    await until('synced', () => r.store.allSynced);
    await r.stop();
    const r2 = start(kubeconfig({ exec: { apiVersion: 'client.authentication.k8s.io/v1', command: 'kpng-no-such-plugin', installHint: 'install it from example.com' } }), { PATH: process.env.PATH ?? '' });
    await until('the hint', () => r2.records.some((x) => /kpng-no-such-plugin: ENOENT \(install it from example\.com\)/.test(x.msg)));
  });
});

describe('kube source auth: in-cluster', () => {
  it('uses the service-account token and CA, and follows the token as it rotates', async () => {
    const sa = join(dir, 'serviceaccount');
    const { mkdirSync, copyFileSync } = await import('node:fs');
    mkdirSync(sa);
    copyFileSync(tlsFile('ca.crt'), join(sa, 'ca.crt'));
    writeFileSync(join(sa, 'token'), 'good-token');
    const port = new URL(server.url).port;
    const conn = resolveConnection({}, { KUBERNETES_SERVICE_HOST: '127.0.0.1', KUBERNETES_SERVICE_PORT: port, KPNG_SERVICEACCOUNT_DIR: sa });
    assert.match(conn.origin, /^in-cluster 127\.0\.0\.1:\d+/);
    run = startSource(server, conn);
    await until('synced and watching', () => run!.store.allSynced && server.watchCount === 4);
    // kubelet rotates the projected token; the old one is revoked
    server.tokens.clear();
    server.tokens.add('rotated');
    writeFileSync(join(sa, 'token'), 'rotated');
    server.dropWatches();
    await receivesChanges(run, 'after-rotation');
    assert.ok(users().includes('token:rotat'));
  });
});

describe('kube source auth: the API server\'s real address (no kube-proxy on the node)', () => {
  function serviceAccountDir(): string {
    const sa = join(dir, 'serviceaccount');
    mkdirSync(sa);
    copyFileSync(tlsFile('ca.crt'), join(sa, 'ca.crt'));
    writeFileSync(join(sa, 'token'), 'good-token');
    return sa;
  }

  it('--master https://HOST:PORT without a kubeconfig uses the pod\'s service-account token and CA', async () => {
    const sa = serviceAccountDir();
    // no KUBERNETES_SERVICE_HOST: the kubernetes Service is not reachable, only the real address is known
    const conn = resolveConnection({ master: server.url }, { KPNG_SERVICEACCOUNT_DIR: sa });
    assert.match(conn.origin, /^--master 127\.0\.0\.1:\d+ with the service-account credentials/);
    run = startSource(server, conn);
    await until('synced', () => run!.store.allSynced);
    assert.deepEqual(users(), ['token:good-']);
    assert.ok(server.requests.every((q) => q.status !== 401), 'no request went without the token');
  });

  it('--master over http, or without a mounted token, has no credentials', () => {
    const sa = serviceAccountDir();
    assert.match(resolveConnection({ master: 'http://127.0.0.1:8080' }, { KPNG_SERVICEACCOUNT_DIR: sa }).origin, /without credentials/);
    assert.match(resolveConnection({ master: server.url }, { KPNG_SERVICEACCOUNT_DIR: join(dir, 'none') }).origin, /without credentials/);
  });

  it('KUBERNETES_SERVICE_HOST/PORT set in the pod spec point in-cluster credentials at the real address', async () => {
    const sa = serviceAccountDir();
    const conn = resolveConnection({}, { KUBERNETES_SERVICE_HOST: '127.0.0.1', KUBERNETES_SERVICE_PORT: new URL(server.url).port, KPNG_SERVICEACCOUNT_DIR: sa });
    run = startSource(server, conn);
    await until('synced', () => run!.store.allSynced);
    assert.deepEqual(users(), ['token:good-']);
  });

  it("the kube-proxy configuration's clientConnection.kubeconfig names the server; --kubeconfig wins over it", () => {
    const kc = kubeconfig({ token: 'good-token' });
    const viaConfig = resolveConnection({ configKubeconfig: kc }, {});
    assert.equal(viaConfig.origin, `kubeconfig ${kc} context test`);
    const other = writeKubeconfig(join(dir, 'other'), { server: 'https://192.0.2.1:6443', ca: CA, user: { token: 'x' } });
    assert.equal(resolveConnection({ kubeconfig: other, configKubeconfig: kc }, {}).server.host, '192.0.2.1:6443');
    assert.throws(() => resolveConnection({ configKubeconfig: join(dir, 'nope') }, {}), /clientConnection\.kubeconfig: .*nope does not exist/);
  });
});

describe('credentials', () => {
  it('a token file is re-read once it is older than its max age, without waiting for a 401', async () => {
    const f = join(dir, 't');
    writeFileSync(f, 'one');
    const c = new TokenFileCredentials(f, 50);
    assert.equal((await c.get()).token, 'one');
    writeFileSync(f, 'two');
    assert.equal((await c.get()).token, 'one', 'cached');
    await new Promise((res) => setTimeout(res, 60));
    assert.equal((await c.get()).token, 'two');
    rmSync(f);
    await new Promise((res) => setTimeout(res, 60));
    assert.equal((await c.get()).token, 'two', 'mid-rotation (file missing): the last token');
  });

  it('an exec credential is fetched once for concurrent callers', async () => {
    const c = new ExecCredentials(
      { apiVersion: 'client.authentication.k8s.io/v1', command: process.execPath, args: [EXEC_PLUGIN], env: {}, provideClusterInfo: false, installHint: '' },
      { server: 'https://x', insecure: false },
      {},
    );
    const all = await Promise.all([c.get(), c.get(), c.get()]);
    assert.deepEqual(all.map((a) => a.token), ['exec-token', 'exec-token', 'exec-token']);
    assert.equal(c.runs, 1);
    assert.equal(c.invalidate(), true);
    await c.get();
    assert.equal(c.runs, 2);
  });
});
