// Where a node's kpng keeps its sockets and its lock: /run/kpng, or the
// directory KPNG_RUN_DIR names (the test suite gives each run its own, so
// that tests never touch the host's /run/kpng; several kpngs on one
// development host can do the same).
export const RUN_DIR = process.env.KPNG_RUN_DIR || '/run/kpng';

/** a unix socket address in the run directory */
export const runSocket = (name: string): string => `unix://${RUN_DIR}/${name}`;
