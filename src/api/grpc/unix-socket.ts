// The unix sockets kpng serves on (the state sockets, to-api's listener, the
// tenant API), put in place and taken away so that kpng never removes a
// socket file it did not bind:
// - a live socket at the path (another kpng answers there) is refused and
//   left alone; a stale one (nothing accepts on it) is replaced;
// - the socket is bound under a private name beside the path, then renamed
//   onto it. libuv unlinks a unix socket server's bound path, by name, when
//   the server closes: that name is then this process's own, never the public
//   path, where another kpng may be serving by then;
// - when kpng stops, the public path is removed only if it still is the
//   socket this process bound (same device and inode).
import { chmodSync, lstatSync, mkdirSync, renameSync, unlinkSync } from 'node:fs';
import { connect } from 'node:net';
import { dirname, join } from 'node:path';

/** Prepares a unix socket path: its directory exists, a stale socket is gone, a live one is not taken over. */
export async function prepareUnixSocket(path: string): Promise<void> {
  mkdirSync(dirname(path), { recursive: true, mode: 0o750 });
  let st;
  try {
    st = lstatSync(path);
  } catch {
    return;
  }
  if (!st.isSocket()) throw new Error(`${path} exists and is not a socket; not removing it`);
  const live = await new Promise<boolean>((resolve) => {
    const s = connect(path);
    s.once('connect', () => (s.destroy(), resolve(true)));
    s.once('error', () => resolve(false));
  });
  if (live) throw new Error(`${path}: another server is listening there`);
  unlinkSync(path);
}

export interface BoundSocket {
  readonly path: string;
  /** removes the socket file if it still is the one bound here */
  remove(): void;
}

let bound = 0;

/**
 * Binds a unix socket at path with mode (no moment with a wider one): listen
 * is given the private name to listen on. Throws when the path is served by
 * another process, or is not a socket.
 */
export async function bindUnixSocket(path: string, mode: number, listen: (privatePath: string) => Promise<unknown>): Promise<BoundSocket> {
  await prepareUnixSocket(path);
  // short: a socket path has at most 107 bytes
  const privatePath = join(dirname(path), `.kpng-${process.pid}-${++bound}`);
  const old = process.umask(0o777 & ~mode);
  try {
    await listen(privatePath);
  } finally {
    process.umask(old);
  }
  chmodSync(privatePath, mode);
  renameSync(privatePath, path);
  const mine = lstatSync(path);
  return {
    path,
    remove() {
      try {
        const now = lstatSync(path);
        if (now.ino === mine.ino && now.dev === mine.dev) unlinkSync(path);
      } catch {
        // already gone
      }
    },
  };
}
