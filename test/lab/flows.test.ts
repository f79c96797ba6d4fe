// The packet-flow scenarios (test/data/flows) with real packets, for every
// backend: nftables_*.json with to-nft, iptables_*.json with to-iptables
// (iptables-nft and iptables-legacy). Per scenario a lab, kpng applied once in
// the node's namespace, then every flow sent for real and compared with
// upstream kube-proxy's expectation, and with what `kpng trace` predicts from
// the rules it reads back from the kernel. SCTP flows, where this kernel has no
// SCTP, run in the kernel lab (Debian's kernel under QEMU), all in one VM.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { Lab, kernelHasSCTP } from '../../src/lab/index.js';
import { BACKENDS, applyOnce, backendLabUnsupported, backendLabel, backendTag, proxyMode } from '../helpers/lab-kpng.js';
import { checkFlow, compareTrace, traceInLab, configFor, flowTitle, flowsHere, labSpecFor, loadScenario, scenarioFiles, serveScenario, stateFor, type Flow } from '../helpers/lab-flows.js';
import { resultKey, runFlowsInKernelLab, type FlowJob, type KernelLabFlows } from '../helpers/kernel-lab-flows.js';
import { kernelLabSkip, requireKernelLab } from '../helpers/kernel-lab.js';

const sctpHere = kernelHasSCTP();
const onHost = (f: Flow) => f.protocol !== 'SCTP' || sctpHere; // as flowsHere

for (const b of BACKENDS) {
  const skip = await backendLabUnsupported(b);
  const mode = proxyMode(b);
  // scenarios two at a time (each has its own lab), flows of a scenario all at once
  describe(b.name === 'nft' ? 'nftables packet flows' : `iptables packet flows (${backendLabel(b)})`, { skip, concurrency: 2 }, () => {
    for (const file of scenarioFiles(mode)) {
      const s = loadScenario(file);
      const flows = flowsHere(s);
      if (!flows.length) continue;
      describe(file, { concurrency: true }, () => {
        let lab: Lab | undefined;

        before(async () => {
          const t0 = Date.now();
          lab = await Lab.create(labSpecFor(s, `flows${backendTag(b)}`));
          assert.ok(lab.closedPortsMarked, 'the lab cannot tell a closed port from REJECT here (nft socket expression missing?)');
          await serveScenario(lab, s, flows);
          const ms = await applyOnce(b, lab, stateFor(s).items, configFor(s));
          console.log(`${file}${b.name === 'nft' ? '' : ` (${b.mode})`}: lab ${Date.now() - t0 - ms} ms, kpng --once ${ms} ms`);
        });

        after(() => lab?.close());

        s.flows.forEach((f, i) => {
          if (!onHost(f)) return;
          // kpng trace reads the same rules back from the kernel first; its
          // prediction must be what the packets then really did
          it(flowTitle(f, i), async () => {
            const t = await traceInLab(lab!, f);
            const r = await checkFlow(lab!, s, f);
            assert.ok(r.problems.length === 0, r.problems.join('\n'));
            const d = compareTrace(f, t, r.outcomes);
            assert.ok(d.length === 0, `kpng trace does not predict the real outcome:\n${d.join('\n')}`);
          });
        });
      });
    }
  });
}

// Every backend's SCTP flows in one VM; each flow still its own test case.
const vmJobs: FlowJob[] = sctpHere
  ? []
  : BACKENDS.flatMap((b) =>
      scenarioFiles(proxyMode(b)).map((file) => ({ backend: b, file, flows: loadScenario(file).flows.flatMap((f, i) => (onHost(f) ? [] : [i])) })),
    ).filter((j) => j.flows.length);

if (vmJobs.length) {
  // in CI the kernel lab must be there (scripts/setup.mjs prepares it): a missing one fails
  describe('SCTP packet flows in the kernel lab (this kernel has no SCTP)', { skip: kernelLabSkip() }, () => {
    let run: KernelLabFlows | undefined;

    before(
      async () => {
        requireKernelLab();
        run = await runFlowsInKernelLab(vmJobs);
        console.log(`kernel lab: boot ${run.bootMs} ms, ${vmJobs.length} lab(s) ${run.ms} ms in all\n${run.log}`);
      },
      { timeout: 16 * 60_000 },
    );

    for (const b of BACKENDS) {
      const jobs = vmJobs.filter((j) => j.backend === b);
      if (!jobs.length) continue;
      describe(backendLabel(b), () => {
        for (const job of jobs) {
          const s = loadScenario(job.file);
          describe(job.file, () => {
            for (const i of job.flows) {
              it(flowTitle(s.flows[i], i), (t) => {
                const r = run?.results.get(resultKey(b, job.file, i));
                assert.ok(r, 'the kernel lab returned no result for this flow');
                if (r.skip) return t.skip(r.skip);
                assert.ok(r.problems.length === 0, r.problems.join('\n'));
              });
            }
          });
        }
      });
    }
  });
}
