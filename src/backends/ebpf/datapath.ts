// Loading kpng's BPF object, pinned under a bpffs directory so the maps and
// the cgroup links outlive the process: a restart adopts the pinned maps
// (reused as they are, entries kept) and moves the pinned links to the
// programs it just loaded (bpf_link_update: never detached, so no socket
// goes untranslated meanwhile). Cleanup detaches and unpins kpng's names only.
import { existsSync, mkdirSync, readFileSync, readdirSync, rmdirSync, statSync, unlinkSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { BpfObject, linkDetach, cgroupLinkAttached, linkUpdate, mapInfo, mapOps, netnsCookie, objGet, objPin, openDirectory, type Fd } from './libbpf.js';
import { LAYOUTS, MAPS, layoutProblems, sizeOf, type MapName } from './layout.js';
import { BpfMaps } from './maps.js';

export { DEFAULT_BPFFS, DEFAULT_MAX_SERVICE_PORTS, DEFAULT_MAX_ENDPOINTS } from './defaults.js';

/** program name -> the hook it is attached to (the link's pin is link_<program>) */
export const PROGRAMS = ['kpng_connect4', 'kpng_connect6', 'kpng_sendmsg4', 'kpng_sendmsg6', 'kpng_recvmsg4', 'kpng_recvmsg6', 'kpng_getpeername4', 'kpng_getpeername6'] as const;

const HERE = dirname(fileURLToPath(import.meta.url));
const SOURCE = 'kpng.bpf.c';
export const OBJECT = 'kpng.bpf.o';

/** where the C source is: next to this file (src), or in src/ beside dist/ (a build) */
function sourcePath(): string | undefined {
  for (const p of [join(HERE, SOURCE), resolve(HERE, '../../../src/backends/ebpf', SOURCE)]) if (existsSync(p)) return p;
  return undefined;
}

/**
 * The compiled object: built by `npm run build-bpf` (setup and prepare run
 * it) next to the source; compiled here when missing or older than the source.
 */
export function objectPath(): string {
  const src = sourcePath();
  const candidates = [join(HERE, OBJECT), ...(src ? [join(dirname(src), OBJECT)] : [])];
  const built = candidates.find((p) => existsSync(p) && (!src || statSync(p).mtimeMs >= statSync(src).mtimeMs));
  if (built) return built;
  if (!src) throw new Error(`no ${OBJECT} and no ${SOURCE} to build it from (looked beside ${HERE})`);
  return compileObject(src, join(dirname(src), OBJECT));
}

/** clang -O2 -g -target bpf (-g: the maps' BTF, which the layout check reads) */
export function compileObject(src: string, out: string): string {
  const arch = process.arch === 'arm64' ? 'aarch64-linux-gnu' : 'x86_64-linux-gnu';
  const r = spawnSync('clang', ['-O2', '-g', '-target', 'bpf', `-I/usr/include/${arch}`, '-Wall', '-c', src, '-o', out], { encoding: 'utf8', timeout: 60_000 });
  if (r.status !== 0) throw new Error(`clang could not build ${src} (install clang, llvm, libbpf-dev: node scripts/setup.mjs): ${r.error?.message ?? r.stderr}`);
  return out;
}

/** The first cgroup v2 mount in /proc/mounts (the root every node process is under). */
export function cgroup2Root(mounts = readFileSync('/proc/mounts', 'utf8')): string | undefined {
  for (const line of mounts.split('\n')) {
    const [, dir, type] = line.split(' ');
    if (type === 'cgroup2') return dir.replace(/\\040/g, ' ');
  }
  return undefined;
}

/** true when dir is on a bpf filesystem (pins are possible there) */
export function onBpffs(dir: string, mounts = readFileSync('/proc/mounts', 'utf8')): boolean {
  const abs = resolve(dir);
  return mounts.split('\n').some((line) => {
    const [, m, type] = line.split(' ');
    return type === 'bpf' && (abs === m || abs.startsWith(m.endsWith('/') ? m : m + '/'));
  });
}

export interface DatapathOptions {
  readonly bpffs: string;
  readonly cgroupPath: string;
  readonly maxServicePorts: number;
  readonly maxEndpoints: number;
  readonly log: { info(o: object, msg?: string): void; warn(o: object | string, msg?: string): void };
}

export interface DatapathReport {
  /** maps reused from the pins (a restart) */
  readonly adoptedMaps: string[];
  /** links moved to the new programs (a restart) */
  readonly adoptedLinks: string[];
  readonly attached: string[];
}

/** The loaded programs and their maps; close() leaves everything pinned and attached. */
export class Datapath {
  private constructor(
    private readonly obj: BpfObject,
    readonly maps: BpfMaps,
    readonly report: DatapathReport,
  ) {}

  static open(o: DatapathOptions): Datapath {
    if (!onBpffs(o.bpffs)) throw new Error(`${o.bpffs} is not on a bpf filesystem (mount -t bpf bpf /sys/fs/bpf, or give --bpffs)`);
    mkdirSync(o.bpffs, { recursive: true });
    const obj = BpfObject.open(objectPath());
    const fds: Fd[] = [];
    try {
      const problems = Object.keys(LAYOUTS).flatMap((s) => layoutProblems(s as keyof typeof LAYOUTS, obj.btfStruct(s)));
      for (const m of Object.values(MAPS)) {
        const sz = obj.mapSizes(m.name);
        if (sz.key !== sizeOf(m.key) || sz.value !== sizeOf(m.value)) problems.push(`map ${m.name}: key ${sz.key}/value ${sz.value} bytes in the object, ${sizeOf(m.key)}/${sizeOf(m.value)} in layout.ts`);
      }
      if (problems.length) throw new Error(`the BPF object and layout.ts disagree:\n  ${problems.join('\n  ')}`);
      const sizes: Partial<Record<MapName, number>> = { services: o.maxServicePorts, endpoints: o.maxEndpoints, affinity: o.maxServicePorts, reverse: o.maxEndpoints };
      for (const [k, n] of Object.entries(sizes)) obj.setMaxEntries(MAPS[k as MapName].name, n);
      // adopt pinned maps of the same shape; a map of another shape (sizes changed) is made again
      const adoptedMaps: string[] = [];
      for (const [k, m] of Object.entries(MAPS)) {
        const pin = join(o.bpffs, m.name);
        const fd = objGet(pin);
        if (!fd) continue;
        fds.push(fd);
        const info = mapInfo(fd.fd);
        const want = sizes[k as MapName];
        if (info.keySize === sizeOf(m.key) && info.valueSize === sizeOf(m.value) && (want === undefined || info.maxEntries === want)) {
          obj.reuseMap(m.name, fd.fd);
          adoptedMaps.push(m.name);
        } else {
          o.log.warn({ map: m.name, was: info.maxEntries, now: want }, `pinned map ${m.name} has another size or layout: making it again (open connections keep their endpoints)`);
          unlinkSync(pin);
        }
      }
      obj.load();
      for (const m of Object.values(MAPS)) if (!adoptedMaps.includes(m.name)) objPin(obj.mapFd(m.name), join(o.bpffs, m.name));
      // the node's network namespace: localhost NodePorts are for its sockets only
      const cookie = Buffer.alloc(8);
      cookie.writeBigUInt64LE(netnsCookie());
      mapOps.update(obj.mapFd(MAPS.hostNetns.name), Buffer.alloc(4), cookie);
      // links: the pinned ones move to these programs, the others are made
      const cgroup = openDirectory(o.cgroupPath);
      fds.push(cgroup);
      const adoptedLinks: string[] = [];
      const attached: string[] = [];
      for (const prog of PROGRAMS) {
        const pin = join(o.bpffs, `link_${prog}`);
        const link = objGet(pin);
        if (link) fds.push(link);
        if (link && cgroupLinkAttached(link.fd)) {
          linkUpdate(link.fd, obj.progFd(prog));
          adoptedLinks.push(prog);
        } else {
          // none, or one someone detached: attach anew
          if (link) unlinkSync(pin);
          obj.attachAndPin(prog, cgroup.fd, pin);
          attached.push(prog);
        }
      }
      const maps = new BpfMaps({ services: obj.mapFd(MAPS.services.name), endpoints: obj.mapFd(MAPS.endpoints.name), counters: obj.mapFd(MAPS.counters.name) }, { services: o.maxServicePorts, endpoints: o.maxEndpoints });
      return new Datapath(obj, maps, { adoptedMaps, adoptedLinks, attached });
    } catch (e) {
      obj.close();
      throw e;
    } finally {
      for (const fd of fds) fd.close();
    }
  }

  /**
   * The drift check: every pin kpng made is there and every link still
   * attached (a detached link keeps its pin). Says what is missing, or undefined.
   */
  static missing(bpffs: string): string | undefined {
    for (const m of Object.values(MAPS)) if (!existsSync(join(bpffs, m.name))) return `map ${m.name} is no longer pinned`;
    for (const prog of PROGRAMS) {
      const link = objGet(join(bpffs, `link_${prog}`));
      if (!link) return `link ${prog} is no longer pinned`;
      try {
        if (!cgroupLinkAttached(link.fd)) return `link ${prog} was detached`;
      } finally {
        link.close();
      }
    }
    return undefined;
  }

  /** closes this process's handles; programs stay attached, maps pinned */
  close(): void {
    this.obj.close();
  }
}

/** kpng cleanup: detaches kpng's links and unpins its maps under dir; other files stay. */
export function cleanupPins(dir: string): { removed: string[]; kept: string[]; failed: string[] } {
  const report = { removed: [] as string[], kept: [] as string[], failed: [] as string[] };
  if (!existsSync(dir)) return report;
  const ours = new Set<string>([...PROGRAMS.map((p) => `link_${p}`), ...Object.values(MAPS).map((m) => m.name)]);
  // links first: once detached no program uses the maps
  const names = readdirSync(dir).sort((a, b) => Number(b.startsWith('link_')) - Number(a.startsWith('link_')));
  for (const name of names) {
    const pin = join(dir, name);
    if (!ours.has(name)) {
      report.kept.push(`${pin}: not kpng's`);
      continue;
    }
    try {
      if (name.startsWith('link_')) {
        const fd = objGet(pin);
        if (fd) {
          try {
            linkDetach(fd.fd);
          } finally {
            fd.close();
          }
        }
        unlinkSync(pin);
        report.removed.push(`eBPF link ${pin} (detached)`);
      } else {
        unlinkSync(pin);
        report.removed.push(`eBPF map ${pin}`);
      }
    } catch (e) {
      report.failed.push(`${pin}: ${(e as Error).message}`);
    }
  }
  if (!report.kept.length && !report.failed.length) {
    try {
      rmdirSync(dir);
    } catch (e) {
      report.failed.push(`${dir}: ${(e as Error).message}`);
    }
  }
  return report;
}
