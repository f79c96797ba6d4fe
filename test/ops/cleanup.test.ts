// kpng cleanup removes what kpng installed, and nothing else; what it cannot
// remove it reports (one line each, exit status 1) after cleaning the rest.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { canUseNetns, createNetns, type TestNetns } from '../helpers/netns.js';
import { MODES, iptablesUnsupported } from '../helpers/iptables.js';
import { KPNG, ROOT } from '../helpers/cli.js';
import { parseSave, toolName, type IptablesMode } from '../../src/backends/iptables/iptables.js';
import { jumpTarget, ruleArgs } from '../../src/backends/iptables/rule-args.js';
import { tableCleanup } from '../../src/backends/iptables/cleanup.js';
import type { Family } from '../../src/api/ip.js';

/** skipped where it cannot run, except in CI, where it fails (the body asserts why is undefined) */
const unless = (why: string | undefined) => ({ skip: why && process.env.CI !== 'true' ? why : false });

/** kpng run inside the namespace (it never sees the root namespace) */
function kpngIn(ns: TestNetns, args: string[], env: NodeJS.ProcessEnv = {}) {
  return spawnSync('ip', ['netns', 'exec', ns.name, ...KPNG, ...args], { cwd: ROOT, encoding: 'utf8', timeout: 60_000, env: { ...process.env, ...env } });
}

/** kpng to-iptables on the example cluster, once, in the namespace: both families, filter and nat */
function applyIptables(ns: TestNetns, mode: IptablesMode): void {
  const r = kpngIn(ns, ['file', '--input', join(ROOT, 'examples/cluster.yaml'), '--node-name', 'node-a', 'to-local', 'to-iptables', '--iptables-mode', mode, '--once']);
  assert.equal(r.status, 0, r.stderr);
}

const saveOf = (ns: TestNetns, mode: IptablesMode, family: Family) => ns.exec(toolName(family, mode, 'save'), []);
/** one table of iptables-save output, without the timestamped comment lines */
const tableOf = (text: string, table: string) => (new RegExp(`^\\*${table}\\n[^]*?^COMMIT$`, 'm').exec(text)?.[0] ?? '').replace(/^#.*\n/gm, '');
const ipt = (ns: TestNetns, mode: IptablesMode, family: Family, args: string[]) => ns.exec(toolName(family, mode, ''), ['-w', '5', ...args]);

/** every chain kpng writes, except KUBE-FIREWALL (which stays) */
const KPNG_CHAINS = /KUBE-(SERVICES|NODEPORTS|POSTROUTING|MARK-MASQ|SVC-|SVL-|SEP-|EXT-|FW-|FORWARD|EXTERNAL-SERVICES|PROXY-FIREWALL|PROXY-CANARY)/;
/** iptables-save output without its comments (which may name kpng's chains) */
const uncommented = (text: string) => text.replace(/--comment ("(?:[^"\\]|\\.)*"|\S+)/g, '--comment _');

test('a saved rule splits as iptables-restore splits it, and its jump target is the last -j/-g, never text in a comment', () => {
  assert.deepEqual(ruleArgs('-A INPUT -p tcp -m comment --comment "ssh; was: -j KUBE-SERVICES" -j ACCEPT'), ['-A', 'INPUT', '-p', 'tcp', '-m', 'comment', '--comment', 'ssh; was: -j KUBE-SERVICES', '-j', 'ACCEPT']);
  // iptables-save escapes " \\ and ' inside quotes
  assert.deepEqual(ruleArgs(String.raw`-A X -m comment --comment "say \"-j KUBE-NODEPORTS\" \\ it\'s" -j RETURN`), ['-A', 'X', '-m', 'comment', '--comment', `say "-j KUBE-NODEPORTS" \\ it's`, '-j', 'RETURN']);
  assert.deepEqual(ruleArgs('-A X\t-m comment --comment ""  -j Y '), ['-A', 'X', '-m', 'comment', '--comment', '', '-j', 'Y']);
  const cases: [string, string | undefined][] = [
    ['-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES', 'KUBE-SERVICES'],
    ['-A MYFILTER -g KUBE-NODEPORTS', 'KUBE-NODEPORTS'],
    ['-A INPUT -p tcp -m comment --comment "ssh; was: -j KUBE-SERVICES before" -j ACCEPT', 'ACCEPT'],
    ['-A OUTPUT -m comment --comment "-j KUBE-SERVICES"', undefined],
    // a comment that is just "-j" is not quoted by iptables-save
    ['-A OUTPUT -m comment --comment -j -j KUBE-SERVICES', 'KUBE-SERVICES'],
    ['-A OUTPUT -m comment --comment -j', undefined],
    ['-A KUBE-SEP-X -p tcp -m tcp -j DNAT --to-destination 10.0.0.1:80', undefined],
    ['-A INPUT', undefined],
  ];
  for (const [rule, target] of cases) assert.equal(jumpTarget(rule), target, rule);
});

test("a table's cleanup deletes the rules of other chains that jump to kpng's, then flushes and deletes kpng's chains", () => {
  const nat = parseSave(
    [
      '*nat',
      ':PREROUTING ACCEPT [0:0]',
      ':MYCHAIN - [0:0]',
      ':KUBE-SERVICES - [0:0]',
      ':KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]',
      ':KUBE-KUBELET-CANARY - [0:0]',
      '-A PREROUTING -m comment --comment "not -j KUBE-SERVICES here" -j MYCHAIN',
      '-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
      '-A MYCHAIN -g KUBE-SVC-AAAAAAAAAAAAAAAA',
      '-A MYCHAIN -j RETURN',
      '-A KUBE-SERVICES -d 10.0.0.1/32 -j KUBE-SVC-AAAAAAAAAAAAAAAA',
      'COMMIT',
    ].join('\n'),
  ).get('nat')!;
  const c = tableCleanup('nat', nat)!;
  assert.equal(
    c.input,
    [
      '*nat',
      '-D PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
      '-D MYCHAIN -g KUBE-SVC-AAAAAAAAAAAAAAAA',
      '-F KUBE-SERVICES',
      '-F KUBE-SVC-AAAAAAAAAAAAAAAA',
      '-X KUBE-SERVICES',
      '-X KUBE-SVC-AAAAAAAAAAAAAAAA',
      'COMMIT',
      '',
    ].join('\n'),
  );
  assert.deepEqual([c.jumps, c.from], [2, ['PREROUTING', 'MYCHAIN']]);
  // nothing of kpng's: nothing to do; raw is never kpng's
  assert.equal(tableCleanup('nat', parseSave('*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-FIREWALL - [0:0]\nCOMMIT\n').get('nat')!), undefined);
  assert.equal(tableCleanup('raw', parseSave('*raw\n:KUBE-SERVICES - [0:0]\nCOMMIT\n').get('raw')!), undefined);
});

test('kpng cleanup in a namespace leaves a foreign table untouched', unless(canUseNetns()), () => {
  assert.equal(canUseNetns(), undefined);
  const ns = createNetns();
  try {
    const foreign = 'table inet foreign {\n\tchain input {\n\t\ttype filter hook input priority filter; policy accept;\n\t\ttcp dport 22 accept\n\t}\n}\n';
    ns.exec('nft', ['-f', '-'], foreign);
    const applied = kpngIn(ns, ['file', '--input', join(ROOT, 'examples/cluster.yaml'), '--node-name', 'node-a', 'to-local', 'to-nft', '--once']);
    assert.equal(applied.status, 0, applied.stderr);
    assert.match(ns.exec('nft', ['list', 'tables']), /table ip kpng/);

    const r = kpngIn(ns, ['cleanup']);
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /removed nftables table ip kpng/);
    assert.match(r.stdout, /removed nftables table ip6 kpng/);
    assert.equal(ns.exec('nft', ['list', 'tables']).trim(), 'table inet foreign');
    assert.equal(ns.exec('nft', ['list', 'table', 'inet', 'foreign']), foreign);
    // and a second cleanup finds nothing to do
    const again = kpngIn(ns, ['cleanup']);
    assert.equal(again.status, 0, again.stderr);
    assert.doesNotMatch(again.stdout, /removed/);
  } finally {
    ns.remove();
  }
});

test('kpng cleanup removes to-userspace\'s redirect table (inet kpng-userspace), and a foreign table stays', unless(canUseNetns()), () => {
  assert.equal(canUseNetns(), undefined);
  const ns = createNetns();
  try {
    ns.exec('nft', ['add', 'table', 'inet', 'foreign']);
    const applied = kpngIn(ns, ['file', '--input', join(ROOT, 'examples/cluster.yaml'), '--node-name', 'node-a', 'to-local', 'to-userspace', '--once']);
    assert.equal(applied.status, 0, applied.stderr);
    assert.match(ns.exec('nft', ['list', 'table', 'inet', 'kpng-userspace']), /redirect to :ip daddr/);
    const r = kpngIn(ns, ['cleanup', '--backend', 'userspace']);
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /removed nftables table inet kpng-userspace/);
    assert.equal(ns.exec('nft', ['list', 'tables']).trim(), 'table inet foreign');
  } finally {
    ns.remove();
  }
});

test('kpng cleanup removes the iptables backend chains and jumps, not foreign or kubelet chains', unless(iptablesUnsupported('nft')), () => {
  assert.equal(iptablesUnsupported('nft'), undefined);
  const ns = createNetns();
  try {
    // a foreign chain jumped to from INPUT, and kubelet's KUBE-FIREWALL
    for (const args of [['-N', 'FOREIGN'], ['-A', 'INPUT', '-j', 'FOREIGN'], ['-N', 'KUBE-FIREWALL'], ['-A', 'OUTPUT', '-j', 'KUBE-FIREWALL']]) ns.exec('iptables-nft', args);
    applyIptables(ns, 'nft');
    assert.match(saveOf(ns, 'nft', 4), /-A KUBE-SERVICES/);

    const r = kpngIn(ns, ['cleanup', '--backend', 'iptables']);
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /^removed iptables-nft nat chains KUBE-SERVICES.* and \d+ service chains/m);
    const after = saveOf(ns, 'nft', 4);
    assert.doesNotMatch(uncommented(after), KPNG_CHAINS);
    assert.match(after, /-A INPUT -j FOREIGN/);
    assert.match(after, /-A OUTPUT -j KUBE-FIREWALL/);
  } finally {
    ns.remove();
  }
});

for (const mode of MODES) {
  test(`iptables-${mode}: a rule whose comment says "-j KUBE-SERVICES" is not a jump to it and survives cleanup`, unless(iptablesUnsupported(mode)), () => {
    assert.equal(iptablesUnsupported(mode), undefined);
    const ns = createNetns();
    try {
      applyIptables(ns, mode);
      // the comments hold a jump to kpng's chains (one with quotes iptables-save escapes); the targets are ACCEPT
      ipt(ns, mode, 4, ['-A', 'INPUT', '-p', 'tcp', '--dport', '22', '-m', 'comment', '--comment', 'ssh; was: -j KUBE-SERVICES before', '-j', 'ACCEPT']);
      ipt(ns, mode, 4, ['-t', 'nat', '-A', 'PREROUTING', '-m', 'comment', '--comment', 'say "-j KUBE-NODEPORTS" here', '-j', 'RETURN']);
      ipt(ns, mode, 6, ['-A', 'OUTPUT', '-m', 'comment', '--comment', '-j KUBE-SERVICES', '-j', 'ACCEPT']);
      const mine = (text: string) => text.split('\n').filter((l) => /^-A (INPUT|OUTPUT|PREROUTING) .*--comment "(ssh|say|-j)/.test(l));
      const before4 = mine(saveOf(ns, mode, 4));
      const before6 = mine(saveOf(ns, mode, 6));
      assert.equal(before4.length, 2, saveOf(ns, mode, 4));
      assert.match(before4.join('\n'), /\\"-j KUBE-NODEPORTS\\"/);
      assert.equal(before6.length, 1);

      const r = kpngIn(ns, ['cleanup', '--backend', 'iptables']);
      assert.equal(r.status, 0, r.stderr);
      for (const family of [4, 6] as Family[]) assert.doesNotMatch(uncommented(saveOf(ns, mode, family)), KPNG_CHAINS);
      assert.deepEqual(mine(saveOf(ns, mode, 4)), before4);
      assert.deepEqual(mine(saveOf(ns, mode, 6)), before6);
    } finally {
      ns.remove();
    }
  });

  test(`iptables-${mode}: foreign chains jumping to kpng's chains do not stop cleanup; they keep their other rules`, unless(iptablesUnsupported(mode)), () => {
    assert.equal(iptablesUnsupported(mode), undefined);
    const ns = createNetns();
    try {
      applyIptables(ns, mode);
      // a user chain in nat jumping to KUBE-SERVICES, one in filter going to KUBE-NODEPORTS (IPv4); IPv6 has none
      for (const args of [
        ['-t', 'nat', '-N', 'MYCHAIN'],
        ['-t', 'nat', '-A', 'MYCHAIN', '-p', 'tcp', '--dport', '8080', '-j', 'RETURN'],
        ['-t', 'nat', '-A', 'MYCHAIN', '-j', 'KUBE-SERVICES'],
        ['-t', 'nat', '-A', 'PREROUTING', '-j', 'MYCHAIN'],
        ['-N', 'MYFILTER'],
        ['-A', 'MYFILTER', '-g', 'KUBE-NODEPORTS'],
        ['-A', 'MYFILTER', '-j', 'ACCEPT'],
        ['-A', 'INPUT', '-j', 'MYFILTER'],
      ]) {
        ipt(ns, mode, 4, args);
      }

      const r = kpngIn(ns, ['cleanup', '--backend', 'iptables']);
      assert.equal(r.status, 0, r.stderr);
      assert.match(r.stdout, new RegExp(`^removed iptables-${mode} nat chains KUBE-SERVICES, .* and 4 rules jumping to them \\(in PREROUTING, OUTPUT, POSTROUTING, MYCHAIN\\)$`, 'm'));
      assert.match(r.stdout, new RegExp(`^removed iptables-${mode} filter chains KUBE-SERVICES, .* and 10 rules jumping to them \\(in INPUT, FORWARD, OUTPUT, MYFILTER\\)$`, 'm'));
      for (const family of [4, 6] as Family[]) assert.doesNotMatch(uncommented(saveOf(ns, mode, family)), KPNG_CHAINS, `IPv${family}`);
      const after = saveOf(ns, mode, 4);
      assert.match(after, /^:MYCHAIN /m);
      assert.match(after, /^:MYFILTER /m);
      assert.deepEqual(
        after
          .split('\n')
          .filter((l) => l.startsWith('-A') && / (MYCHAIN|MYFILTER) /.test(`${l} `))
          .sort(),
        ['-A INPUT -j MYFILTER', '-A MYCHAIN -p tcp -m tcp --dport 8080 -j RETURN', '-A MYFILTER -j ACCEPT', '-A PREROUTING -j MYCHAIN'],
      );
    } finally {
      ns.remove();
    }
  });

  test(`iptables-${mode}: KUBE-FIREWALL (the localhost anti-martian DROP kubelet also writes) and its jumps stay, and cleanup says so`, unless(iptablesUnsupported(mode)), () => {
    assert.equal(iptablesUnsupported(mode), undefined);
    const ns = createNetns();
    try {
      applyIptables(ns, mode);
      const firewall = (text: string) => text.split('\n').filter((l) => l.includes('KUBE-FIREWALL')).sort();
      const before = firewall(saveOf(ns, mode, 4));
      assert.deepEqual(before, [
        '-A INPUT -j KUBE-FIREWALL',
        '-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP',
        '-A OUTPUT -j KUBE-FIREWALL',
        ':KUBE-FIREWALL - [0:0]',
      ]);

      const r = kpngIn(ns, ['cleanup', '--backend', 'iptables']);
      assert.equal(r.status, 0, r.stderr);
      assert.match(r.stdout, new RegExp(`^kept iptables-${mode} filter KUBE-FIREWALL and its jumps .*route_localnet`, 'm'));
      assert.deepEqual(firewall(saveOf(ns, mode, 4)), before);
      assert.doesNotMatch(uncommented(saveOf(ns, mode, 4)), KPNG_CHAINS);
      // the help says what stays, and why
      const help = kpngIn(ns, ['cleanup', '--help']);
      assert.match(help.stdout.replace(/\s+/g, ' '), /What stays: filter KUBE-FIREWALL and its INPUT\/OUTPUT jumps .*route_localnet=1, which stays too/);
    } finally {
      ns.remove();
    }
  });
}

test('a table whose iptables-restore fails is reported (exit 1, one line) and every other table and family is cleaned', unless(iptablesUnsupported('nft')), () => {
  assert.equal(iptablesUnsupported('nft'), undefined);
  const ns = createNetns();
  const dir = mkdtempSync(join(tmpdir(), 'kpng-cleanup-'));
  try {
    applyIptables(ns, 'nft');
    const natBefore = tableOf(saveOf(ns, 'nft', 4), 'nat');
    assert.match(natBefore, /^-A KUBE-SERVICES /m);
    // iptables-nft-restore (IPv4) refuses any input for the nat table
    const real = spawnSync('which', ['iptables-nft-restore'], { encoding: 'utf8' }).stdout.trim();
    const wrapper = join(dir, 'iptables-nft-restore');
    writeFileSync(
      wrapper,
      ['#!/bin/sh', 'input=$(cat)', 'case "$input" in', `  *'*nat'*) echo 'iptables-restore: injected failure' >&2; exit 1 ;;`, 'esac', `printf '%s\\n' "$input" | exec ${real} "$@"`, ''].join('\n'),
    );
    chmodSync(wrapper, 0o755);

    const r = kpngIn(ns, ['cleanup', '--backend', 'iptables'], { PATH: `${dir}:${process.env.PATH}` });
    assert.equal(r.status, 1, r.stdout + r.stderr);
    const failures = r.stderr.split('\n').filter((l) => /could not clean/.test(l));
    assert.equal(failures.length, 1, r.stderr);
    assert.match(failures[0]!, /could not clean iptables-nft nat \(left as it was\): .*injected failure/);
    assert.match(r.stdout, /^removed iptables-nft filter chains /m);
    assert.match(r.stdout, /^removed ip6tables-nft nat chains /m);
    assert.match(r.stdout, /^removed ip6tables-nft filter chains /m);
    // IPv4 nat as it was; everything else clean
    const after = saveOf(ns, 'nft', 4);
    assert.equal(tableOf(after, 'nat'), natBefore);
    for (const table of ['filter', 'mangle']) assert.doesNotMatch(uncommented(tableOf(after, table)), KPNG_CHAINS, table);
    assert.doesNotMatch(uncommented(saveOf(ns, 'nft', 6)), KPNG_CHAINS);
    // once it works again, the rest goes too
    const again = kpngIn(ns, ['cleanup', '--backend', 'iptables']);
    assert.equal(again.status, 0, again.stderr);
    assert.doesNotMatch(uncommented(saveOf(ns, 'nft', 4)), KPNG_CHAINS);
  } finally {
    ns.remove();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('nft: a table that cannot be deleted is reported (exit 1, one line) and the other family is still cleaned', unless(canUseNetns()), () => {
  assert.equal(canUseNetns(), undefined);
  const ns = createNetns();
  const dir = mkdtempSync(join(tmpdir(), 'kpng-cleanup-'));
  try {
    const applied = kpngIn(ns, ['file', '--input', join(ROOT, 'examples/cluster.yaml'), '--node-name', 'node-a', 'to-local', 'to-nft', '--once']);
    assert.equal(applied.status, 0, applied.stderr);
    // nft refuses to delete the IPv4 table
    const real = spawnSync('which', ['nft'], { encoding: 'utf8' }).stdout.trim();
    writeFileSync(join(dir, 'nft'), `#!/bin/sh\nif [ "$1 $3" = "delete ip" ]; then echo 'Error: injected failure' >&2; exit 1; fi\nexec ${real} "$@"\n`);
    chmodSync(join(dir, 'nft'), 0o755);

    const r = kpngIn(ns, ['cleanup', '--backend', 'nft'], { PATH: `${dir}:${process.env.PATH}` });
    assert.equal(r.status, 1, r.stdout + r.stderr);
    const failures = r.stderr.split('\n').filter((l) => /could not clean/.test(l));
    assert.equal(failures.length, 1, r.stderr);
    assert.match(failures[0]!, /could not clean nftables table ip kpng: .*injected failure/);
    assert.match(r.stdout, /^removed nftables table ip6 kpng$/m);
    assert.equal(ns.exec('nft', ['list', 'tables']).trim(), 'table ip kpng');
  } finally {
    ns.remove();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('kpng cleanup --backend with a backend that does not exist fails and names it', unless(canUseNetns()), () => {
  assert.equal(canUseNetns(), undefined);
  const ns = createNetns();
  try {
    const r = kpngIn(ns, ['cleanup', '--backend', 'iptabels']);
    assert.equal(r.status, 1, r.stdout);
    assert.match(r.stderr, /unknown backend iptabels/);
  } finally {
    ns.remove();
  }
});
