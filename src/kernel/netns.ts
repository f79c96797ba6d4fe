// Sockets in another network namespace: this thread enters it for the
// socket() call only (a socket stays in the namespace it was made in).
import { closeSync, openSync } from 'node:fs';
import { KernelError, libc } from './libc.js';

const CLONE_NEWNET = 0x40000000;

/**
 * Runs fn with this thread in another network namespace (a name under
 * /run/netns, or a path); sockets made there stay there. Without netns, in
 * this process's own.
 */
export function inNetns<T>(netns: string | undefined, fn: () => T): T {
  if (!netns) return fn();
  const c = libc();
  const own = openSync('/proc/thread-self/ns/net', 'r');
  const target = openSync(netns.includes('/') ? netns : `/run/netns/${netns}`, 'r');
  try {
    if (c.setns(target, CLONE_NEWNET) !== 0) throw new KernelError(`setns ${netns}: errno ${c.errno()}`);
    try {
      return fn();
    } finally {
      if (c.setns(own, CLONE_NEWNET) !== 0) throw new KernelError(`setns back: errno ${c.errno()}`); // cannot happen: the thread was there
    }
  } finally {
    closeSync(own);
    closeSync(target);
  }
}
