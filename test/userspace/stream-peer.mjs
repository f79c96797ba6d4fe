// A peer for the userspace backpressure tests, run inside a lab namespace:
//   sink PORT            accept, never read
//   source PORT          accept, write as fast as the connection takes
//   push HOST PORT MS    connect, write as fast as the connection takes for MS, print bytes flushed
//   hold HOST PORT MS    connect, never read, for MS
// Prints "ready" once listening or connected.
import { createServer, connect } from 'node:net';

const [mode, a, b, c] = process.argv.slice(2);
const chunk = Buffer.alloc(64 * 1024, 120);
const pump = (s) => {
  const go = () => {
    while (!s.destroyed && s.write(chunk));
  };
  s.on('drain', go);
  go();
};
if (mode === 'sink' || mode === 'source') {
  createServer({ pauseOnConnect: mode === 'sink' }, (s) => {
    s.on('error', () => {});
    if (mode === 'source') pump(s);
  }).listen(Number(a), () => console.log('ready'));
} else {
  const s = connect({ host: a, port: Number(b) }, () => {
    console.log('ready');
    if (mode === 'push') pump(s);
    else s.pause();
    setTimeout(() => {
      console.log(JSON.stringify({ flushed: s.bytesWritten - s.writableLength, read: s.bytesRead }));
      s.destroy();
      process.exit(0);
    }, Number(c));
  });
  s.on('error', (e) => {
    console.log(JSON.stringify({ error: e.message }));
    process.exit(1);
  });
}
