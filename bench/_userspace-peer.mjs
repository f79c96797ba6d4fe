// The client and server of bench/userspace.ts, run inside lab namespaces. Each
// prints one JSON line when done (or "ready" lines as it goes):
//   serve PORT_SINK PORT_ONE   a sink (reads, discards) and a one-byte answerer
//   push HOST PORT MS          one bulk TCP stream for MS: {bytes, ms}
//   rate HOST PORT MS CONC     short connections (connect, read 1 byte, close), CONC at once: {conns, errors, ms}
//   hold HOST PORT N           N connections kept open: "ready N", then waits to be killed
import { createServer, connect } from 'node:net';

const [mode, ...a] = process.argv.slice(2);
const now = () => Number(process.hrtime.bigint()) / 1e6;
const out = (o) => console.log(JSON.stringify(o));

if (mode === 'serve') {
  createServer((s) => {
    s.on('error', () => {});
    s.resume();
  }).listen(Number(a[0]));
  createServer((s) => {
    s.on('error', () => {});
    s.end('x');
  }).listen(Number(a[1]), () => console.log('ready'));
} else if (mode === 'push') {
  const chunk = Buffer.alloc(256 * 1024, 120);
  const s = connect({ host: a[0], port: Number(a[1]) }, () => {
    const t0 = now();
    const go = () => {
      while (s.write(chunk));
    };
    s.on('drain', go);
    go();
    setTimeout(() => {
      out({ bytes: s.bytesWritten - s.writableLength, ms: now() - t0 });
      process.exit(0);
    }, Number(a[2]));
  });
  s.on('error', (e) => (out({ error: e.message }), process.exit(1)));
} else if (mode === 'rate') {
  const [host, port, ms, conc] = [a[0], Number(a[1]), Number(a[2]), Number(a[3])];
  let conns = 0;
  let errors = 0;
  const t0 = now();
  const end = t0 + ms;
  let running = conc;
  const one = () => {
    if (now() >= end) {
      if (--running === 0) out({ conns, errors, ms: now() - t0 });
      return;
    }
    const s = connect({ host, port });
    let got = false;
    s.on('data', () => (got = true));
    s.on('close', () => {
      if (got) conns++;
      else errors++;
      one();
    });
    s.on('error', () => {});
  };
  for (let i = 0; i < conc; i++) one();
} else if (mode === 'hold') {
  const [host, port, n] = [a[0], Number(a[1]), Number(a[2])];
  let open = 0;
  const socks = [];
  const next = () => {
    const s = connect({ host, port }, () => {
      open++;
      if (open === n) console.log(`ready ${n}`);
      else next();
    });
    s.on('error', (e) => (out({ error: e.message, open }), process.exit(1)));
    socks.push(s);
  };
  next();
}
