// Run in a pid namespace of its own (as kpng in a pod without hostPID) by
// test/nft/watch.test.ts: kpng's nft session changes a table while the drift
// watch looks on, knowing kpng's own by pid only, or by netlink port too.
// Prints the watch's verdict as JSON: { drift, nftPid }.
import { pino } from 'pino';
import { NftWatch } from '../../src/backends/shared/nftables/watch.js';
import { SessionNft } from '../../src/backends/shared/nftables/nft.js';

const [netns, nftPath, byPort] = process.argv.slice(2);
const nft = new SessionNft({ path: nftPath });
const watch = new NftWatch({
  ours: (e) => e.table === 'kpngns',
  ownsPid: (pid) => nft.ownsPid(pid),
  ownsPort: byPort === 'port' ? (port) => nft.ownsPort(port) : undefined,
  netns,
  log: pino({ level: 'silent' }),
});
try {
  watch.start();
  await nft.run('add table ip kpngns\nadd chain ip kpngns c\nadd rule ip kpngns c drop\n');
  const drift = watch.check() ?? null;
  process.stdout.write(JSON.stringify({ drift, self: process.pid }));
} finally {
  watch.close();
  nft.close();
}
