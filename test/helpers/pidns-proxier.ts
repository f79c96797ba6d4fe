// Run by test/nft/drift.test.ts in a pid namespace of its own (`unshare
// --pid --fork`, as kpng in a pod without hostPID): to-nft checking for drift
// every syncPeriod in the test's network namespace, its tools from a
// directory the test made. Prints one JSON line once the Service is
// programmed ({ "ready": true }), then one per repair ({ "repairs", "why" });
// ends when its stdin closes.
//   pidns-proxier.ts NETNS TOOL_DIR SYNC_PERIOD_MS
import { join } from 'node:path';
import { pino } from 'pino';
import { syncedStore } from './k8s.js';
import { driftCluster, watchingNft } from './drift.js';

const [netns, toolDir, syncPeriodMs] = process.argv.slice(2);
let why = '';
// the repair's log line (before its sync) says why
const log = pino({ level: 'warn' }, { write: (line: string) => void (why = (JSON.parse(line) as { why?: string }).why ?? why) });
const say = (o: object) => process.stdout.write(`${JSON.stringify(o)}\n`);
const h = watchingNft(syncedStore(driftCluster()), {
  netns,
  tool: (name) => join(toolDir, name),
  syncPeriodMs: Number(syncPeriodMs),
  log,
  report: (r) => r.repaired && say({ repairs: h.proxier.stats.repairs, why }),
});
await h.sync();
say({ ready: true });
process.stdin.resume();
process.stdin.on('end', () => void h.close().then(() => process.exit(0)));
