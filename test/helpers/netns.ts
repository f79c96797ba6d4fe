// A throwaway network namespace for tests, and wrappers that run a tool in it,
// so a test never programs the root namespace.
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync, chmodSync, rmSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { skipOrFailInCI } from './ci.js';

export function canUseNetns(): string | undefined {
  return skipOrFailInCI(netnsUnsupported());
}

function netnsUnsupported(): string | undefined {
  if (process.getuid?.() !== 0) return 'needs root';
  for (const tool of ['ip', 'nft']) {
    if (spawnSync('which', [tool]).status !== 0) return `needs ${tool}`;
  }
  return undefined;
}

export interface TestNetns {
  readonly name: string;
  /** path of an executable that runs `tool` inside the namespace */
  wrapper(tool: string): string;
  exec(cmd: string, args: string[], input?: string): string;
  remove(): void;
}

export function createNetns(prefix = 'kpng-t'): TestNetns {
  const name = `${prefix}-${randomBytes(4).toString('hex')}`;
  execFileSync('ip', ['netns', 'add', name]);
  const dir = mkdtempSync(join(tmpdir(), `${name}-`));
  return {
    name,
    wrapper(tool: string) {
      const p = join(dir, tool);
      if (!existsSync(p)) {
        writeFileSync(p, `#!/bin/sh\nexec ip netns exec ${name} ${tool} "$@"\n`);
        chmodSync(p, 0o755);
      }
      return p;
    },
    exec(cmd: string, args: string[], input?: string) {
      return execFileSync('ip', ['netns', 'exec', name, cmd, ...args], { input, encoding: 'utf8' });
    },
    remove() {
      spawnSync('ip', ['netns', 'del', name]);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
