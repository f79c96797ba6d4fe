// `kpng demo` as users run it (the README's first command): real traffic
// through a namespace cluster, a live change, the programmed table, kpng get
// and kpng trace; exit 0 and nothing left behind, also when interrupted.
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { KPNG_BIN, listNamespaces } from '../../src/lab/index.js';
import { backendLabUnsupported } from '../helpers/lab-kpng.js';
import { existsSync } from 'node:fs';
import { labCgroupUnsupported } from '../../src/lab/index.js';
import { libbpfUnavailable } from '../../src/backends/ebpf/libbpf.js';
import { skipOrFailInCI } from '../helpers/ci.js';

const skip = await backendLabUnsupported({ name: 'nft' });

function demo(opts: { interruptWhen?: RegExp; args?: string[] } = {}): Promise<{ code: number | null; out: string; ms: number }> {
  const t0 = Date.now();
  // its own process group, so that an interrupt reaches it and its children as Ctrl-C does
  const p = spawn(process.execPath, [KPNG_BIN, 'demo', ...(opts.args ?? [])], { detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let sent = false;
  const onData = (d: Buffer) => {
    out += d;
    if (opts.interruptWhen && !sent && opts.interruptWhen.test(out)) {
      sent = true;
      process.kill(-p.pid!, 'SIGINT');
    }
  };
  p.stdout.on('data', onData);
  p.stderr.on('data', onData);
  const timer = setTimeout(() => process.kill(-p.pid!, 'SIGKILL'), 90_000);
  return new Promise((resolve) =>
    p.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, out, ms: Date.now() - t0 });
    }),
  );
}

const stemOf = (out: string) => /namespaces (kpng-demo-\d+-[0-9a-f]+)-\*/.exec(out)?.[1];

describe('kpng demo', { skip }, () => {
  it('runs the example cluster, shows traffic spread and following a change, exits 0 and cleans up', async () => {
    const r = await demo();
    assert.equal(r.code, 0, r.out);
    assert.ok(r.ms < 60_000, `took ${r.ms} ms`);
    const stem = stemOf(r.out);
    assert.ok(stem, r.out);
    assert.deepEqual(listNamespaces().filter((n) => n.startsWith(stem!)), [], 'namespaces left behind');
    const row = (re: RegExp) => r.out.split('\n').find((l) => re.test(l)) ?? '';
    // ClusterIP from a pod: all three web pods, the client's address kept
    assert.match(row(/^\s+web\s+10\.96\.0\.10:80\/TCP\s+pod client/), /web-1 \d+, web-2 \d+, web-3 \d+\s+the client/);
    // NodePort from outside (eTP=Cluster): both nodes' pods, masqueraded by node-a
    assert.match(row(/^\s+echo\s+192\.168\.50\.2:30007\/TCP\s+outside/), /echo-1 \d+, echo-2 \d+\s+node-a \(.*masqueraded\)/);
    assert.match(row(/^\s+echo\s+192\.168\.50\.2:30007\/UDP\s+outside/), /echo-1 \d+, echo-2 \d+/);
    // LoadBalancer (eTP=Local) from outside: only node-a's pod, client address kept; from a pod: both
    assert.match(row(/^\s+shop\s+203\.0\.113\.10:80\/TCP\s+outside/), /shop-1 30\s+the client/);
    assert.match(row(/^\s+shop\s+203\.0\.113\.10:80\/TCP\s+pod client/), /shop-1 \d+, shop-2 \d+/);
    // the live change: web-4 joins, the removed pod no longer gets new connections
    const left = /\((web-\d) leaves its EndpointSlice\)/.exec(r.out)?.[1];
    assert.ok(left, r.out);
    const after = r.out.slice(r.out.indexOf('new connections follow'));
    const webRow = after.split('\n').find((l) => /^\s+web\s+10\.96\.0\.10/.test(l)) ?? '';
    assert.match(webRow, /web-4 \d+/);
    assert.ok(!webRow.includes(`${left} `), webRow);
    assert.match(r.out, new RegExp(`opened before the change is still answered by ${left}`));
    assert.match(r.out, /table ip kpng \{/);
    // it ends with kpng get services (from node-a's state socket) and kpng trace (from the kernel's rules)
    assert.match(r.out, /^\s+demo\s+shop\s+LoadBalancer\s+10\.96\.0\.30\s+203\.0\.113\.10\s+80:30080\/TCP\s+Cluster\/Local\s+2\/2\s+1\/2$/m);
    assert.match(r.out, /^\s+demo\s+api\s+ClusterIP\s+10\.96\.0\.40\s+<none>\s+80\/TCP\s+Cluster\/-\s+1\/2\s+-$/m);
    assert.match(r.out, /kpng trace --src 198\.51\.100\.7 --dst 203\.0\.113\.10 --dport 80/);
    assert.match(r.out, /verdict: DNAT to 10\.244\.1\.30:8080, not masqueraded \(demo\/shop:http\)/);
    assert.match(r.out, /externalTrafficPolicy: Local: this node's 1 endpoint only, the client's address kept/);
    // the traffic agrees: topology hints and the terminating fallback
    assert.match(row(/^\s+api\s+10\.96\.0\.40:80\/TCP\s+pod client/), /api-1 30\s/);
    assert.match(row(/^\s+jobs\s+10\.96\.0\.50:80\/TCP\s+pod client/), /jobs-1 30\s/);
    assert.match(r.out, /Cleaned up: kpng stopped \(exit 0\), \d+ network namespaces deleted/);
  });

  it('--backend userspace: kpng proxies the same traffic itself; endpoints see the node', async () => {
    const r = await demo({ args: ['--backend', 'userspace'] });
    assert.equal(r.code, 0, r.out);
    assert.match(r.out, /runs kpng with to-userspace/);
    const row = (re: RegExp) => r.out.split('\n').find((l) => re.test(l)) ?? '';
    assert.match(row(/^\s+web\s+10\.96\.0\.10:80\/TCP\s+pod client/), /web-1 \d+, web-2 \d+, web-3 \d+\s+node-a/);
    assert.match(row(/^\s+echo\s+192\.168\.50\.2:30007\/UDP\s+outside/), /echo-1 \d+, echo-2 \d+/);
    assert.match(r.out, /opened before the change is still answered by web-\d/);
    assert.match(r.out, /table inet kpng-userspace \{/);
    const stem = stemOf(r.out);
    assert.ok(stem, r.out);
    assert.deepEqual(listNamespaces().filter((n) => n.startsWith(stem!)), []);
  });

  it('on Ctrl-C, stops and removes everything it made', async () => {
    const r = await demo({ interruptWhen: /running: kpng/ });
    assert.equal(r.code, 0, r.out);
    assert.match(r.out, /Interrupted/);
    assert.match(r.out, /Cleaned up: .*network namespaces deleted/);
    const stem = stemOf(r.out);
    assert.ok(stem, r.out);
    assert.deepEqual(listNamespaces().filter((n) => n.startsWith(stem!)), []);
  });
});

const skipEbpf = skip || skipOrFailInCI(labCgroupUnsupported() ?? libbpfUnavailable());

describe('kpng demo --backend ebpf', { skip: skipEbpf }, () => {
  it('balances the pod client at its sockets (eBPF counter), outside traffic through to-nft; cleans up its cgroup and bpffs', async () => {
    const r = await demo({ args: ['--backend', 'ebpf'] });
    assert.equal(r.code, 0, r.out);
    const row = (re: RegExp) => r.out.split('\n').find((l) => re.test(l)) ?? '';
    assert.match(row(/^\s+web\s+10\.96\.0\.10:80\/TCP\s+pod client/), /web-1 \d+, web-2 \d+, web-3 \d+\s+the client/);
    assert.match(row(/^\s+echo\s+192\.168\.50\.2:30007\/TCP\s+outside/), /echo-1 \d+, echo-2 \d+\s+node-a \(.*masqueraded\)/);
    const translated = Number(/kpng_counters\): translated (\d+)/.exec(r.out)?.[1] ?? 0);
    assert.ok(translated >= 30, r.out);
    assert.match(r.out, /Cleaned up: kpng stopped \(exit 0\)/);
    // its own mount points (named on the command line it prints) are gone
    const made = [...r.out.matchAll(/(\/tmp\/kpng-(?:cgroup2|bpffs)-[A-Za-z0-9]+)/g)].map((m) => m[1]);
    assert.equal(new Set(made).size, 2, r.out);
    assert.deepEqual(made.filter((d) => existsSync(d)), [], 'cgroup2 or bpffs mount points left behind');
  });
});
