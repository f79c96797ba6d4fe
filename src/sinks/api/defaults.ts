// Flag defaults and help of to-api and of the state socket, apart from the
// server so that the commands' flags (registered at every start) load none of it.
import { runSocket } from '../../runtime/run-dir.js';

export const DEFAULT_BRAIN_SOCKET = runSocket('brain.sock');
export const DEFAULT_NODE_SOCKET = runSocket('node.sock');

export const STATE_SOCKET_HELP = "serve this process's state read-only here for kpng get (unix:///path, mode 0600; '' : not at all)";

/** to-api's --heap-growth default: the heap may grow 50% past what survived the last full GC */
export const DEFAULT_HEAP_GROWTH_PERCENT = 50;
