// The userspace proxy engine on loopback, in this process (no namespaces, no
// nftables: clients connect to the listener's port directly): TCP half-close
// and resets passed through, refused endpoints retried, no endpoints reset,
// listeners kept across endpoint changes, UDP sessions bounded and idle-timed.
import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, connect, type Server, type Socket } from 'node:net';
import { createSocket, type Socket as UdpSocket } from 'node:dgram';
import { spawn } from 'node:child_process';
import { UserspaceEngine, type ListenerSpec } from '../../src/backends/shared/userspace/engine.js';
import { registry } from '../../src/runtime/metrics.js';
import { createLogger } from '../../src/runtime/log.js';
import { until } from '../helpers/until.js';

const log = createLogger({ level: 'error' });
const closers: (() => unknown)[] = [];
after(async () => {
  for (const c of closers.reverse()) await c();
});

function tcpServer(onConn: (s: Socket) => void): Promise<number> {
  const srv: Server = createServer({ allowHalfOpen: true }, (s) => {
    s.on('error', () => {});
    onConn(s);
  });
  closers.push(() => new Promise((r) => srv.close(r)));
  return new Promise((r) => srv.listen(0, '127.0.0.1', () => r((srv.address() as { port: number }).port)));
}

function udpEcho(tag: string): Promise<number> {
  const s = createSocket('udp4');
  s.on('message', (m, r) => s.send(Buffer.concat([Buffer.from(`${tag}:`), m]), r.port, r.address));
  closers.push(() => s.close());
  return new Promise((r) => s.bind(0, '127.0.0.1', () => r(s.address().port)));
}

function engine(o: Partial<ConstructorParameters<typeof UserspaceEngine>[0]> = {}): UserspaceEngine {
  const e = new UserspaceEngine({ log, ...o });
  closers.push(() => e.close());
  return e;
}

const spec = (key: string, ports: number[], o: Partial<ListenerSpec> = {}): ListenerSpec => ({
  key,
  service: 'test/svc',
  protocol: 'tcp',
  family: 4,
  affinitySeconds: 0,
  host: '127.0.0.1',
  endpoints: ports.map((port) => ({ ip: '127.0.0.1', port })),
  ...o,
});

/** connects, writes what, half-closes, collects everything until the end or an error */
function exchange(port: number, what: string): Promise<{ data: string; error?: string }> {
  return new Promise((resolve) => {
    const c = connect({ host: '127.0.0.1', port, allowHalfOpen: true });
    let data = '';
    c.on('data', (d) => (data += d));
    c.on('end', () => c.end());
    c.on('close', () => resolve({ data }));
    c.on('error', (e: NodeJS.ErrnoException) => resolve({ data, error: e.code }));
    c.write(what);
    c.end();
  });
}

describe('userspace engine', () => {
  it('TCP half-close: the endpoint sees the end, answers after it, the client reads the answer', async () => {
    // answers only once the client's side ended: a relay that closed both ways would lose it
    const p = await tcpServer((s) => {
      let got = '';
      s.on('data', (d) => (got += d));
      s.on('end', () => setTimeout(() => s.end(`got ${got}`), 50));
    });
    const e = engine();
    await e.update([spec('a', [p])]);
    assert.deepEqual(await exchange(e.portOf('a')!, 'hello'), { data: 'got hello' });
  });

  it('a reset by the endpoint reaches the client as a reset', async () => {
    const p = await tcpServer((s) => s.once('data', () => s.resetAndDestroy()));
    const e = engine();
    await e.update([spec('a', [p])]);
    const r = await new Promise<string | undefined>((resolve) => {
      const c = connect({ host: '127.0.0.1', port: e.portOf('a')! }, () => c.write('x'));
      c.on('error', (err: NodeJS.ErrnoException) => resolve(err.code));
      c.on('close', () => resolve('closed without error'));
    });
    assert.equal(r, 'ECONNRESET');
  });

  it('round-robin over the endpoints; one that refuses is skipped; none at all resets the client', async () => {
    const a = await tcpServer((s) => s.end('a'));
    const b = await tcpServer((s) => s.end('b'));
    const dead = await tcpServer(() => {});
    const e = engine();
    await e.update([spec('rr', [a, b]), spec('none', [])]);
    const seen = [];
    for (let i = 0; i < 4; i++) seen.push((await exchange(e.portOf('rr')!, '')).data);
    assert.deepEqual(seen.sort(), ['a', 'a', 'b', 'b']);
    assert.equal((await exchange(e.portOf('none')!, 'x')).error, 'ECONNRESET');
    // a port nobody listens on any more: refused, the next endpoint is tried
    const deadPort = dead;
    await closers.splice(closers.length - 2, 1)[0]();
    await e.update([spec('rr', [deadPort, b])]);
    for (let i = 0; i < 4; i++) assert.equal((await exchange(e.portOf('rr')!, '')).data, 'b');
  });

  it('an endpoint that never answers the handshake is given up for the next one', async () => {
    // a listener whose accept queue is full: Linux drops further SYNs (a blackholed endpoint)
    const py = spawn('python3', ['-c', 'import socket,sys\ns=socket.socket()\ns.bind(("127.0.0.1",0))\ns.listen(0)\nprint(s.getsockname()[1],flush=True)\nsys.stdin.read()'], { stdio: ['pipe', 'pipe', 'inherit'] });
    closers.push(() => py.kill('SIGKILL'));
    const dead = await new Promise<number>((r) => py.stdout!.once('data', (d) => r(Number(String(d).trim()))));
    const fillers: Socket[] = [];
    for (let i = 0; i < 3; i++) fillers.push(connect({ host: '127.0.0.1', port: dead }).on('error', () => {}));
    closers.push(() => fillers.forEach((f) => f.destroy()));
    await new Promise((r) => setTimeout(r, 300));
    const good = await tcpServer((s) => s.end('good'));
    const e = engine({ connectTimeoutsMs: [300, 300, 300] });
    await e.update([spec('bh', [dead, good], { affinitySeconds: 0 })]);
    const t0 = Date.now();
    for (let i = 0; i < 2; i++) assert.equal((await exchange(e.portOf('bh')!, '')).data, 'good');
    assert.ok(Date.now() - t0 < 3000, `took ${Date.now() - t0} ms`);
  });

  it('an endpoint change keeps the listener (same port) and the open connections on their endpoint', async () => {
    const mk = (tag: string) => tcpServer((s) => (s.on('data', () => s.write(tag)), s.on('end', () => s.end())));
    const a = await mk('a');
    const b = await mk('b');
    const e = engine();
    await e.update([spec('k', [a])]);
    const port = e.portOf('k')!;
    const c = connect({ host: '127.0.0.1', port });
    closers.push(() => c.destroy());
    const ask = () => new Promise<string>((r) => (c.once('data', (d) => r(String(d))), c.write('?')));
    assert.equal(await ask(), 'a');
    await e.update([spec('k', [b])]);
    assert.equal(e.portOf('k'), port);
    assert.equal(await ask(), 'a', 'the open connection moved');
    assert.equal((await exchange(port, '?')).data, 'b');
    // the listener goes with its Service
    await e.update([]);
    assert.equal(e.portOf('k'), undefined);
    assert.equal((await exchange(port, '?')).error, 'ECONNREFUSED');
  });

  it('ClientIP affinity: one client sticks to one endpoint', async () => {
    const a = await tcpServer((s) => s.end('a'));
    const b = await tcpServer((s) => s.end('b'));
    const e = engine();
    await e.update([spec('s', [a, b], { affinitySeconds: 60 })]);
    const seen = new Set<string>();
    for (let i = 0; i < 6; i++) seen.add((await exchange(e.portOf('s')!, '')).data);
    assert.equal(seen.size, 1);
  });

  it('ClientIP affinity expires after its timeout without connections', async () => {
    const a = await tcpServer((s) => s.end('a'));
    const b = await tcpServer((s) => s.end('b'));
    const e = engine();
    await e.update([spec('x', [a, b], { affinitySeconds: 0.3 })]);
    const first = (await exchange(e.portOf('x')!, '')).data;
    assert.equal((await exchange(e.portOf('x')!, '')).data, first);
    await new Promise((r) => setTimeout(r, 500));
    // placed afresh: round-robin moves on to the other endpoint
    assert.notEqual((await exchange(e.portOf('x')!, '')).data, first);
  });

  it('affinity turned on for a Service keeps its listener and takes effect', async () => {
    const a = await tcpServer((s) => s.end('a'));
    const b = await tcpServer((s) => s.end('b'));
    const e = engine();
    await e.update([spec('t', [a, b])]);
    const port = e.portOf('t');
    const seen = new Set<string>();
    for (let i = 0; i < 4; i++) seen.add((await exchange(port!, '')).data);
    assert.equal(seen.size, 2);
    await e.update([spec('t', [a, b], { affinitySeconds: 60 })]);
    assert.equal(e.portOf('t'), port);
    seen.clear();
    for (let i = 0; i < 6; i++) seen.add((await exchange(port!, '')).data);
    assert.equal(seen.size, 1);
  });

  it('UDP: sessions per client, at most udpMaxSessions, closed after udpIdleMs', async () => {
    const ep = await udpEcho('ep');
    const e = engine({ udpIdleMs: 300, udpMaxSessions: 4 });
    await e.update([spec('u', [ep], { protocol: 'udp' })]);
    const port = e.portOf('u')!;
    const clients: UdpSocket[] = [];
    // one after the other: each session gets its answer before the bound closes it
    const answers: string[] = [];
    for (let i = 0; i < 10; i++) {
      const c = createSocket('udp4');
      clients.push(c);
      closers.push(() => c.close());
      answers.push(
        await new Promise<string>((r) => {
          const t = setTimeout(() => r('no answer'), 2000);
          c.once('message', (m) => (clearTimeout(t), r(String(m))));
          c.send(`c${i}`, port, '127.0.0.1');
        }),
      );
    }
    assert.deepEqual(answers.sort(), Array.from({ length: 10 }, (_, i) => `ep:c${i}`).sort());
    assert.ok(e.stats.udpSessions <= 4, `${e.stats.udpSessions} sessions`);
    await until('the idle sessions to be closed', () => e.stats.udpSessions === 0, { timeoutMs: 3000, everyMs: 50 });
    const text = await registry.getSingleMetricAsString('kpng_userspace_errors_total');
    assert.match(text, /reason="udp_session_evicted"[^\n]* 6/);
  });

  it('UDP: a session whose endpoint left the Service is closed; the client, still sending, reaches one that is there', async () => {
    const [a, b] = [await udpEcho('a'), await udpEcho('b')];
    // sessions never idle out here: only the endpoint change may move the client
    const e = engine({ udpIdleMs: 60_000 });
    await e.update([spec('u', [a, b], { protocol: 'udp' })]);
    const port = e.portOf('u')!;
    const c = createSocket('udp4');
    closers.push(() => c.close());
    const ask = () =>
      new Promise<string>((r) => {
        const t = setTimeout(() => r('no answer'), 2000);
        c.once('message', (m) => (clearTimeout(t), r(String(m).split(':')[0])));
        c.send('x', port, '127.0.0.1');
      });
    assert.equal(await ask(), 'a');
    assert.equal(await ask(), 'a', 'one session, one endpoint');
    await e.update([spec('u', [b], { protocol: 'udp' })]);
    assert.equal(await ask(), 'b');
    assert.equal(e.stats.udpSessions, 1);
  });

  it('past what the open files limit leaves it, a client is refused and counted; served again once others close', async () => {
    const p = await tcpServer((s) => {
      s.on('data', (d) => s.write(d));
      s.on('end', () => s.end());
    });
    // a limit of 264 keeps 66 for kpng: 198 for the engine, one listener: 197 sockets, 98 connections
    const e = engine({ openFilesLimit: 264 });
    await e.update([spec('cap', [p], { service: 'test/capacity' })]);
    const port = e.portOf('cap')!;
    assert.equal(e.stats.maxSockets, 197);
    const held: Socket[] = [];
    closers.push(() => held.forEach((s) => s.destroy()));
    const hold = () =>
      new Promise<'ok' | 'refused'>((r) => {
        const s = connect({ host: '127.0.0.1', port });
        held.push(s);
        s.once('data', () => r('ok'));
        s.on('error', () => r('refused'));
        s.on('close', () => r('refused'));
        s.write('x');
      });
    const first = await Promise.all(Array.from({ length: 98 }, hold));
    assert.deepEqual(new Set(first), new Set(['ok']));
    assert.equal(e.stats.sockets, 196);
    assert.equal(await hold(), 'refused');
    assert.match(await registry.getSingleMetricAsString('kpng_userspace_errors_total'), /service="test\/capacity",protocol="tcp",reason="capacity"} 1/);
    held.splice(0, 10).forEach((s) => s.destroy());
    const end = Date.now() + 3000;
    while (e.stats.sockets > 176 && Date.now() < end) await new Promise((r) => setTimeout(r, 20));
    assert.equal(await hold(), 'ok');
  });

  it('closing the engine ends both sides of a relayed connection', async () => {
    let endpointSide: Promise<void> | undefined;
    // an endpoint that never ends its side by itself
    const p = await tcpServer((s) => {
      endpointSide = new Promise((r) => s.on('close', () => r()));
      s.on('data', (d) => s.write(d));
    });
    const e = new UserspaceEngine({ log });
    await e.update([spec('end', [p])]);
    const c = connect({ host: '127.0.0.1', port: e.portOf('end')! });
    c.on('error', () => {});
    closers.push(() => c.destroy());
    await new Promise((r) => (c.once('data', r), c.write('x')));
    await e.close();
    const closed = await Promise.race([endpointSide!.then(() => true), new Promise<false>((r) => setTimeout(() => r(false), 3000))]);
    assert.ok(closed, 'the endpoint side is still open after close');
  });

  it('counts connections and bytes per Service', async () => {
    const p = await tcpServer((s) => s.on('data', (d) => s.end(d)));
    const e = engine();
    await e.update([spec('m', [p], { service: 'test/metrics' })]);
    await exchange(e.portOf('m')!, 'abcdef');
    await new Promise((r) => setTimeout(r, 50));
    const conns = await registry.getSingleMetricAsString('kpng_userspace_connections_total');
    assert.match(conns, /service="test\/metrics",protocol="tcp"} 1/);
    const bytes = await registry.getSingleMetricAsString('kpng_userspace_bytes_total');
    assert.match(bytes, /service="test\/metrics",protocol="tcp",direction="to_endpoint"} 6/);
    assert.match(bytes, /service="test\/metrics",protocol="tcp",direction="to_client"} 6/);
  });
});
