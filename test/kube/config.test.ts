// Finding the API server and credentials: --kubeconfig, KUBECONFIG lists,
// --context, --master, in-cluster, ~/.kube/config, and clear errors.
import { describe, it, beforeEach, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { stringify } from 'yaml';
import { resolveConnection } from '../../src/sources/kube/config.js';
import { ExecCredentials, NoCredentials, StaticCredentials, TokenFileCredentials } from '../../src/sources/kube/credentials.js';
import { ConfigError } from '../../src/runtime/errors.js';
import { tlsFile } from '../helpers/apiserver.js';

let dir: string;
beforeEach(() => (dir = mkdtempSync(join(tmpdir(), 'kpng-kubeconfig-'))));
afterEach(() => rmSync(dir, { recursive: true, force: true }));

function write(rel: string, doc: unknown): string {
  const p = join(dir, rel);
  mkdirSync(join(p, '..'), { recursive: true });
  writeFileSync(p, typeof doc === 'string' ? doc : stringify(doc));
  return p;
}

const cluster = (name: string, server: string, extra: Record<string, unknown> = {}) => ({ name, cluster: { server, ...extra } });
const user = (name: string, u: Record<string, unknown>) => ({ name, user: u });
const context = (name: string, c: string, u: string) => ({ name, context: { cluster: c, user: u } });

function throwsConfig(fn: () => unknown, field: RegExp, reason: RegExp) {
  assert.throws(fn, (e: unknown) => {
    assert.ok(e instanceof ConfigError, String(e));
    assert.match(e.field, field);
    assert.match(e.reason, reason);
    return true;
  });
}

describe('kube source config', () => {
  it('KUBECONFIG merges a list: the first file to set a name or current-context wins; paths are relative to their file', () => {
    copy('a/ca.crt', tlsFile('ca.crt'));
    copy('b/client.crt', tlsFile('client.crt'));
    copy('b/client.key', tlsFile('client.key'));
    const a = write('a/config', {
      'current-context': 'one',
      clusters: [cluster('c1', 'https://one.example:6443', { 'certificate-authority': 'ca.crt' })],
      contexts: [context('one', 'c1', 'u1')],
      users: [user('u1', { token: 'first' })],
    });
    const b = write('b/config', {
      'current-context': 'two',
      clusters: [cluster('c1', 'https://ignored.example'), cluster('c2', 'https://two.example')],
      contexts: [context('two', 'c2', 'u2')],
      users: [user('u1', { token: 'ignored' }), user('u2', { 'client-certificate': 'client.crt', 'client-key': 'client.key' })],
    });
    const env = { KUBECONFIG: `${a}:${join(dir, 'missing')}:${b}` };
    const one = resolveConnection({}, env);
    assert.equal(one.server.href, 'https://one.example:6443/');
    assert.deepEqual(one.tls.ca, readFileSync(tlsFile('ca.crt')));
    assert.ok(one.credentials instanceof StaticCredentials);
    assert.equal(one.origin, `kubeconfig ${a}:${b} context one`);

    const two = resolveConnection({ context: 'two' }, env);
    assert.equal(two.server.href, 'https://two.example/');
    assert.deepEqual(two.tls.cert, readFileSync(tlsFile('client.crt')));
    assert.deepEqual(two.tls.key, readFileSync(tlsFile('client.key')));
  });

  it('--kubeconfig wins over KUBECONFIG; --master overrides the server', () => {
    const k = write('k', { 'current-context': 'x', clusters: [cluster('c', 'https://k.example')], contexts: [context('x', 'c', 'u')], users: [user('u', { tokenFile: 'tok' })] });
    const e = write('e', { 'current-context': 'x', clusters: [cluster('c', 'https://e.example')], contexts: [context('x', 'c', 'u')], users: [user('u', {})] });
    const c = resolveConnection({ kubeconfig: k }, { KUBECONFIG: e });
    assert.equal(c.server.host, 'k.example');
    assert.ok(c.credentials instanceof TokenFileCredentials);
    assert.equal((c.credentials as TokenFileCredentials).path, join(dir, 'tok'));
    assert.equal(resolveConnection({ kubeconfig: k, master: 'https://m.example:8443' }, {}).server.host, 'm.example:8443');
  });

  it('--master alone wins over in-cluster: that server, no credentials', () => {
    const c = resolveConnection({ master: 'http://127.0.0.1:8080' }, { KUBERNETES_SERVICE_HOST: '10.0.0.1', KUBERNETES_SERVICE_PORT: '443' });
    assert.equal(c.server.href, 'http://127.0.0.1:8080/');
    assert.ok(c.credentials instanceof NoCredentials);
  });

  it('in-cluster: KUBERNETES_SERVICE_HOST/PORT (IPv6 too), the service-account token and CA', () => {
    const sa = join(dir, 'sa');
    mkdirSync(sa);
    writeFileSync(join(sa, 'token'), 'sa-token');
    copy('sa/ca.crt', tlsFile('ca.crt'));
    const c = resolveConnection({}, { KUBERNETES_SERVICE_HOST: 'fd00::1', KUBERNETES_SERVICE_PORT: '443', KPNG_SERVICEACCOUNT_DIR: sa });
    assert.equal(c.server.href, 'https://[fd00::1]/');
    assert.ok(c.credentials instanceof TokenFileCredentials);
    assert.deepEqual(c.tls.ca, readFileSync(tlsFile('ca.crt')));
    throwsConfig(() => resolveConnection({}, { KUBERNETES_SERVICE_HOST: '10.0.0.1', KUBERNETES_SERVICE_PORT: '443', KPNG_SERVICEACCOUNT_DIR: join(dir, 'none') }), /in-cluster/, /token does not exist/);
  });

  it('~/.kube/config last; nothing at all is a clear error', () => {
    write('home/.kube/config', { 'current-context': 'x', clusters: [cluster('c', 'https://home.example')], contexts: [context('x', 'c', 'u')], users: [user('u', { username: 'admin', password: 'pw' })] });
    const c = resolveConnection({}, { HOME: join(dir, 'home') });
    assert.equal(c.server.host, 'home.example');
    assert.ok(c.credentials instanceof StaticCredentials);
    throwsConfig(() => resolveConnection({}, { HOME: join(dir, 'nohome') }), /--kubeconfig/, /no kubeconfig/);
  });

  it('exec: parsed with env, and a relative command resolved against the kubeconfig', () => {
    const k = write('x/k', {
      'current-context': 'x',
      clusters: [cluster('c', 'https://e.example', { 'insecure-skip-tls-verify': true, 'tls-server-name': 'api.internal' })],
      contexts: [context('x', 'c', 'u')],
      users: [user('u', { exec: { apiVersion: 'client.authentication.k8s.io/v1', command: './bin/plugin', args: ['a'], env: [{ name: 'K', value: 'V' }] } })],
    });
    const c = resolveConnection({ kubeconfig: k }, {});
    assert.ok(c.credentials instanceof ExecCredentials);
    assert.equal(c.tls.insecure, true);
    assert.equal(c.tls.servername, 'api.internal');
    assert.deepEqual((c.credentials as any).cfg, { apiVersion: 'client.authentication.k8s.io/v1', command: join(dir, 'x/bin/plugin'), args: ['a'], env: { K: 'V' }, provideClusterInfo: false, installHint: '' });
  });

  it('errors name the flag, file or field', () => {
    throwsConfig(() => resolveConnection({ kubeconfig: join(dir, 'nope') }, {}), /--kubeconfig/, /does not exist/);
    const base = { clusters: [cluster('c', 'https://x')], contexts: [context('x', 'c', 'u')] };
    const k = (u: Record<string, unknown>, extra: Record<string, unknown> = {}) => write('k', { 'current-context': 'x', ...base, users: [user('u', u)], ...extra });
    throwsConfig(() => resolveConnection({ kubeconfig: k({}), context: 'nope' }, {}), /--context/, /context "nope" not found/);
    throwsConfig(() => resolveConnection({ kubeconfig: k({ 'client-certificate': tlsFile('client.crt') }) }, {}), /client-key/, /needs both/);
    throwsConfig(() => resolveConnection({ kubeconfig: k({ 'auth-provider': { name: 'oidc' } }) }, {}), /auth-provider/, /not supported/);
    throwsConfig(() => resolveConnection({ kubeconfig: k({ exec: { apiVersion: 'client.authentication.k8s.io/v1alpha1', command: 'x' } }) }, {}), /exec\.apiVersion/, /v1 or v1beta1/);
    throwsConfig(() => resolveConnection({ kubeconfig: k({ 'client-key': 'missing.key', 'client-certificate': 'missing.crt' }) }, {}), /client-certificate/, /cannot read .*ENOENT/);
    throwsConfig(() => resolveConnection({ kubeconfig: write('bad', 'clusters: [') }, {}), /bad/, /cannot read kubeconfig/);
    throwsConfig(() => resolveConnection({ kubeconfig: k({}), master: 'ftp://x' }, {}), /--master/, /only https/);
    throwsConfig(() => resolveConnection({ kubeconfig: write('k2', { ...base, users: [user('u', {})] }) }, {}), /k2/, /no current-context/);
  });
});

function copy(rel: string, from: string) {
  const p = join(dir, rel);
  mkdirSync(join(p, '..'), { recursive: true });
  writeFileSync(p, readFileSync(from));
}
