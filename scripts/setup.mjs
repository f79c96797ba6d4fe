#!/usr/bin/env node
// Runs before `npm test` and `npm run demo`: installs what a fresh Debian
// machine lacks, so the README's two commands work as written.
//  - npm packages, when node_modules is missing (npm ci);
//  - nftables, iptables, ipset, conntrack, iproute2, procps from Debian;
//    for to-ebpf clang, llvm, libbpf-dev (libbpf1) and bpftool (debugging);
//    for the deployment's tests kubectl (kubernetes-client: `kubectl
//    kustomize` renders deploy/kustomize) and promtool (prometheus: checks
//    and tests deploy/monitoring's alert rules); and
//    on x86-64 the kernel lab's qemu-system-x86, busybox-static, cpio, kmod,
//    python3 and ipvsadm (docs/kernel-lab.md), when running as root on a machine with
//    apt-get and one of them is missing;
//  - the kernel lab itself, once (scripts/vmlab-setup.mjs; quick when ready).
//    Not prepared is no setup failure: the tests that need it say why.
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));
const sh = (cmd, args, opts = {}) => spawnSync(cmd, args, { stdio: 'inherit', cwd: root, ...opts }).status === 0;
const has = (tool) => ['/usr/sbin', '/sbin', '/usr/bin', '/bin'].some((d) => existsSync(join(d, tool)));

const kernelLab = process.platform === 'linux' && process.arch === 'x64';
const tools = { nft: 'nftables', iptables: 'iptables', 'iptables-legacy': 'iptables', ipset: 'ipset', conntrack: 'conntrack', ip: 'iproute2', ps: 'procps', clang: 'clang', 'llvm-objdump': 'llvm', bpftool: 'bpftool', kubectl: 'kubernetes-client', promtool: 'prometheus' };
if (kernelLab) Object.assign(tools, { 'qemu-system-x86_64': 'qemu-system-x86', cpio: 'cpio', depmod: 'kmod', modprobe: 'kmod', python3: 'python3', ipvsadm: 'ipvsadm' });
const missing = [...new Set(Object.entries(tools).filter(([t]) => !has(t)).map(([, p]) => p))];
// the initrd needs a static busybox; Debian's busybox package is not
const installed = (pkg) => spawnSync('dpkg-query', ['-W', '-f=${Status}', pkg], { encoding: 'utf8' }).stdout?.includes('install ok installed');
if (kernelLab && has('dpkg-query') && !installed('busybox-static')) missing.push('busybox-static');
// to-ebpf: libbpf's headers to compile against, libbpf1 to load with
if (has('dpkg-query') && !installed('libbpf-dev')) missing.push('libbpf-dev');
if (missing.length) {
  if (process.getuid?.() === 0 && has('apt-get')) {
    console.error(`setup: installing ${missing.join(' ')} (Debian packages)`);
    const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
    if (!sh('apt-get', ['update', '-qq'], { env }) || !sh('apt-get', ['install', '-y', '-qq', '--no-install-recommends', ...missing], { env })) {
      console.error('setup: apt-get failed');
      process.exit(1);
    }
  } else {
    console.error(`setup: missing ${missing.join(' ')}; install them (as root) for the dataplane tests and the demo`);
  }
}
if (!existsSync(join(root, 'node_modules/tsx')) || !existsSync(join(root, 'node_modules/commander'))) {
  console.error('setup: installing npm packages (npm ci)');
  if (!sh('npm', ['ci', '--no-audit', '--no-fund'])) process.exit(1);
}
// to-ebpf's BPF object (clang); quick when it is up to date
sh(process.execPath, ['scripts/build-bpf.mjs']);
if (kernelLab && process.getuid?.() === 0 && !sh(process.execPath, ['scripts/vmlab-setup.mjs'])) {
  console.error('setup: the kernel lab is not prepared (see above); the tests that need it fail in CI');
}
