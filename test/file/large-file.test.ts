// A large input file (tens of MB of Services and EndpointSlices) is parsed
// without stalling the event loop (health and metrics keep answering), and
// its memory is given back once it is gone.
import { test, type TestContext } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync, renameSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { Store } from '../../src/store/store.js';
import { FileSource } from '../../src/sources/file/index.js';
import { service, slice } from '../helpers/k8s.js';
import { recordingLogger } from '../helpers/logs.js';
import { tmp, until } from './util.js';

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;
const MB = (n: number) => Math.round(n / 2 ** 20);

function objects(n: number): unknown[] {
  const items: unknown[] = [];
  for (let i = 0; i < n; i++) {
    const ip = `10.${96 + (i >> 16)}.${(i >> 8) & 255}.${i & 255}`;
    items.push(service(`ns${i % 50}`, `svc-${i}`, { clusterIP: ip, ports: [{ name: 'http', port: 80, targetPort: 8080 }, { name: 'https', port: 443, targetPort: 8443 }] }, { metadata: { labels: { app: `app-${i}`, tier: 'web' }, annotations: { note: `service number ${i}` }, uid: `uid-${i}`, resourceVersion: String(1000 + i) } }));
    items.push(slice(`ns${i % 50}`, `svc-${i}-abcde`, `svc-${i}`, [0, 1, 2].map((k) => ({ ip: `10.${(i >> 8) & 255}.${i & 255}.${k + 1}`, node: `node-${k}`, zone: `z${k}`, pod: `pod-${i}-${k}` })), [{ name: 'http', port: 8080 }, { name: 'https', port: 8443 }]));
  }
  return items;
}

/** YAML as kubectl prints a List, built as text (the yaml library takes long to print this much) */
function yamlList(items: unknown[]): string {
  const out = ['apiVersion: v1', 'kind: List', 'metadata:', '  resourceVersion: ""', 'items:'];
  const emit = (v: unknown, indent: string, lines: string[], first: string) => {
    // first: what goes before the first line (a "- " for a list item)
    if (Array.isArray(v)) {
      if (!v.length) return void lines.push(`${first}[]`);
      v.forEach((x, i) => emit(x, indent + '  ', lines, i === 0 && first ? first + '- ' : indent + '- '));
      return;
    }
    if (v && typeof v === 'object') {
      const entries = Object.entries(v).filter(([, x]) => x !== undefined);
      if (!entries.length) return void lines.push(`${first}{}`);
      entries.forEach(([k, x], i) => {
        const lead = i === 0 ? first : indent;
        if (x && typeof x === 'object' && (Array.isArray(x) ? x.length : Object.keys(x).length)) {
          lines.push(`${lead}${k}:`);
          emit(x, indent + '  ', lines, indent + '  ');
        } else emit(x, indent + '  ', lines, `${lead}${k}: `);
      });
      return;
    }
    lines.push(`${first}${JSON.stringify(v)}`);
  };
  for (const it of items) emit(it, '    ', out, '  - ');
  return out.join('\n') + '\n';
}

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
      await until(() => [...store.serviceKeys()].length === services, `${services} Services`, 120_000);
      loadMs = performance.now() - t0;
      // the probe must tick once more after the load: a stall that ends the wait is seen only then
      await new Promise((r) => setTimeout(r, 100));
    } finally {
      clearInterval(probe);
      delay.disable();
    }
    rmSync(join(dir.dir, name));
    await until(() => store.serviceKeys().next().done === true, 'the Services to go', 30_000);
    await new Promise((r) => setTimeout(r, 3000)); // the parser's idle worker ends
    gc();
    const rssAfter = process.memoryUsage().rss;
    t.diagnostic(`${name} ${MB(text.length)} MB: loaded in ${Math.round(loadMs)} ms; longest timer gap ${Math.round(maxGap)} ms, event-loop delay max ${Math.round(delay.max / 1e6)} ms p99 ${Math.round(delay.percentile(99) / 1e6)} ms; RSS before ${MB(rssBefore)} MB, peak ${MB(peak)} MB, after removal ${MB(rssAfter)} MB`);
    const stall = Math.max(maxGap, delay.max / 1e6);
    assert.ok(stall < 300, `the event loop stalled for ${Math.round(stall)} ms`);
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
