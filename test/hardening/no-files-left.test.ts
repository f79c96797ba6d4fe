// A kpng process with no file left (its open files limit reached: EMFILE)
// must fail the transaction it was running, not die: a tool it runs (nft
// listing, a process per transaction) and its long-lived `nft -i` session
// both reject with why, and work again once files are free (issue 40: under
// `ulimit -n 1024`, a spawn's EMFILE was an unhandled 'error' event that
// killed to-userspace).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { ROOT } from '../helpers/cli.js';

/** runs in a child under `ulimit -n 64`: fills its files, runs both, frees, runs both again */
const CHILD = `
import { openSync, closeSync } from 'node:fs';
import { runTool } from './src/backends/shared/tool.ts';
import { NftSession } from './src/backends/shared/nftables/nft.ts';
const session = new NftSession('cat', { timeoutMs: 5000 });
const held = [];
try { for (;;) held.push(openSync('/dev/null', 'r')); } catch (e) { if (e.code !== 'EMFILE') throw e; }
const outcome = (p) => p.then(() => 'ran', (e) => 'refused: ' + e.message);
const full = { tool: await outcome(runTool('true', [])), session: await outcome(session.run('x')) };
for (const fd of held) closeSync(fd);
const freed = { tool: await outcome(runTool('true', [])) };
console.log(JSON.stringify({ full, freed }));
session.close();
`;

test('with no file left, running a tool or the nft session is refused with why, and the process lives on', () => {
  const r = spawnSync('sh', ['-c', `ulimit -n 64 && exec "${process.execPath}" --import tsx --input-type=module -e "$0"`, CHILD], { cwd: ROOT, encoding: 'utf8', timeout: 60_000 });
  assert.equal(r.status, 0, `the process died:\n${r.stderr}`);
  const { full, freed } = JSON.parse(r.stdout.trim().split('\n').pop()!);
  assert.match(full.tool, /^refused: cannot run true: .*EMFILE/);
  assert.match(full.session, /^refused: cannot run cat: .*EMFILE/);
  assert.equal(freed.tool, 'ran');
});
