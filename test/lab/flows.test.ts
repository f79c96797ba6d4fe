// The packet-flow scenarios (test/data/flows) with real packets, for every
// backend: nftables_*.json with to-nft, iptables_*.json with to-iptables
// (iptables-nft and iptables-legacy). Per scenario a lab, kpng applied once in
// the node's namespace, then every flow sent for real and compared with
// upstream kube-proxy's expectation, and with what `kpng trace` predicts from
// the rules it reads back from the kernel. SCTP flows, where this kernel has no
// SCTP, run in the kernel lab (Debian's kernel under QEMU), every backend's
// (to-ebpf + to-nft's too) in one VM.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { Lab, LabCgroup, kernelHasSCTP, labCgroupUnsupported } from '../../src/lab/index.js';
import { BACKENDS, applyOnce, backendLabUnsupported, backendLabel, backendTag, proxyMode, type LabBackend } from '../helpers/lab-kpng.js';
import { checkFlow, compareTrace, traceInLab, configFor, flowTitle, flowsHere, labSpecFor, loadScenario, placePodAgents, scenarioFiles, serveScenario, socketTranslated, stateFor, type Flow } from '../helpers/lab-flows.js';
import { resultKey, runFlowsInKernelLab, type FlowJob, type KernelLabFlows } from '../helpers/kernel-lab-flows.js';
import { kernelLabSkip, requireKernelLab } from '../helpers/kernel-lab.js';
import { skipOrFailInCI } from '../helpers/ci.js';
import { libbpfUnavailable, objGet } from '../../src/backends/ebpf/libbpf.js';
import { readCounters } from '../../src/backends/ebpf/maps.js';

const sctpHere = kernelHasSCTP();
const onHost = (f: Flow) => f.protocol !== 'SCTP' || sctpHere; // as flowsHere

// The flows this kernel cannot carry, per backend and scenario, for the kernel
// lab; to-ebpf + to-nft's backend is a placeholder: the guest makes the cgroup
// and bpffs (test/helpers/kernel-lab-flows.ts).
const EBPF_IN_VM: LabBackend = { name: 'ebpf+nft', cgroupPath: '', bpffs: '' };
const vmJobs: FlowJob[] = sctpHere
  ? []
  : [...BACKENDS, EBPF_IN_VM].flatMap((b) =>
      scenarioFiles(proxyMode(b)).map((file) => ({ backend: b, file, flows: loadScenario(file).flows.flatMap((f, i) => (onHost(f) ? [] : [i])) })),
    ).filter((j) => j.flows.length);

// one VM for all of them, booted by the first suite that needs it
let vmRun: Promise<KernelLabFlows> | undefined;
function kernelLabRun(): Promise<KernelLabFlows> {
  vmRun ??= (async () => {
    requireKernelLab();
    const run = await runFlowsInKernelLab(vmJobs);
    console.log(`kernel lab: boot ${run.bootMs} ms, ${vmJobs.length} lab(s) ${run.ms} ms in all\n${run.log}`);
    return run;
  })();
  return vmRun;
}

/** One test case per flow of the jobs, asserting what the kernel lab found. */
function vmFlowCases(jobs: FlowJob[], getRun: () => KernelLabFlows | undefined, skipOrFail: (why: string) => string | undefined = (why) => why): void {
  for (const job of jobs) {
    const s = loadScenario(job.file);
    describe(job.file, () => {
      for (const i of job.flows) {
        it(flowTitle(s.flows[i], i), (t) => {
          const r = getRun()?.results.get(resultKey(job.backend, job.file, i));
          assert.ok(r, 'the kernel lab returned no result for this flow');
          if (r.skip) return t.skip(skipOrFail(r.skip));
          assert.ok(r.problems.length === 0, r.problems.join('\n'));
        });
      }
    });
  }
}

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

// Every nftables scenario through `to-local to-ebpf to-nft`, the pods' agents
// in a cgroup of the scenario's own with the programs attached to it: pod
// flows are translated at the socket (no masquerade then: the pod connects
// to the endpoint itself), the others go through nftables as before.
{
  const skip = skipOrFailInCI(labCgroupUnsupported() ?? libbpfUnavailable()) ?? (await backendLabUnsupported({ name: 'ebpf+nft', cgroupPath: '', bpffs: '' }));
  describe('nftables packet flows through to-ebpf + to-nft', { skip, concurrency: 2 }, () => {
    for (const file of scenarioFiles('nftables')) {
      const s = loadScenario(file);
      const flows = flowsHere(s);
      if (!flows.length) continue;
      // the flows at once, then the counter
      describe(file, { concurrency: 1 }, () => {
        let lab: Lab | undefined;
        let cg: LabCgroup | undefined;

        before(async () => {
          cg = LabCgroup.create('flows');
          lab = await Lab.create(labSpecFor(s, 'flowsebpf'));
          placePodAgents(lab, s, cg);
          await serveScenario(lab, s, flows);
          await applyOnce({ name: 'ebpf+nft', cgroupPath: cg.path, bpffs: join(cg.bpffs, 'kpng') }, lab, stateFor(s).items, configFor(s));
        });

        after(async () => {
          try {
            await lab?.close();
          } finally {
            cg?.close();
          }
        });

        describe('flows', { concurrency: true }, () => {
          s.flows.forEach((f, i) => {
            if (!onHost(f)) return;
            it(flowTitle(f, i), async () => {
              const r = await checkFlow(lab!, s, f, 1500, { socketLB: true });
              assert.ok(r.problems.length === 0, r.problems.join('\n'));
            });
          });
        });

        it('eBPF translated the pod flows (its counter moved)', async () => {
          const expect = flows.some((f) => !['', 'DROP', 'REJECT', 'ACCEPT'].includes(f.output) && socketTranslated(lab!, s, f));
          const fd = objGet(join(cg!.bpffs, 'kpng', 'kpng_counters'));
          assert.ok(fd, 'the counters map is pinned');
          try {
            const c = readCounters(fd.fd);
            if (expect) assert.ok(c.translated > 0, `no flow was translated by eBPF: ${JSON.stringify(c)}`);
          } finally {
            fd.close();
          }
        });
      });
    }

    // the flows this kernel cannot carry (SCTP: eBPF leaves it to to-nft),
    // in the kernel lab's VM; in CI a missing kernel lab fails, and so does
    // a guest that cannot run to-ebpf
    const jobs = vmJobs.filter((j) => j.backend === EBPF_IN_VM);
    if (jobs.length)
      describe('SCTP flows in the kernel lab (this kernel has no SCTP)', { skip: kernelLabSkip() }, () => {
        let run: KernelLabFlows | undefined;
        before(
          async () => {
            run = await kernelLabRun();
          },
          { timeout: 16 * 60_000 },
        );
        vmFlowCases(jobs, () => run, skipOrFailInCI);
      });
  });
}

// Every host backend's SCTP flows, in the same VM; each flow still its own test case.
if (vmJobs.some((j) => j.backend !== EBPF_IN_VM)) {
  // in CI the kernel lab must be there (scripts/setup.mjs prepares it): a missing one fails
  describe('SCTP packet flows in the kernel lab (this kernel has no SCTP)', { skip: kernelLabSkip() }, () => {
    let run: KernelLabFlows | undefined;

    before(
      async () => {
        run = await kernelLabRun();
      },
      { timeout: 16 * 60_000 },
    );

    for (const b of BACKENDS) {
      const jobs = vmJobs.filter((j) => j.backend === b);
      if (!jobs.length) continue;
      describe(backendLabel(b), () => vmFlowCases(jobs, () => run));
    }
  });
}
