// The healthCheckNodePort servers: update() resolves once the new servers
// listen, so a sync that awaits it is done only when a load balancer's
// health check can be answered.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { connect, createServer } from 'node:net';
import { HealthCheckServers } from '../../src/backends/shared/healthcheck.js';
import { freePort } from '../helpers/port.js';
import { createLogger } from '../../src/runtime/log.js';

/** whether something listens on 127.0.0.1:port right now (one attempt) */
function listening(port: number): Promise<boolean> {
  return new Promise((r) => {
    const s = connect({ host: '127.0.0.1', port });
    s.once('connect', () => (s.destroy(), r(true)));
    s.once('error', () => r(false));
  });
}

test('update() resolves once the new health-check servers listen; answers with kube-proxy body; servers stop when dropped', { timeout: 10_000 }, async () => {
  const servers = new HealthCheckServers(createLogger({ level: 'error' }), () => true, ['127.0.0.1']);
  try {
    const port = await freePort();
    const pending = servers.update([{ namespace: 'demo', name: 'lb', port, localEndpoints: 1 }]);
    assert.ok(pending instanceof Promise);
    await pending;
    const r = await fetch(`http://127.0.0.1:${port}/`);
    assert.equal(r.status, 200);
    assert.deepEqual(await r.json(), { service: { namespace: 'demo', name: 'lb' }, localEndpoints: 1, serviceProxyHealthy: true });
    await servers.update([{ namespace: 'demo', name: 'lb', port, localEndpoints: 0 }]);
    assert.equal((await fetch(`http://127.0.0.1:${port}/`)).status, 503);
    await servers.update([]);
    await new Promise((r) => setTimeout(r, 50));
    assert.equal(await listening(port), false);
    // a port taken by someone else: update still resolves (the failure is logged), so the sync that awaits it does not hang
    const other = await freePort();
    const taken = createServer();
    await new Promise<void>((r) => taken.listen(other, '127.0.0.1', r));
    try {
      await servers.update([{ namespace: 'demo', name: 'other', port: other, localEndpoints: 1 }]);
    } finally {
      taken.close();
    }
  } finally {
    await servers.close();
  }
});
