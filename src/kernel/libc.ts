// libc through koffi, one binding for the process: the few system calls kpng
// makes directly (netlink and raw sockets, setns, getsockopt, open, flock) and
// glibc's allocator controls (src/runtime/memory.ts). The boundary is small
// and typed on purpose (a wrong pointer crashes the process instead of
// throwing); anything that fails here throws a KernelError and the caller
// falls back.
import { createRequire } from 'node:module';

export class KernelError extends Error {}

export interface Libc {
  socket(domain: number, type: number, protocol: number): number;
  bind(fd: number, addr: Buffer, len: number): number;
  send(fd: number, buf: Buffer, len: number, flags: number): number | bigint;
  /** send on libuv's thread pool: the kernel's work on a big batch does not block this thread */
  sendAsync(fd: number, buf: Buffer, len: number, flags: number): Promise<number>;
  recv(fd: number, buf: Buffer, len: number, flags: number): number | bigint;
  setsockopt(fd: number, level: number, name: number, val: Buffer, len: number): number;
  getsockopt(fd: number, level: number, name: number, val: Buffer, len: Buffer): number;
  /** getsockopt on libuv's thread pool (a big table's copy does not block this thread); errno is the pool thread's, not readable here */
  getsockoptAsync(fd: number, level: number, name: number, val: Buffer, len: Buffer): Promise<number>;
  getsockname(fd: number, addr: Buffer, len: Buffer): number;
  setns(fd: number, nstype: number): number;
  open(path: string, flags: number): number;
  close(fd: number): number;
  /** flock(2) on a file descriptor node:fs opened */
  flock(fd: number, operation: number): number;
  /** glibc's malloc_trim */
  mallocTrim(pad: number): number;
  /** glibc's mallopt */
  mallopt(param: number, value: number): number;
  errno(): number;
}

let bound: Libc | undefined;
let loadError: string | undefined;

/** koffi's asynchronous call of a function (on libuv's thread pool) as a promise */
function asyncCall(f: { async: (...args: unknown[]) => void }) {
  return (...args: unknown[]) =>
    new Promise<number>((resolve, reject) => f.async(...args, (err: unknown, r: number | bigint) => (err ? reject(err as Error) : resolve(Number(r)))));
}

/** libc, loaded on first use; throws KernelError where that cannot work (no koffi, no glibc). */
export function libc(): Libc {
  if (bound) return bound;
  if (loadError) throw new KernelError(loadError);
  try {
    const koffi = createRequire(import.meta.url)('koffi');
    const c = koffi.load('libc.so.6');
    bound = {
      socket: c.func('int socket(int, int, int)'),
      bind: c.func('int bind(int, void *, uint32_t)'),
      send: c.func('long send(int, void *, size_t, int)'),
      sendAsync: asyncCall(c.func('long send(int, void *, size_t, int)')),
      recv: c.func('long recv(int, _Out_ void *, size_t, int)'),
      setsockopt: c.func('int setsockopt(int, int, int, void *, uint32_t)'),
      getsockopt: c.func('int getsockopt(int, int, int, _Inout_ void *, _Inout_ void *)'),
      getsockoptAsync: asyncCall(c.func('int getsockopt(int, int, int, _Inout_ void *, _Inout_ void *)')),
      getsockname: c.func('int getsockname(int, _Inout_ void *, _Inout_ void *)'),
      setns: c.func('int setns(int, int)'),
      open: c.func('int open(const char *, int)'),
      close: c.func('int close(int)'),
      flock: c.func('int flock(int, int)'),
      mallocTrim: c.func('int malloc_trim(size_t)'),
      mallopt: c.func('int mallopt(int, int)'),
      errno: () => koffi.errno() as number,
    };
    return bound;
  } catch (e) {
    loadError = `no FFI to libc (koffi): ${(e as Error).message}`;
    throw new KernelError(loadError);
  }
}

/** libc, or null where there is none (musl, no koffi): for what is only an optimisation. */
export function libcIfAny(): Libc | null {
  try {
    return libc();
  } catch {
    return null;
  }
}
