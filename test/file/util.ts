// What the file source's tests share: temp dirs, waiting, kubectl-like files,
// child processes that are always stopped.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, dirname, join } from 'node:path';
import { stringify } from 'yaml';
import { service, slice } from '../helpers/k8s.js';
import { recordingLogger } from '../helpers/logs.js';
import { Store } from '../../src/store/store.js';
import { FileSource, type FileSourceOptions } from '../../src/sources/file/index.js';

export function tmp(): { dir: string; done: () => void } {
  const dir = mkdtempSync(join(tmpdir(), 'kpng-file-'));
  // (retried: a test's writer may still be ending when the test does)
  return { dir, done: () => rmSync(dir, { recursive: true, force: true, maxRetries: 5, retryDelay: 50 }) };
}

/** as editors and config tools save a file: written aside under a dot name (never read), then renamed over it */
export function saveByRename(file: string, text: string): void {
  const aside = join(dirname(file), `.${basename(file)}.tmp`);
  writeFileSync(aside, text);
  renameSync(aside, file);
}

export interface FollowedDir {
  dir: string;
  store: Store;
  src: FileSource;
  rec: ReturnType<typeof recordingLogger>;
}

/**
 * A started FileSource following a new temporary directory that prepare
 * filled; stopped and the directory removed after body, also when it fails.
 */
export async function followDir(opts: Omit<FileSourceOptions, 'input'>, prepare: (dir: string) => void, body: (f: FollowedDir) => Promise<void>): Promise<void> {
  const t = tmp();
  const store = new Store();
  const rec = recordingLogger();
  const src = new FileSource(store, rec.log, { ...opts, input: t.dir });
  try {
    prepare(t.dir);
    await src.start();
    await body({ dir: t.dir, store, src, rec });
  } finally {
    await src.stop();
    t.done();
  }
}

/** n Services (and an EndpointSlice each) in namespace ns, as `kubectl get -o yaml` prints a List */
export function kubectlList(ns: string, n: number, from = 0): { text: string; keys: string[] } {
  const items: unknown[] = [];
  const keys: string[] = [];
  for (let i = from; i < from + n; i++) {
    const ip = `10.${96 + (i >> 16)}.${(i >> 8) & 255}.${i & 255}`;
    items.push(service(ns, `svc-${i}`, { clusterIP: ip, ports: [{ name: 'http', port: 80, targetPort: 8080 }] }, { metadata: { labels: { app: `app-${i}` }, uid: `uid-${i}` } }));
    items.push(slice(ns, `svc-${i}-x1`, `svc-${i}`, [{ ip: `10.1.${(i >> 8) & 255}.${i & 255}`, node: 'n1', pod: `p-${i}` }]));
    keys.push(`${ns}/svc-${i}`);
  }
  return { text: stringify({ apiVersion: 'v1', kind: 'List', items, metadata: { resourceVersion: '' } }), keys };
}

/** a shell command as a child process, killed at the latest by stop() */
export function shell(script: string, cwd?: string) {
  // a process group of its own: stop() kills the commands the shell runs too
  // (a shell killed alone left its `mkdir -p` creating what the test's
  // cleanup was removing: ENOTEMPTY)
  const p: ChildProcess = spawn('sh', ['-c', script], { cwd, stdio: ['ignore', 'ignore', 'pipe'], detached: true });
  let stderr = '';
  p.stderr!.on('data', (d) => (stderr += d));
  const exited = new Promise<number | null>((r) => p.on('exit', (code) => r(code)));
  return {
    exited,
    get stderr() { return stderr; },
    get running() { return p.exitCode === null && p.signalCode === null; },
    async stop() {
      if (p.exitCode === null && p.signalCode === null) {
        try {
          process.kill(-p.pid!, 'SIGKILL');
        } catch {
          p.kill('SIGKILL');
        }
        await exited;
      }
    },
  };
}

/** n Services with a 3-endpoint EndpointSlice each, in 50 namespaces, with the metadata kubectl prints */
export function objects(n: number): unknown[] {
  const items: unknown[] = [];
  for (let i = 0; i < n; i++) {
    const ip = `10.${96 + (i >> 16)}.${(i >> 8) & 255}.${i & 255}`;
    items.push(service(`ns${i % 50}`, `svc-${i}`, { clusterIP: ip, ports: [{ name: 'http', port: 80, targetPort: 8080 }, { name: 'https', port: 443, targetPort: 8443 }] }, { metadata: { labels: { app: `app-${i}`, tier: 'web' }, annotations: { note: `service number ${i}` }, uid: `uid-${i}`, resourceVersion: String(1000 + i) } }));
    items.push(slice(`ns${i % 50}`, `svc-${i}-abcde`, `svc-${i}`, [0, 1, 2].map((k) => ({ ip: `10.${(i >> 8) & 255}.${i & 255}.${k + 1}`, node: `node-${k}`, zone: `z${k}`, pod: `pod-${i}-${k}` })), [{ name: 'http', port: 8080 }, { name: 'https', port: 8443 }]));
  }
  return items;
}

/** YAML as kubectl prints a List, built as text (the yaml library takes long to print this much) */
export function yamlList(items: unknown[]): string {
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
