// One kpng per node: a second node agent is refused with one line naming the
// first (pid, version, since when, its command), before it starts a backend,
// and the first's state socket keeps answering `kpng get` after the second
// exits. Below that: a server never removes a socket file it did not bind,
// neither one it found live nor one that replaced its own.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, rmSync, unlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { kpngSpawn, kpngSync, ROOT } from '../helpers/cli.js';
import { startStateSocket } from '../../src/sinks/api/state-socket.js';
import { ServiceViews } from '../../src/localstate/views.js';
import { fetchState } from '../../src/get/fetch.js';
import { quiet, smallCluster, syncedStore } from '../api/helpers.js';

const EXAMPLE = join(ROOT, 'examples/cluster.yaml');

let dir: string;
before(() => (dir = mkdtempSync(join(tmpdir(), 'kpng-lock-'))));
after(() => rmSync(dir, { recursive: true, force: true }));

test('a second node agent on the node is refused, naming the first; the first still answers kpng get', { timeout: 90_000 }, async () => {
  const sock = join(dir, 'node.sock');
  const agent = (node: string) => kpngSpawn(['file', '--input', EXAMPLE, '--node-name', node, 'to-local', '--state-socket', `unix://${sock}`, 'to-log']);
  const first = agent('node-a');
  try {
    await first.until('the first agent serving', () => first.stderr.includes('state socket: serving'));
    const lock = JSON.parse(readFileSync(join(dir, 'kpng.lock'), 'utf8'));
    assert.equal(lock.pid, first.process.pid);
    assert.equal(lock.node, 'node-a');

    const second = agent('node-a');
    let timer: NodeJS.Timeout | undefined;
    const code = await Promise.race([second.exited, new Promise((r) => (timer = setTimeout(() => r('still running'), 30_000)))]);
    clearTimeout(timer);
    await second.stop();
    assert.equal(code, 1, `the second agent was not refused:\n${second.stderr}`);
    const lines = second.stderr.trim().split('\n');
    assert.equal(lines.length, 1, second.stderr);
    assert.match(lines[0]!, new RegExp(`another kpng node agent runs on this node: kpng \\S+ pid ${first.process.pid} \\(node node-a, since \\d{4}-.*to-local.*\\) holds ${join(dir, 'kpng.lock')}; stop it first`));
    assert.equal(second.stdout, '', 'the second one did nothing');

    assert.ok(existsSync(sock), "the first agent's socket is still there");
    const get = kpngSync(['get', 'services', '--socket', sock]);
    assert.equal(get.status, 0, get.stderr);
    assert.match(get.stdout, /^demo\s+web\s+ClusterIP\s+10\.96\.0\.10/m);
  } finally {
    await first.stop();
  }
  // the lock went with the first agent: a new one starts
  const next = agent('node-a');
  try {
    await next.until('an agent after the first one stopped', () => next.stderr.includes('state socket: serving'));
  } finally {
    await next.stop();
  }
});

test('a state socket never removes a socket file it did not bind', async () => {
  const store = syncedStore(smallCluster());
  const views = new ServiceViews(store);
  const path = join(dir, 'state.sock');
  const address = `unix://${path}`;
  const open = () => startStateSocket({ address, store, views, log: quiet, defaultNode: 'node-a' });

  const a = await open();
  assert.ok(a);
  // a second server finds the path served: it does not serve, and going away leaves the first's file
  assert.equal(await open(), undefined);
  assert.ok(existsSync(path));
  assert.ok((await fetchState(address)).services.length > 0, 'the first one answers');

  // someone replaced the file (another process bound the path anew): stopping the first leaves the new one
  unlinkSync(path);
  const b = await open();
  assert.ok(b);
  await a!.stop();
  assert.ok(existsSync(path), 'the newer socket is still there');
  assert.ok((await fetchState(address)).services.length > 0, 'and answers');
  await b!.stop();
  assert.equal(existsSync(path), false, 'its own file goes with it');
});
