#!/usr/bin/env node
// Runs before `npm test` and `npm run demo`: installs what a fresh Debian
// machine lacks, so the README's two commands work as written.
//  - npm packages, when node_modules is missing (npm ci);
//  - nftables, iptables, ipset, conntrack, iproute2 from Debian, when running
//    as root on a machine with apt-get and one of their tools is missing.
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));
const sh = (cmd, args, opts = {}) => spawnSync(cmd, args, { stdio: 'inherit', cwd: root, ...opts }).status === 0;
const has = (tool) => ['/usr/sbin', '/sbin', '/usr/bin', '/bin'].some((d) => existsSync(join(d, tool)));

const tools = { nft: 'nftables', iptables: 'iptables', 'iptables-legacy': 'iptables', ipset: 'ipset', conntrack: 'conntrack', ip: 'iproute2' };
const missing = [...new Set(Object.entries(tools).filter(([t]) => !has(t)).map(([, p]) => p))];
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
