// One kpng node agent per node. A long-running node agent (to-local, kpng
// local) holds an exclusive flock(2) on kpng.lock beside its state socket
// (/run/kpng/kpng.lock) for as long as it runs, and writes in it which kpng
// holds it: pid, version, command line, node, since when. A second agent is
// refused before it touches the dataplane or the socket, with one line naming
// the holder; two kpngs never program one node against each other.
//
// The kernel holds the lock, not the file: it goes with the process however
// the process ends (no stale lock to clean, the pid is only shown, never
// trusted), and only one open file can hold it. The file lives in kpng's own
// root-only directory, where no other user can take it first. node:fs has no
// flock, hence the libc call.
import { closeSync, constants, ftruncateSync, mkdirSync, openSync, readFileSync, writeSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { libc } from '../../kernel/libc.js';
import type { Logger } from '../../runtime/log.js';
import { version } from '../../runtime/version.js';
import { DEFAULT_NODE_SOCKET } from '../api/defaults.js';

const LOCK_EX = 2;
const LOCK_NB = 4;
const EWOULDBLOCK = 11;

/** The node agent holding the lock, as it wrote itself in the file. */
export interface NodeLockHolder {
  pid: number;
  kpng: string;
  command: string;
  node: string;
  since: string;
}

/** Another node agent holds the lock: this one must not run. */
export class NodeLockHeld extends Error {
  constructor(
    readonly path: string,
    readonly holder?: NodeLockHolder,
  ) {
    const who = holder ? `kpng ${holder.kpng} pid ${holder.pid} (node ${holder.node}, since ${holder.since}: ${holder.command})` : 'another kpng';
    super(`another kpng node agent runs on this node: ${who} holds ${path}; stop it first (one kpng per node)`);
  }
}

/** kpng.lock beside the state socket (unix:///dir/node.sock); beside the default one when there is none. */
export function nodeLockPath(stateSocket: string | undefined): string {
  const unix = stateSocket?.startsWith('unix://') ? stateSocket.slice('unix://'.length) : undefined;
  return join(dirname(unix || DEFAULT_NODE_SOCKET.slice('unix://'.length)), 'kpng.lock');
}

export interface NodeLock {
  readonly path: string;
  release(): void;
}

/**
 * Takes the node lock, or throws NodeLockHeld naming its holder. Where it
 * cannot be taken at all (no libc, a read-only /run) the agent runs without
 * it, with a warning: the lock guards against a mistake, it is not what
 * makes kpng work.
 */
export function takeNodeLock(path: string, holder: Omit<NodeLockHolder, 'pid' | 'kpng' | 'since'>, log: Logger): NodeLock | undefined {
  let fd: number;
  try {
    mkdirSync(dirname(path), { recursive: true, mode: 0o750 });
    fd = openSync(path, constants.O_RDWR | constants.O_CREAT, 0o640);
  } catch (e) {
    log.warn({ lock: path, err: (e as Error).message }, `cannot open the node lock ${path}; running without it (a second kpng on this node would not be refused)`);
    return undefined;
  }
  let taken: number;
  let errno = 0;
  try {
    const c = libc();
    taken = c.flock(fd, LOCK_EX | LOCK_NB);
    if (taken !== 0) errno = c.errno();
  } catch (e) {
    closeSync(fd);
    log.warn({ lock: path, err: (e as Error).message }, `cannot lock ${path}; running without the node lock`);
    return undefined;
  }
  if (taken !== 0) {
    closeSync(fd);
    if (errno === EWOULDBLOCK) throw new NodeLockHeld(path, readHolder(path));
    log.warn({ lock: path, errno }, `cannot lock ${path} (errno ${errno}); running without the node lock`);
    return undefined;
  }
  const me: NodeLockHolder = { pid: process.pid, kpng: version(), command: holder.command, node: holder.node, since: new Date().toISOString() };
  ftruncateSync(fd, 0);
  writeSync(fd, `${JSON.stringify(me)}\n`, 0);
  let released = false;
  return {
    path,
    release() {
      if (released) return;
      released = true;
      // the record goes with the lock: a file read later names no one
      ftruncateSync(fd, 0);
      closeSync(fd);
    },
  };
}

function readHolder(path: string): NodeLockHolder | undefined {
  try {
    const h = JSON.parse(readFileSync(path, 'utf8')) as NodeLockHolder;
    return typeof h.pid === 'number' ? h : undefined;
  } catch {
    // the holder has not written itself yet
    return undefined;
  }
}
