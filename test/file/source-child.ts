// A process running a file source over argv[2] (for the tests in test/file),
// logging JSON lines to stdout:
// stdin "exhaust" opens descriptors until EMFILE, "release" closes them,
// "keys" prints the store's services, "keys-when K" prints them once K is there.
import { openSync, closeSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { pino } from 'pino';
import { Store } from '../../src/store/store.js';
import { FileSource } from '../../src/sources/file/index.js';

const store = new Store();
const log = pino({ level: 'info', base: undefined });
const source = new FileSource(store, log, { input: process.argv[2], debounceMs: 50 });
const keys = () => [...store.serviceKeys()].sort().join(',');
await source.start();
process.stdout.write(`keys ${keys()}\n`);
const held: number[] = [];
for await (const line of createInterface({ input: process.stdin })) {
  const [cmd, arg] = line.split(' ');
  if (cmd === 'exhaust') {
    for (;;) {
      try {
        held.push(openSync('/dev/null', 'r'));
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== 'EMFILE') throw e;
        break;
      }
    }
    process.stdout.write(`exhausted ${held.length}\n`);
  } else if (cmd === 'release') {
    for (const fd of held.splice(0)) closeSync(fd);
  } else if (cmd === 'keys') {
    process.stdout.write(`keys ${keys()}\n`);
  } else if (cmd === 'keys-when') {
    const end = Date.now() + 15_000;
    while (!store.getService(arg) && Date.now() < end) await new Promise((r) => setTimeout(r, 50));
    process.stdout.write(`keys ${keys()}\n`);
  }
}
