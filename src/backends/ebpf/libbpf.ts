// The FFI boundary to libbpf (Debian's libbpf1) through koffi, kept small and
// typed: koffi's pointers carry no type, so a wrong handle would crash the
// process instead of throwing. Handles are wrapped in classes here and never
// leave this file as raw pointers. Int-returning calls give -errno; pointer
// calls give NULL and set errno.
import { createRequire } from 'node:module';
import { libc } from '../../kernel/libc.js';

export class BpfError extends Error {
  constructor(
    message: string,
    readonly errno: number,
  ) {
    super(message);
  }
}

type Ptr = unknown;

interface Lib {
  objectOpen: (path: string, opts: null) => Ptr;
  objectLoad: (obj: Ptr) => number;
  objectClose: (obj: Ptr) => void;
  objectBtf: (obj: Ptr) => Ptr;
  findMap: (obj: Ptr, name: string) => Ptr;
  findProg: (obj: Ptr, name: string) => Ptr;
  mapFd: (m: Ptr) => number;
  mapKeySize: (m: Ptr) => number;
  mapValueSize: (m: Ptr) => number;
  mapSetMaxEntries: (m: Ptr, n: number) => number;
  mapReuseFd: (m: Ptr, fd: number) => number;
  progFd: (p: Ptr) => number;
  attachCgroup: (p: Ptr, cgroupFd: number) => Ptr;
  linkPin: (l: Ptr, path: string) => number;
  linkDestroy: (l: Ptr) => number;
  linkUpdate: (linkFd: number, progFd: number, opts: null) => number;
  linkDetach: (linkFd: number) => number;
  objGet: (path: string) => number;
  objPin: (fd: number, path: string) => number;
  objInfo: (fd: number, info: Buffer, len: Buffer) => number;
  update: (fd: number, key: Buffer, value: Buffer, flags: bigint) => number;
  lookup: (fd: number, key: Buffer, value: Buffer) => number;
  del: (fd: number, key: Buffer) => number;
  nextKey: (fd: number, key: Buffer | null, next: Buffer) => number;
  updateBatch: (fd: number, keys: Buffer, values: Buffer, count: Buffer, opts: null) => number;
  deleteBatch: (fd: number, keys: Buffer, count: Buffer, opts: null) => number;
  possibleCpus: () => number;
  strerror: (err: number, buf: Buffer, size: number) => number;
  btfFind: (btf: Ptr, name: string, kind: number) => number;
  btfType: (btf: Ptr, id: number) => Ptr;
  btfName: (btf: Ptr, off: number) => string | null;
  open: (path: string, flags: number) => number;
  socket: (domain: number, type: number, proto: number) => number;
  getsockopt: (fd: number, level: number, name: number, value: Buffer, len: Buffer) => number;
  close: (fd: number) => number;
  errno: () => number;
  decodeU32: (p: Ptr, offset: number, n: number) => number[];
}

let lib: Lib | undefined;
let loadError: string | undefined;

function L(): Lib {
  if (lib) return lib;
  if (loadError) throw new BpfError(loadError, 0);
  try {
    const koffi = createRequire(import.meta.url)('koffi');
    const b = koffi.load('libbpf.so.1');
    const c = libc();
    lib = {
      objectOpen: b.func('void *bpf_object__open_file(const char *path, void *opts)'),
      objectLoad: b.func('int bpf_object__load(void *obj)'),
      objectClose: b.func('void bpf_object__close(void *obj)'),
      objectBtf: b.func('void *bpf_object__btf(void *obj)'),
      findMap: b.func('void *bpf_object__find_map_by_name(void *obj, const char *name)'),
      findProg: b.func('void *bpf_object__find_program_by_name(void *obj, const char *name)'),
      mapFd: b.func('int bpf_map__fd(void *map)'),
      mapKeySize: b.func('uint32_t bpf_map__key_size(void *map)'),
      mapValueSize: b.func('uint32_t bpf_map__value_size(void *map)'),
      mapSetMaxEntries: b.func('int bpf_map__set_max_entries(void *map, uint32_t n)'),
      mapReuseFd: b.func('int bpf_map__reuse_fd(void *map, int fd)'),
      progFd: b.func('int bpf_program__fd(void *prog)'),
      attachCgroup: b.func('void *bpf_program__attach_cgroup(void *prog, int cgroup_fd)'),
      linkPin: b.func('int bpf_link__pin(void *link, const char *path)'),
      linkDestroy: b.func('int bpf_link__destroy(void *link)'),
      linkUpdate: b.func('int bpf_link_update(int link_fd, int new_prog_fd, void *opts)'),
      linkDetach: b.func('int bpf_link_detach(int link_fd)'),
      objGet: b.func('int bpf_obj_get(const char *path)'),
      objPin: b.func('int bpf_obj_pin(int fd, const char *path)'),
      objInfo: b.func('int bpf_obj_get_info_by_fd(int fd, void *info, void *len)'),
      update: b.func('int bpf_map_update_elem(int fd, const void *key, const void *value, uint64_t flags)'),
      lookup: b.func('int bpf_map_lookup_elem(int fd, const void *key, void *value)'),
      del: b.func('int bpf_map_delete_elem(int fd, const void *key)'),
      nextKey: b.func('int bpf_map_get_next_key(int fd, const void *key, void *next)'),
      updateBatch: b.func('int bpf_map_update_batch(int fd, const void *keys, const void *values, void *count, void *opts)'),
      deleteBatch: b.func('int bpf_map_delete_batch(int fd, const void *keys, void *count, void *opts)'),
      possibleCpus: b.func('int libbpf_num_possible_cpus(void)'),
      strerror: b.func('int libbpf_strerror(int err, void *buf, size_t size)'),
      btfFind: b.func('int btf__find_by_name_kind(void *btf, const char *name, uint32_t kind)'),
      btfType: b.func('void *btf__type_by_id(void *btf, uint32_t id)'),
      btfName: b.func('const char *btf__name_by_offset(void *btf, uint32_t off)'),
      open: c.open,
      socket: c.socket,
      getsockopt: c.getsockopt,
      close: c.close,
      errno: c.errno,
      decodeU32: (p, offset, n) => koffi.decode(p, offset, 'uint32_t', n) as number[],
    };
    return lib;
  } catch (e) {
    loadError = `libbpf is not usable (koffi, libbpf.so.1): ${(e as Error).message}`;
    throw new BpfError(loadError, 0);
  }
}

/** Why eBPF cannot be driven from here (no libbpf, no FFI), or undefined. */
export function libbpfUnavailable(): string | undefined {
  try {
    L();
    return undefined;
  } catch (e) {
    return (e as Error).message;
  }
}

function text(err: number): string {
  const buf = Buffer.alloc(256);
  L().strerror(err, buf, buf.length);
  const s = buf.toString('utf8', 0, Math.max(0, buf.indexOf(0)));
  return s || `errno ${Math.abs(err)}`;
}

function check(r: number, what: string): number {
  if (r < 0) throw new BpfError(`${what}: ${text(r)}`, -r);
  return r;
}

function nonNull(p: Ptr, what: string): Ptr {
  if (!p) {
    const e = L().errno();
    throw new BpfError(`${what}: ${text(-e)}`, e);
  }
  return p;
}

export const ENOENT = 2;
export const E2BIG = 7;
export const ENOSPC = 28;
const O_RDONLY = 0;
const O_DIRECTORY = 0o200000;
const O_CLOEXEC = 0o2000000;
const BTF_KIND_STRUCT = 4;

/** A file descriptor kpng owns (a map, a link, a cgroup): close it once. */
export class Fd {
  private open = true;
  constructor(readonly fd: number) {}
  close(): void {
    if (this.open) L().close(this.fd);
    this.open = false;
  }
}

/** A pinned object (map or link) re-opened; undefined when nothing is pinned there. */
export function objGet(path: string): Fd | undefined {
  const r = L().objGet(path);
  if (r === -ENOENT) return undefined;
  return new Fd(check(r, `bpf_obj_get ${path}`));
}

export function objPin(fd: number, path: string): void {
  check(L().objPin(fd, path), `pin ${path}`);
}

/** A map's type, key and value sizes, max entries (struct bpf_map_info's first fields). */
export function mapInfo(fd: number): { type: number; id: number; keySize: number; valueSize: number; maxEntries: number } {
  const info = Buffer.alloc(96);
  const len = Buffer.alloc(4);
  len.writeUInt32LE(info.length);
  check(L().objInfo(fd, info, len), 'bpf_obj_get_info_by_fd');
  return { type: info.readUInt32LE(0), id: info.readUInt32LE(4), keySize: info.readUInt32LE(8), valueSize: info.readUInt32LE(12), maxEntries: info.readUInt32LE(16) };
}

/** Whether a cgroup link is still attached (struct bpf_link_info: type, id, prog_id, then cgroup_id at 16: 0 once detached). */
export function cgroupLinkAttached(fd: number): boolean {
  const info = Buffer.alloc(64);
  const len = Buffer.alloc(4);
  len.writeUInt32LE(info.length);
  check(L().objInfo(fd, info, len), 'bpf_obj_get_info_by_fd (link)');
  return info.readBigUInt64LE(16) !== 0n;
}

export function linkUpdate(linkFd: number, progFd: number): void {
  check(L().linkUpdate(linkFd, progFd, null), 'bpf_link_update');
}

export function linkDetach(linkFd: number): void {
  check(L().linkDetach(linkFd), 'bpf_link_detach');
}

export function openDirectory(path: string): Fd {
  const fd = L().open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    const e = L().errno();
    throw new BpfError(`open ${path}: ${text(-e)}`, e);
  }
  return new Fd(fd);
}

/** this process's network namespace cookie (SO_NETNS_COOKIE, Linux 5.14+) */
export function netnsCookie(): bigint {
  const AF_INET = 2;
  const SOCK_DGRAM = 2;
  const SOL_SOCKET = 1;
  const SO_NETNS_COOKIE = 71;
  const fd = L().socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) throw new BpfError(`socket: errno ${L().errno()}`, L().errno());
  try {
    const v = Buffer.alloc(8);
    const len = Buffer.alloc(4);
    len.writeUInt32LE(8);
    if (L().getsockopt(fd, SOL_SOCKET, SO_NETNS_COOKIE, v, len) < 0) throw new BpfError(`getsockopt SO_NETNS_COOKIE: errno ${L().errno()}`, L().errno());
    return v.readBigUInt64LE(0);
  } finally {
    L().close(fd);
  }
}

export function possibleCpus(): number {
  return check(L().possibleCpus(), 'libbpf_num_possible_cpus');
}

/** Map operations on an fd, with Buffers the caller reuses. */
export const mapOps = {
  /** false when the map is full (E2BIG) */
  update(fd: number, key: Buffer, value: Buffer): void {
    check(L().update(fd, key, value, 0n), 'bpf_map_update_elem');
  },
  /** false: no such key */
  lookup(fd: number, key: Buffer, value: Buffer): boolean {
    const r = L().lookup(fd, key, value);
    if (r === -ENOENT) return false;
    check(r, 'bpf_map_lookup_elem');
    return true;
  },
  /** false: no such key */
  delete(fd: number, key: Buffer): boolean {
    const r = L().del(fd, key);
    if (r === -ENOENT) return false;
    check(r, 'bpf_map_delete_elem');
    return true;
  },
  /** the key after `key` (the first with null); false at the end */
  nextKey(fd: number, key: Buffer | null, next: Buffer): boolean {
    const r = L().nextKey(fd, key, next);
    if (r === -ENOENT) return false;
    check(r, 'bpf_map_get_next_key');
    return true;
  },
  /** n keys and values packed; returns how many went in before an error (thrown with it) */
  updateBatch(fd: number, keys: Buffer, values: Buffer, n: number): void {
    const count = Buffer.alloc(4);
    count.writeUInt32LE(n);
    const r = L().updateBatch(fd, keys, values, count, null);
    if (r < 0) throw new BpfError(`bpf_map_update_batch (${count.readUInt32LE(0)} of ${n} done): ${text(r)}`, -r);
  },
};

/** struct member offsets (bytes) and size, from BTF */
export interface BtfStruct {
  readonly size: number;
  readonly members: ReadonlyMap<string, number>;
}

/** A loaded BPF object: its maps and programs by name. Closing it closes their fds. */
export class BpfObject {
  private constructor(private obj: Ptr) {}

  static open(path: string): BpfObject {
    return new BpfObject(nonNull(L().objectOpen(path, null), `open ${path}`));
  }

  private map(name: string): Ptr {
    return nonNull(L().findMap(this.live(), name), `map ${name}`);
  }

  private prog(name: string): Ptr {
    return nonNull(L().findProg(this.live(), name), `program ${name}`);
  }

  private live(): Ptr {
    if (!this.obj) throw new BpfError('the BPF object is closed', 0);
    return this.obj;
  }

  mapSizes(name: string): { key: number; value: number } {
    const m = this.map(name);
    return { key: L().mapKeySize(m), value: L().mapValueSize(m) };
  }

  setMaxEntries(name: string, n: number): void {
    check(L().mapSetMaxEntries(this.map(name), n), `${name}: set max entries`);
  }

  /** before load: use this existing (pinned) map instead of creating one */
  reuseMap(name: string, fd: number): void {
    check(L().mapReuseFd(this.map(name), fd), `${name}: reuse the pinned map`);
  }

  load(): void {
    check(L().objectLoad(this.live()), 'load the BPF programs (the verifier log is on stderr)');
  }

  mapFd(name: string): number {
    return check(L().mapFd(this.map(name)), `${name}: fd`);
  }

  progFd(name: string): number {
    return check(L().progFd(this.prog(name)), `${name}: fd`);
  }

  /** attaches a program to a cgroup and pins the link; the link outlives this process */
  attachAndPin(prog: string, cgroupFd: number, path: string): void {
    const link = nonNull(L().attachCgroup(this.prog(prog), cgroupFd), `attach ${prog}`);
    try {
      check(L().linkPin(link, path), `pin ${path}`);
    } finally {
      // closes our fd only: a pinned link stays (an unpinned one goes with it)
      L().linkDestroy(link);
    }
  }

  /** a struct's layout from the object's BTF; undefined if it has none of that name */
  btfStruct(name: string): BtfStruct | undefined {
    const btf = L().objectBtf(this.live());
    if (!btf) throw new BpfError('the BPF object has no BTF (compile with -g)', 0);
    const id = L().btfFind(btf, name, BTF_KIND_STRUCT);
    if (id < 0) return undefined;
    const t = nonNull(L().btfType(btf, id), `btf type ${name}`);
    // struct btf_type { name_off, info, size } then vlen x struct btf_member { name_off, type, offset }
    const [, info, size] = L().decodeU32(t, 0, 3);
    const vlen = info & 0xffff;
    const bitfields = (info >>> 31) === 1;
    const raw = L().decodeU32(t, 12, vlen * 3);
    const members = new Map<string, number>();
    for (let i = 0; i < vlen; i++) {
      const off = bitfields ? raw[i * 3 + 2] & 0xffffff : raw[i * 3 + 2];
      members.set(L().btfName(btf, raw[i * 3]) ?? '', off / 8);
    }
    return { size, members };
  }

  close(): void {
    if (this.obj) L().objectClose(this.obj);
    this.obj = undefined;
  }
}
