// The iptables packet-flow scenarios (test/data/flows/iptables_*.json) with
// real packets: per scenario and per iptables mode (nft, legacy) a lab, kpng
// applied once with to-iptables in the node's namespace, then every flow sent
// for real and compared with upstream kube-proxy's expectation.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Lab, kernelHasSCTP } from '../../src/lab/index.js';
import { MODES, iptablesArgs, iptablesLabUnsupported } from '../helpers/iptables.js';
import { checkFlow, configFor, flowTitle, labSpecFor, loadScenario, scenarioFiles, serveScenario, stateFor } from '../helpers/lab-flows.js';

const sctp = kernelHasSCTP();

for (const mode of MODES) {
  const skip = await iptablesLabUnsupported(mode);
  // scenarios two at a time (each has its own lab), flows of a scenario all at once
  describe(`iptables packet flows (iptables-${mode})`, { skip, concurrency: 2 }, () => {
    for (const file of scenarioFiles('iptables')) {
      const s = loadScenario(file);
      describe(file, { concurrency: true }, () => {
        let lab: Lab | undefined;
        let dir = '';

        before(async () => {
          dir = mkdtempSync(join(tmpdir(), 'kpng-ipt-flows-'));
          writeFileSync(join(dir, 'state.json'), JSON.stringify(stateFor(s), null, 1));
          writeFileSync(join(dir, 'config.json'), JSON.stringify(configFor(s), null, 1));
          const t0 = Date.now();
          lab = await Lab.create(labSpecFor(s, `iptflows${mode}`));
          assert.ok(lab.closedPortsMarked, 'the lab cannot tell a closed port from REJECT here (nft socket expression missing?)');
          await serveScenario(lab, s);
          const t1 = Date.now();
          const r = await lab.runKpng(iptablesArgs(join(dir, 'state.json'), s.node.name, join(dir, 'config.json'), mode, { once: true }));
          assert.equal(r.code, 0, `kpng --once failed (${r.code}):\n${r.stderr.slice(-4000)}`);
          console.log(`${file} (${mode}): lab ${t1 - t0} ms, kpng --once ${Date.now() - t1} ms`);
        });

        after(async () => {
          await lab?.close();
          if (dir) rmSync(dir, { recursive: true, force: true });
        });

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
