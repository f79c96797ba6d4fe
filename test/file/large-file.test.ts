// A large input file (tens of MB of Services and EndpointSlices) is parsed
// without stalling the event loop (health and metrics keep answering), and
// its memory is given back once it is gone; one too big for the memory
// there is does not take the process down.
import { test, type TestContext } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { writeFileSync, renameSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { Store } from '../../src/store/store.js';
import { FileSource } from '../../src/sources/file/index.js';
import { recordingLogger } from '../helpers/logs.js';
import { tmp, objects, yamlList } from './util.js';
import { service } from '../helpers/k8s.js';
import { KPNG, ROOT } from '../helpers/cli.js';
import { until } from '../helpers/until.js';

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;
const MB = (n: number) => Math.round(n / 2 ** 20);

async function loadWatched(t: TestContext, name: string, text: string, services: number) {
  const dir = tmp();
  const store = new Store();
  const source = new FileSource(store, recordingLogger().log, { input: dir.dir, debounceMs: 50 });
  try {
    await source.start();
    writeFileSync(join(dir.dir, `.${name}`), text);
    gc();
    const rssBefore = process.memoryUsage().rss;
    // the probe: a 10 ms timer and the event-loop delay histogram
    const delay = monitorEventLoopDelay({ resolution: 10 });
    delay.enable();
    let last = performance.now();
    let maxGap = 0;
    let peak = rssBefore;
    const probe = setInterval(() => {
      const now = performance.now();
      maxGap = Math.max(maxGap, now - last);
      last = now;
      peak = Math.max(peak, process.memoryUsage().rss);
    }, 10);
    const t0 = performance.now();
    renameSync(join(dir.dir, `.${name}`), join(dir.dir, name));
    let loadMs = 0;
    try {
      await until(`${services} Services`, () => [...store.serviceKeys()].length === services, { timeoutMs: 120_000 });
      loadMs = performance.now() - t0;
      // the probe must tick once more after the load: a stall that ends the wait is seen only then
      await new Promise((r) => setTimeout(r, 100));
    } finally {
      clearInterval(probe);
      delay.disable();
    }
    rmSync(join(dir.dir, name));
    await until('the Services to go', () => store.serviceKeys().next().done === true, { timeoutMs: 30_000 });
    await new Promise((r) => setTimeout(r, 3000)); // the parser's idle worker ends
    gc();
    const rssAfter = process.memoryUsage().rss;
    t.diagnostic(`${name} ${MB(text.length)} MB: loaded in ${Math.round(loadMs)} ms; longest timer gap ${Math.round(maxGap)} ms, event-loop delay max ${Math.round(delay.max / 1e6)} ms p99 ${Math.round(delay.percentile(99) / 1e6)} ms; RSS before ${MB(rssBefore)} MB, peak ${MB(peak)} MB, after removal ${MB(rssAfter)} MB`);
    const stall = Math.max(maxGap, delay.max / 1e6);
    assert.ok(stall < 500, `the event loop stalled for ${Math.round(stall)} ms`);
  } finally {
    await source.stop();
    dir.done();
  }
}

test('a 25 MB JSON List: timers keep firing while it loads', async (t) => {
  const items = objects(7000);
  await loadWatched(t, 'big.json', JSON.stringify({ apiVersion: 'v1', kind: 'List', items }, null, 4), 7000);
});

test('a 6 MB YAML List: timers keep firing while it loads', async (t) => {
  const items = objects(3500);
  await loadWatched(t, 'big.yaml', yamlList(items), 3500);
});

test('a file too big for the memory there is: refused with one line naming it; the process lives and loads the rest', async () => {
  const t = tmp();
  const big = join(t.dir, 'big.yaml');
  writeFileSync(big, yamlList(objects(3500)));
  writeFileSync(join(t.dir, 'small.yaml'), yamlList([service('ns', 'web', { clusterIP: '10.96.0.1' })]));
  // a heap limit the parse of 6 MB of YAML does not fit in (it takes ~400 MB)
  const child = spawn(KPNG[0], ['--max-old-space-size=128', KPNG[1], KPNG[2], join(ROOT, 'test/file/source-child.ts'), t.dir], { cwd: ROOT, stdio: ['pipe', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  child.stdout.on('data', (d) => (out += d));
  child.stderr.on('data', (d) => (err += d));
  const exited = new Promise((r) => child.on('exit', r));
  try {
    await until('the initial load', () => out.includes('keys ns/web\n') || child.exitCode !== null, { timeoutMs: 60_000, detail: () => `\nstdout:\n${out}\nstderr:\n${err}` });
    assert.equal(child.exitCode, null, `the process ended\n${err}`);
    const lines = out.split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l));
    const aboutBig = lines.filter((l) => l.file === big);
    assert.equal(aboutBig.length, 1, out);
    assert.match(aboutBig[0].err, /memory/);
  } finally {
    child.kill('SIGKILL');
    await exited;
    t.done();
  }
});
