// Unix socket paths kpng serves on (the API, the state socket, the tenant
// socket): the directory is made, a stale socket left by a killed kpng is
// removed, and a live one (another kpng on this host) is never taken over.
import { lstatSync, mkdirSync, unlinkSync } from 'node:fs';
import { connect } from 'node:net';
import { dirname } from 'node:path';

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
