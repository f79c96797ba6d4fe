// For eBPF in the lab: a child cgroup (v2) the lab's clients are put in, so
// programs attached to it see their sockets and nobody else's, and a bpffs
// mount of its own for the pins. The cgroup is made through a cgroup2 mount
// of the lab's own under /tmp: `ip netns exec` (how kpng runs in the lab)
// mounts a fresh /sys, where the system's cgroup mounts are not. Both are removed by close(), and at exit if
// the owner crashed; a root cgroup is never attached to or changed (only
// cgroup.procs of the child, and the parent's to move processes back out).
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { run, type RunResult } from './netns.js';

const open = new Set<LabCgroup>();
let exitHook = false;

/** the first cgroup2 mount */
function cgroup2Mount(): string | undefined {
  for (const line of readFileSync('/proc/mounts', 'utf8').split('\n')) {
    const [, dir, type] = line.split(' ');
    if (type === 'cgroup2') return dir;
  }
  return undefined;
}

/** Why a child cgroup and a bpffs cannot be made here, or undefined. */
export function labCgroupUnsupported(): string | undefined {
  if (process.platform !== 'linux') return 'cgroups need Linux';
  if (process.getuid?.() !== 0) return 'a cgroup and a bpffs mount need root';
  if (!cgroup2Mount()) return 'no cgroup v2 mount in /proc/mounts';
  return undefined;
}

export class LabCgroup {
  private closed = false;
  private constructor(
    /** the child cgroup's directory */
    readonly path: string,
    /** a bpffs mount point of this lab's own */
    readonly bpffs: string,
    /** the lab's own cgroup2 mount the child is made in */
    private readonly mount: string,
  ) {}

  static create(tag: string): LabCgroup {
    if (!cgroup2Mount()) throw new Error('no cgroup v2 mount');
    const mount = mkdtempSync(join(tmpdir(), 'kpng-cgroup2-'));
    const bpffs = mkdtempSync(join(tmpdir(), 'kpng-bpffs-'));
    const path = join(mount, `kpng-lab-${tag}-${process.pid}-${randomBytes(3).toString('hex')}`);
    const cg = new LabCgroup(path, bpffs, mount);
    open.add(cg);
    const c = spawnSync('mount', ['-t', 'cgroup2', 'cgroup2', mount], { encoding: 'utf8' });
    if (c.status !== 0) {
      cg.close();
      throw new Error(`mount -t cgroup2 ${mount}: ${c.stderr}`);
    }
    mkdirSync(path);
    if (!exitHook) {
      exitHook = true;
      process.on('exit', () => {
        for (const c of open) c.close();
      });
    }
    const m = spawnSync('mount', ['-t', 'bpf', 'bpf', bpffs], { encoding: 'utf8' });
    if (m.status !== 0) {
      cg.close();
      throw new Error(`mount -t bpf ${bpffs}: ${m.stderr}`);
    }
    return cg;
  }

  /** moves a process (and the threads it has) into the cgroup: its new sockets belong to it */
  place(pid: number): void {
    writeFileSync(join(this.path, 'cgroup.procs'), `${pid}\n`);
  }

  /** the pids in it */
  pids(): number[] {
    if (!existsSync(this.path)) return [];
    return readFileSync(join(this.path, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean).map(Number);
  }

  /** runs argv inside network namespace ns, in this cgroup from its first instruction */
  exec(ns: string, argv: string[], opts: { input?: string; timeoutMs?: number } = {}): Promise<RunResult> {
    return run('sh', ['-c', 'echo $$ > "$0/cgroup.procs" && exec "$@"', this.path, 'ip', 'netns', 'exec', ns, ...argv], opts);
  }

  /**
   * Removes the cgroup and the bpffs mount. Programs attached to the cgroup
   * go with it; pins under the mount go with the mount. Processes still in
   * it are moved back to the parent first (they are not the cgroup's to kill).
   */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    open.delete(this);
    for (const pid of this.pids()) {
      try {
        writeFileSync(join(dirname(this.path), 'cgroup.procs'), `${pid}\n`);
      } catch {
        // gone meanwhile
      }
    }
    try {
      if (existsSync(this.path)) rmdirSync(this.path);
    } catch {
      // a process raced in: leave a trace
      process.stderr.write(`lab: could not remove cgroup ${this.path}\n`);
    }
    for (const dir of [this.mount, this.bpffs]) {
      spawnSync('umount', [dir]);
      try {
        rmdirSync(dir);
      } catch {
        process.stderr.write(`lab: could not remove mount point ${dir}\n`);
      }
    }
  }
}

