// Real SCTP in the lab: the agents serve and connect with SCTP sockets (a
// Python helper: Node has none) and report what TCP reports (who answered,
// the address it was reached at, the source it saw); REJECT, DROP and a port
// nobody serves stay apart. Where the kernel has no SCTP, an SCTP request
// fails with that error instead of going out as TCP. The SCTP cases run in
// the kernel lab (docs/kernel-lab.md), in one VM.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { Lab, POD_GATEWAY, describeOutcome, kernelHasSCTP, labUnsupported, seenSource, spread, verdict, type Outcome } from '../../src/lab/index.js';
import { kernelLabSkip, requireKernelLab, runScriptInVm } from '../helpers/kernel-lab.js';
import type { SctpCases } from './lab-sctp.guest.js';

const GUEST = fileURLToPath(new URL('./lab-sctp.guest.ts', import.meta.url));

describe('lab SCTP where the kernel has none', { skip: labUnsupported() ?? (kernelHasSCTP() ? 'this kernel has SCTP' : false) }, () => {
  let lab: Lab;
  before(async () => {
    lab = await Lab.create({ tag: 'nosctp', node: { name: 'node-a' }, pods: [{ name: 'web', ips: ['10.180.0.1'] }, { name: 'client', ips: ['10.0.0.2'] }] });
    await lab.serve('web', { tcp: [53] });
  });
  after(() => lab?.close());

  it('an SCTP server or probe fails with a clear error, never TCP', async () => {
    await assert.rejects(lab.serve('web', { sctp: [53] }), /this kernel has no SCTP: socket\(AF_INET, SOCK_STREAM, IPPROTO_SCTP\) failed/);
    // a TCP server on the port: an SCTP probe sent as TCP would be answered
    await assert.rejects(lab.connect({ from: '10.0.0.2', to: '10.180.0.1', port: 53, protocol: 'SCTP' }), /this kernel has no SCTP/);
    const tcp = await lab.connect({ from: '10.0.0.2', to: '10.180.0.1', port: 53 });
    assert.equal(tcp.kind, 'answered', describeOutcome(tcp));
  });
});

describe('lab SCTP in the kernel lab', { skip: kernelLabSkip() }, () => {
  let out: SctpCases;
  const o = (k: string) => out[k] as Outcome;

  before(
    async () => {
      requireKernelLab();
      const r = await runScriptInVm<SctpCases>(GUEST, null, { timeoutMs: 10 * 60_000 });
      out = r.result;
      console.log(`kernel lab: boot ${r.bootMs} ms, SCTP lab cases ${r.ms} ms in all`);
    },
    { timeout: 11 * 60_000 },
  );

  it('marks closed ports (the lab table loads, with its SCTP sets)', () => {
    assert.equal(out.closedPortsMarked, 'true');
  });

  it('answers SCTP with the server reached and the source it saw (IPv4 and IPv6)', () => {
    const d = o('direct');
    assert.equal(d.kind, 'answered', describeOutcome(d));
    assert.equal(d.kind === 'answered' && d.by, 'web-1');
    assert.equal(verdict(d, '10.180.0.1', 53), '');
    assert.equal(seenSource(d), '10.0.0.2');
    const d6 = o('direct6');
    assert.equal(verdict(d6, 'fd00:10::1', 53), '', describeOutcome(d6));
    assert.equal(seenSource(d6), 'fd00:10::2');
    const w = o('untouched');
    assert.equal(w.kind === 'answered' && w.by, 'world', describeOutcome(w));
    assert.equal(verdict(w, '172.30.0.50', 53), '');
  });

  it('sees DNAT spread over both endpoints, each reporting its own address', () => {
    const all = out.dnat as Outcome[];
    assert.deepEqual([...spread(all).keys()].sort(), ['10.180.0.1:53', '10.180.2.1:53'], JSON.stringify([...spread(all)]));
    for (const x of all) assert.equal(seenSource(x), '10.0.0.2');
  });

  it('sees masquerade', () => {
    const m = o('masq');
    assert.equal(verdict(m, '172.30.0.43', 53), '10.180.0.1:53', describeOutcome(m));
    assert.equal(seenSource(m), POD_GATEWAY[4]);
  });

  it('tells REJECT from DROP from a port nobody serves', () => {
    assert.equal(verdict(o('reject'), '172.30.0.99', 53), 'REJECT', describeOutcome(o('reject')));
    assert.ok(o('reject').ms < 3000, `REJECT took ${o('reject').ms} ms`);
    assert.equal(verdict(o('drop'), '172.30.0.98', 53), 'DROP', describeOutcome(o('drop')));
    assert.equal(o('closedPort').kind, 'unreachable', describeOutcome(o('closedPort')));
  });

  it('serves SCTP only: TCP to the same port is not answered', () => {
    assert.equal(o('tcpToSctpPort').kind, 'unreachable', describeOutcome(o('tcpToSctpPort')));
  });

  it('keeps an association for more exchanges, until the server drops it', () => {
    const first = o('keptFirst');
    const again = o('keptAgain');
    assert.equal(first.kind, 'answered', describeOutcome(first));
    assert.equal(again.kind, 'answered', describeOutcome(again));
    assert.equal(first.kind === 'answered' && again.kind === 'answered' && first.client, again.kind === 'answered' && again.client, 'the same association');
    assert.notEqual(o('keptAfterUnserve').kind, 'answered', describeOutcome(o('keptAfterUnserve')));
    assert.equal(o('afterUnserve').kind, 'unreachable', describeOutcome(o('afterUnserve')));
  });
});
