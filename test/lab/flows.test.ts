// The packet-flow scenarios (test/data/flows) with real packets, for every
// backend: nftables_*.json with to-nft, iptables_*.json with to-iptables
// (iptables-nft and iptables-legacy). Per scenario a lab, kpng applied once in
// the node's namespace, then every flow sent for real and compared with
// upstream kube-proxy's expectation.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { Lab, kernelHasSCTP } from '../../src/lab/index.js';
import { BACKENDS, applyOnce, backendLabUnsupported, backendLabel, backendTag, proxyMode } from '../helpers/lab-kpng.js';
import { checkFlow, configFor, flowTitle, labSpecFor, loadScenario, scenarioFiles, serveScenario, stateFor } from '../helpers/lab-flows.js';

const sctp = kernelHasSCTP();

for (const b of BACKENDS) {
  const skip = await backendLabUnsupported(b);
  const mode = proxyMode(b);
  // scenarios two at a time (each has its own lab), flows of a scenario all at once
  describe(b.name === 'nft' ? 'nftables packet flows' : `iptables packet flows (${backendLabel(b)})`, { skip, concurrency: 2 }, () => {
    for (const file of scenarioFiles(mode)) {
      const s = loadScenario(file);
      describe(file, { concurrency: true }, () => {
        let lab: Lab | undefined;

        before(async () => {
          const t0 = Date.now();
          lab = await Lab.create(labSpecFor(s, `flows${backendTag(b)}`));
          assert.ok(lab.closedPortsMarked, 'the lab cannot tell a closed port from REJECT here (nft socket expression missing?)');
          await serveScenario(lab, s);
          const ms = await applyOnce(b, lab, stateFor(s).items, configFor(s));
          console.log(`${file}${b.name === 'nft' ? '' : ` (${b.mode})`}: lab ${Date.now() - t0 - ms} ms, kpng --once ${ms} ms`);
        });

        after(() => lab?.close());

        s.flows.forEach((f, i) => {
          const skipFlow = f.protocol === 'SCTP' && !sctp ? 'this kernel has no SCTP (/proc/net/protocols)' : false;
          it(flowTitle(f, i), { skip: skipFlow }, async () => {
            const r = await checkFlow(lab!, s, f);
            assert.ok(r.problems.length === 0, r.problems.join('\n'));
          });
        });
      });
    }
  });
}
