// The kernel lab's preparation: Debian's stock kernel (it has IPVS, SCTP and
// dummy links as modules, which the machines' own kernel lacks) unpacked into
// a cache directory once, with an initrd that mounts the host's / over 9p.
//
// Cache (KPNG_VMLAB_DIR, default /var/cache/kpng-vmlab):
//   kernel/<release>/root/       the linux-image package unpacked (boot/, lib/modules/<release>/ with depmod's files)
//   kernel/<release>/vmlinux     the uncompressed kernel (PVH direct boot: no xz under TCG)
//   kernel/<release>/initrd-<hash>.cpio   busybox, the 9p/overlay modules, the init below
//   lab.json                     what runInVm boots (written last: its presence means "prepared")
//   runs/<pid>-<random>/         one per running VM (removed after it)
import { spawnSync, type SpawnSyncReturns } from 'node:child_process';
import { createHash } from 'node:crypto';
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, readSync, readdirSync, renameSync, rmSync, writeFileSync, copyFileSync, chmodSync } from 'node:fs';
import { basename, join } from 'node:path';

/** Bumped when the cache's layout changes (a new layout is prepared again). */
const FORMAT = 1;

export const DEFAULT_VMLAB_DIR = '/var/cache/kpng-vmlab';

export function kernelLabDir(): string {
  return process.env.KPNG_VMLAB_DIR || DEFAULT_VMLAB_DIR;
}

/** What runInVm boots. */
export interface KernelLabManifest {
  format: number;
  /** the kernel release, e.g. 6.1.0-56-amd64 */
  kernel: string;
  /** the unpacked package (its lib/modules/<release> is the guest's) */
  root: string;
  /** an ELF vmlinux (PVH boot), or the bzImage when it could not be unpacked */
  vmlinux: string;
  initrd: string;
  /** of the init and the initrd's contents: a changed init builds a new initrd */
  initHash: string;
}

// Lines the guest's init writes to the console (the command's own output goes to a file).
export const MARK = { begin: '@@KPNG-VMLAB:BEGIN@@', status: /@@KPNG-VMLAB:STATUS=(\d+)@@/, fail: /@@KPNG-VMLAB:FAIL (.*)@@/ } as const;
/** Where the run directory (9p, read-write) is in the guest. */
export const GUEST_RUN_DIR = '/run/kpng-vmlab';

// The modules the guest needs before it can reach the host's files; their
// dependencies come from modules.dep.
const INITRD_MODULES = ['virtio_pci', '9pnet_virtio', '9p', 'overlay'];

/**
 * The guest's init (busybox sh, pid 1): the host's / over 9p, read-only,
 * under a tmpfs overlay (the guest may write anywhere, nothing reaches the
 * host), a fresh /run, the run directory over 9p read-write; then
 * chroot and run cmd.sh with its output to a file in the run directory, and
 * power off. Kernel modules come from the unpacked package (KROOT), through
 * the host's modprobe in the chroot (also for the kernel's own requests).
 */
function initScript(kroot: string): string {
  return `#!/bin/busybox sh
B=/bin/busybox
KROOT=${kroot}
export PATH=/sbin:/bin
fail() { echo "@@KPNG-VMLAB:FAIL $*@@"; $B poweroff -f; }
$B mount -t proc proc /proc
$B mount -t sysfs sys /sys
$B mount -t devtmpfs dev /dev
for m in $($B cat /lib/kpng-vmlab/order); do $B insmod /lib/kpng-vmlab/$m.ko || fail "insmod $m"; done
$B mkdir -p /lower /rw /host
$B mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 host /lower || fail "9p mount of the host's / failed"
$B mount -t tmpfs -o mode=755 tmpfs /rw
$B mkdir -p /rw/upper /rw/work
$B mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay /host || fail "overlay mount failed"
H=/host
$B mount -t proc proc $H/proc
$B mount -t sysfs sys $H/sys
$B mount -t devtmpfs dev $H/dev
$B mkdir -p $H/dev/pts $H/dev/shm
$B mount -t devpts -o newinstance,ptmxmode=666 devpts $H/dev/pts
$B mount -t tmpfs tmpfs $H/dev/shm
$B mount -t tmpfs -o mode=755 tmpfs $H/run
$B mount -t cgroup2 none $H/sys/fs/cgroup 2>/dev/null
$B mkdir -p $H/run/netns $H/run/lock ${'$H'}${GUEST_RUN_DIR}
$B mount -t 9p -o trans=virtio,version=9p2000.L,cache=none,msize=512000 run ${'$H'}${GUEST_RUN_DIR} || fail "9p mount of the run directory failed"
KV=$($B uname -r)
$B mkdir -p $H/lib/modules
$B ln -sfn $KROOT/lib/modules/$KV $H/lib/modules/$KV
echo /sbin/modprobe > /proc/sys/kernel/modprobe
$B ip link set lo up
$B hostname kpng-vmlab
echo "${MARK.begin}"
$B chroot $H /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 KPNG_VMLAB=1 \\
  /bin/bash ${GUEST_RUN_DIR}/cmd.sh </dev/null >${'$H'}${GUEST_RUN_DIR}/output 2>&1
rc=$?
echo $rc > ${'$H'}${GUEST_RUN_DIR}/status
echo "@@KPNG-VMLAB:STATUS=$rc@@"
$B poweroff -f
`;
}

// The kernel's module requests (kernel.modprobe, /sbin/modprobe) run in pid
// 1's root, the initrd: its /sbin/modprobe runs the host's in the chroot,
// where /sbin/modprobe is the host's own (tools that run it, such as
// iptables-legacy, find it there).
const MODPROBE_HELPER = `#!/bin/busybox sh
exec /bin/busybox chroot /host /sbin/modprobe "$@"
`;

function manifestPath(dir: string) {
  return join(dir, 'lab.json');
}

/** The prepared kernel lab, or undefined when there is none (or it is incomplete or of an older layout). */
export function readManifest(dir = kernelLabDir()): KernelLabManifest | undefined {
  let m: KernelLabManifest;
  try {
    m = JSON.parse(readFileSync(manifestPath(dir), 'utf8'));
  } catch {
    return undefined;
  }
  if (m.format !== FORMAT || initHash(m.root, m.kernel) !== m.initHash) return undefined;
  if (![m.vmlinux, m.initrd, join(m.root, 'lib/modules', m.kernel, 'modules.dep.bin')].every((f) => existsSync(f))) return undefined;
  return m;
}

function initHash(root: string, kernel: string): string {
  return createHash('sha256')
    .update(`${FORMAT}\n${initScript(root)}\n${MODPROBE_HELPER}\n${INITRD_MODULES.join(' ')}\n${kernel}`)
    .digest('hex')
    .slice(0, 12);
}

const TOOL_DIRS = ['/usr/local/sbin', '/usr/local/bin', '/usr/sbin', '/usr/bin', '/sbin', '/bin'];

export function findTool(tool: string): string | undefined {
  return TOOL_DIRS.map((d) => join(d, tool)).find((p) => existsSync(p));
}

/** The Debian packages the kernel lab needs (and the tool that shows each is there). */
export const KERNEL_LAB_PACKAGES: Record<string, string> = {
  'qemu-system-x86_64': 'qemu-system-x86',
  busybox: 'busybox-static',
  cpio: 'cpio',
  depmod: 'kmod',
  modprobe: 'kmod',
  python3: 'python3',
  setpriv: 'util-linux',
  'dpkg-deb': 'dpkg',
};

/** Why the kernel lab cannot run here (before preparing), or undefined. */
export function kernelLabHostUnsupported(): string | undefined {
  if (process.platform !== 'linux' || process.arch !== 'x64') return 'the kernel lab boots an x86-64 Linux kernel under qemu-system-x86_64: it needs Linux on x86-64';
  if (process.getuid?.() !== 0) return 'the kernel lab needs root (the guest runs the host\'s files as root)';
  const missing = [...new Set(Object.entries(KERNEL_LAB_PACKAGES).filter(([t]) => !findTool(t)).map(([, p]) => p))];
  if (missing.length) return `the kernel lab needs the Debian packages ${missing.join(' ')} (node scripts/setup.mjs installs them as root)`;
  if (!isStatic(findTool('busybox')!)) return 'the kernel lab needs a static busybox (apt-get install busybox-static)';
  return undefined;
}

/** Why runInVm cannot run here, or undefined. */
export function kernelLabUnavailable(): string | undefined {
  return kernelLabHostUnsupported() ?? (readManifest() ? undefined : `the kernel lab is not prepared in ${kernelLabDir()} (run node scripts/vmlab-setup.mjs as root)`);
}

/** An ELF without a program interpreter (PT_INTERP) needs no libc in the initrd. */
function isStatic(path: string): boolean {
  const fd = openSync(path, 'r');
  try {
    const h = Buffer.alloc(64);
    readSync(fd, h, 0, 64, 0);
    if (h.readUInt32BE(0) !== 0x7f454c46 || h[4] !== 2) return false;
    const phoff = Number(h.readBigUInt64LE(32));
    const phentsize = h.readUInt16LE(54);
    const phnum = h.readUInt16LE(56);
    const ph = Buffer.alloc(phentsize * phnum);
    readSync(fd, ph, 0, ph.length, phoff);
    for (let i = 0; i < phnum; i++) if (ph.readUInt32LE(i * phentsize) === 3) return false;
    return true;
  } finally {
    closeSync(fd);
  }
}

function sh(cmd: string, args: string[], opts: { cwd?: string; input?: string | Buffer; timeoutMs?: number } = {}): SpawnSyncReturns<string> {
  return spawnSync(cmd, args, { cwd: opts.cwd, input: opts.input, encoding: 'utf8', timeout: opts.timeoutMs ?? 600_000, maxBuffer: 64 << 20, env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive', LC_ALL: 'C' } });
}

function must(cmd: string, args: string[], opts: { cwd?: string; input?: string | Buffer; timeoutMs?: number } = {}): string {
  const r = sh(cmd, args, opts);
  if (r.status !== 0) throw new Error(`kernel lab: ${cmd} ${args.join(' ')} failed (${r.status ?? r.signal ?? r.error?.message}): ${(r.stderr || r.stdout || '').trim().split('\n').slice(-5).join(' | ')}`);
  return r.stdout;
}

/** The kernel release Debian serves now: linux-image-amd64's dependency (apt-get update first when the lists have none). */
function currentKernelRelease(): string {
  const find = () => /Depends: linux-image-(\d\S*-amd64)\b/.exec(sh('apt-cache', ['depends', 'linux-image-amd64']).stdout ?? '')?.[1];
  let release = find();
  if (!release) {
    must('apt-get', ['update', '-qq']);
    release = find();
  }
  if (!release) throw new Error('kernel lab: apt-cache depends linux-image-amd64 names no linux-image-<release>-amd64 (is this Debian, with its main archive in the apt sources?)');
  return release;
}

/** Python for what Node cannot do (xz). Debian's own, not a version manager's shim. */
function python(): string {
  return existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3';
}

// Debian's bzImage carries the kernel xz-compressed (CONFIG_KERNEL_XZ): its
// payload unpacked is the ELF vmlinux, which QEMU boots directly (PVH).
const UNXZ_KERNEL = `import lzma, sys
d = open(sys.argv[1], 'rb').read()
off = d.find(b'\\xfd7zXZ\\x00')
if off < 0: sys.exit(3)
out = lzma.LZMADecompressor().decompress(d[off:])
if out[:4] != b'\\x7fELF': sys.exit(4)
open(sys.argv[2], 'wb').write(out)
`;
const UNXZ_FILE = `import lzma, sys
open(sys.argv[2], 'wb').write(lzma.open(sys.argv[1]).read())
`;

/** Modules to load, dependencies first (from depmod's modules.dep), with their files. */
function moduleOrder(modDir: string, wanted: string[]): { name: string; file: string }[] {
  const deps = new Map<string, string[]>();
  const files = new Map<string, string>();
  const nameOf = (p: string) => basename(p).replace(/\.ko(\.(xz|zst|gz))?$/, '').replace(/-/g, '_');
  for (const line of readFileSync(join(modDir, 'modules.dep'), 'utf8').split('\n')) {
    const m = /^([^:]+):\s*(.*)$/.exec(line);
    if (!m) continue;
    files.set(nameOf(m[1]), m[1]);
    deps.set(nameOf(m[1]), m[2].split(/\s+/).filter(Boolean).map(nameOf));
  }
  const builtin = new Set(
    (existsSync(join(modDir, 'modules.builtin')) ? readFileSync(join(modDir, 'modules.builtin'), 'utf8') : '')
      .split('\n')
      .filter(Boolean)
      .map(nameOf),
  );
  const order: { name: string; file: string }[] = [];
  const seen = new Set<string>();
  const visit = (n: string) => {
    if (seen.has(n)) return;
    seen.add(n);
    if (!files.has(n)) {
      if (builtin.has(n)) return;
      throw new Error(`kernel lab: module ${n} is neither in modules.dep nor built in`);
    }
    for (const d of deps.get(n)!) visit(d);
    order.push({ name: n, file: join(modDir, files.get(n)!) });
  };
  wanted.forEach(visit);
  return order;
}

function buildInitrd(root: string, kernel: string, out: string): void {
  const modDir = join(root, 'lib/modules', kernel);
  const tmp = `${out}.tmp-${process.pid}`;
  rmSync(tmp, { recursive: true, force: true });
  try {
    for (const d of ['bin', 'sbin', 'lib/kpng-vmlab', 'proc', 'sys', 'dev', 'lower', 'rw', 'host']) mkdirSync(join(tmp, d), { recursive: true });
    copyFileSync(findTool('busybox')!, join(tmp, 'bin/busybox'));
    chmodSync(join(tmp, 'bin/busybox'), 0o755);
    const order = moduleOrder(modDir, INITRD_MODULES);
    for (const m of order) {
      const dst = join(tmp, 'lib/kpng-vmlab', `${m.name}.ko`);
      if (m.file.endsWith('.ko')) copyFileSync(m.file, dst);
      else if (m.file.endsWith('.ko.xz')) must(python(), ['-c', UNXZ_FILE, m.file, dst]);
      else throw new Error(`kernel lab: cannot unpack ${m.file} (only .ko and .ko.xz)`);
    }
    writeFileSync(join(tmp, 'lib/kpng-vmlab/order'), order.map((m) => m.name).join('\n') + '\n');
    writeFileSync(join(tmp, 'init'), initScript(root), { mode: 0o755 });
    writeFileSync(join(tmp, 'sbin/modprobe'), MODPROBE_HELPER, { mode: 0o755 });
    const names = listTree(tmp).join('\n') + '\n';
    // uncompressed: unpacking gzip under TCG costs more than reading a few MB
    const r = spawnSync('cpio', ['--quiet', '-o', '-H', 'newc', '-R', '0:0'], { cwd: tmp, input: names, maxBuffer: 256 << 20, timeout: 120_000 });
    if (r.status !== 0) throw new Error(`kernel lab: cpio failed: ${String(r.stderr).trim()}`);
    writeFileSync(`${out}.part`, r.stdout);
    renameSync(`${out}.part`, out);
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
}

function listTree(dir: string, rel = '.'): string[] {
  const out = [rel];
  for (const e of readdirSync(join(dir, rel), { withFileTypes: true })) {
    const p = `${rel}/${e.name}`;
    if (e.isDirectory()) out.push(...listTree(dir, p));
    else out.push(p);
  }
  return out;
}

/** A kernel already unpacked in the cache (complete: its vmlinux is there), newest release first. */
function unpackedKernels(dir: string): string[] {
  const k = join(dir, 'kernel');
  if (!existsSync(k)) return [];
  return readdirSync(k)
    .filter((r) => /^\d[^/]*-amd64$/.test(r) && existsSync(join(k, r, 'vmlinux')) && existsSync(join(k, r, 'root/lib/modules', r, 'modules.dep.bin')))
    .sort((a, b) => b.localeCompare(a, 'en', { numeric: true }));
}

/**
 * Prepares the kernel lab once (idempotent; quick when prepared): the kernel
 * package Debian serves now (apt-get download, dpkg-deb -x, depmod), its
 * vmlinux, the initrd, lab.json. Needs root and the packages of
 * KERNEL_LAB_PACKAGES. log gets a few short lines.
 */
export function prepareKernelLab(opts: { dir?: string; log?: (line: string) => void } = {}): KernelLabManifest {
  const dir = opts.dir ?? kernelLabDir();
  const log = opts.log ?? (() => {});
  const ready = readManifest(dir);
  if (ready) return ready;
  const why = kernelLabHostUnsupported();
  if (why) throw new Error(why);
  mkdirSync(join(dir, 'kernel'), { recursive: true, mode: 0o755 });

  // a kernel unpacked earlier is used again (an older layout or init needs no new download)
  let kernel = unpackedKernels(dir)[0];
  if (!kernel) {
    kernel = currentKernelRelease();
    const t0 = Date.now();
    log(`kernel lab: downloading linux-image-${kernel} (Debian) into ${dir}`);
    const tmp = join(dir, 'kernel', `.${kernel}.tmp-${process.pid}`);
    rmSync(tmp, { recursive: true, force: true });
    mkdirSync(tmp, { recursive: true });
    try {
      must('apt-get', ['download', '-qq', `linux-image-${kernel}`], { cwd: tmp });
      const deb = readdirSync(tmp).find((f) => f.endsWith('.deb'));
      if (!deb) throw new Error(`kernel lab: apt-get download linux-image-${kernel} left no .deb`);
      must('dpkg-deb', ['-x', join(tmp, deb), join(tmp, 'root')]);
      rmSync(join(tmp, deb));
      must(findTool('depmod')!, ['-b', join(tmp, 'root'), kernel]);
      const vmlinuz = join(tmp, 'root/boot', `vmlinuz-${kernel}`);
      if (!existsSync(vmlinuz)) throw new Error(`kernel lab: the package has no boot/vmlinuz-${kernel}`);
      // an ELF vmlinux boots in half the time (no decompression); the bzImage still boots
      if (sh(python(), ['-c', UNXZ_KERNEL, vmlinuz, join(tmp, 'vmlinux')]).status !== 0) {
        log('kernel lab: could not unpack the kernel image (not xz?): booting the bzImage (slower)');
        copyFileSync(vmlinuz, join(tmp, 'vmlinux'));
      }
      try {
        renameSync(tmp, join(dir, 'kernel', kernel));
      } catch (e) {
        // another setup unpacked it meanwhile: use theirs
        if (!unpackedKernels(dir).includes(kernel)) throw e;
      }
    } finally {
      rmSync(tmp, { recursive: true, force: true });
    }
    log(`kernel lab: kernel ${kernel} unpacked (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
  }
  const kdir = join(dir, 'kernel', kernel);
  const root = join(kdir, 'root');
  const hash = initHash(root, kernel);
  const initrd = join(kdir, `initrd-${hash}.cpio`);
  if (!existsSync(initrd)) buildInitrd(root, kernel, initrd);
  for (const f of readdirSync(kdir)) if (/^initrd-.*\.cpio$/.test(f) && f !== basename(initrd)) rmSync(join(kdir, f), { force: true });
  const m: KernelLabManifest = { format: FORMAT, kernel, root, vmlinux: join(kdir, 'vmlinux'), initrd, initHash: hash };
  const tmpManifest = `${manifestPath(dir)}.tmp-${process.pid}`;
  writeFileSync(tmpManifest, JSON.stringify(m, null, 2) + '\n');
  renameSync(tmpManifest, manifestPath(dir));
  log(`kernel lab: ready (kernel ${kernel}, ${dir})`);
  return m;
}
