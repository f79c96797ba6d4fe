// A peer for the userspace tests, run inside a lab namespace:
//   sink PORT            accept, never read
//   source PORT          accept, write as fast as the connection takes
//   echo PORT            accept, echo, end after the client's end
//   push HOST PORT MS    connect, write as fast as the connection takes for MS, print bytes flushed
//   hold HOST PORT MS    connect, never read, for MS
//   many HOST PORT N [trickle]
//                        hold N connections open at once (at most 256 connecting at a time), each
//                        answered "ping" for "ping" (trickle: then a byte a second, as a slowloris);
//                        prints how they went ({"ok","reset","refused","timeout","other"}); on
//                        stdin's end, half-closes the open ones and prints {"closed"} once the
//                        other side ended each, then exits
// Prints "ready" once listening or connected.
import { createServer, connect } from 'node:net';

const [mode, a, b, c, d] = process.argv.slice(2);
const chunk = Buffer.alloc(64 * 1024, 120);
const pump = (s) => {
  const go = () => {
    while (!s.destroyed && s.write(chunk));
  };
  s.on('drain', go);
  go();
};
if (mode === 'echo') {
  createServer({ backlog: 65535 }, (s) => {
    s.on('error', () => {});
    s.pipe(s);
  }).listen({ port: Number(a), backlog: 65535 }, () => console.log('ready'));
} else if (mode === 'many') many(a, Number(b), Number(c), d === 'trickle');
else if (mode === 'sink' || mode === 'source') {
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

function many(host, port, n, trickle) {
  const counts = { ok: 0, reset: 0, refused: 0, timeout: 0, other: 0 };
  const open = [];
  let settled = 0;
  let started = 0;
  const next = () => {
    while (started < n && started - settled < 256) one();
  };
  const one = () => {
    started++;
    const s = connect({ host, port, allowHalfOpen: true });
    let done = false;
    const end = (k) => {
      if (done) return;
      done = true;
      counts[k]++;
      if (k === 'ok') open.push(s);
      if (++settled === n) console.log(JSON.stringify(counts));
      next();
    };
    s.setTimeout(30_000, () => (end('timeout'), s.destroy()));
    s.on('connect', () => s.write('ping'));
    s.once('data', () => {
      s.setTimeout(0);
      end('ok');
      if (trickle) s.ticker = setInterval(() => s.write('.'), 1000);
    });
    s.on('error', (e) => end(e.code === 'ECONNRESET' ? 'reset' : e.code === 'ECONNREFUSED' ? 'refused' : 'other'));
    s.on('close', () => end('other'));
  };
  next();
  process.stdin.resume();
  process.stdin.on('end', () => {
    let closed = 0;
    if (!open.length) console.log(JSON.stringify({ closed }));
    for (const s of open) {
      clearInterval(s.ticker);
      s.on('data', () => {});
      s.on('close', () => ++closed === open.length && console.log(JSON.stringify({ closed })));
      s.end();
    }
    setTimeout(() => process.exit(0), 30_000).unref();
  });
}
