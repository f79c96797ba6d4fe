// Packet flows in the kernel lab (docs/kernel-lab.md): flows this kernel
// cannot carry (SCTP) go through the same lab, kpng and checkFlow as on the
// host, inside Debian's kernel under QEMU, all in one VM: the host half
// (runFlowsInKernelLab) boots it with this file as the command; the guest
// half (when run as a script) runs the jobs one lab at a time.
import { fileURLToPath } from 'node:url';
import { Lab } from '../../src/lab/index.js';
import { applyOnce, backendLabUnsupported, backendTag, proxyMode, type LabBackend } from './lab-kpng.js';
import { checkFlow, compareTrace, traceInLab, configFor, labSpecFor, loadScenario, serveScenario, stateFor } from './lab-flows.js';
import { guestMain, isMain, runScriptInVm } from './kernel-lab.js';

export interface FlowJob {
  backend: LabBackend;
  /** a scenario file of test/data/flows */
  file: string;
  /** indexes of its flows to send */
  flows: number[];
}

export interface FlowJobResult {
  problems: string[];
  /** why the backend cannot run in the guest */
  skip?: string;
}

export interface KernelLabFlows {
  /** by resultKey */
  results: Map<string, FlowJobResult>;
  bootMs: number;
  ms: number;
  /** the guest's log: per lab, its build, kpng and flow times */
  log: string;
}

// TCG runs the guest 10-30 times slower than the host: an answer may take
// more than the host's 1.5 s (only a DROP flow waits this long)
const GUEST_FLOW_TIMEOUT_MS = 5000;

export const resultKey = (b: LabBackend, file: string, index: number): string => `${backendTag(b)} ${file} #${index}`;

/** Sends the jobs' flows in one kernel-lab VM. Rejects when the VM or the guest script fails. */
export async function runFlowsInKernelLab(jobs: FlowJob[], timeoutMs = 15 * 60_000): Promise<KernelLabFlows> {
  const r = await runScriptInVm<[string, FlowJobResult][]>(fileURLToPath(import.meta.url), jobs, { timeoutMs });
  return { results: new Map(r.result), bootMs: r.bootMs, ms: r.ms, log: r.log };
}

async function guest(jobs: FlowJob[]): Promise<[string, FlowJobResult][]> {
  const out = new Map<string, FlowJobResult>();
  for (const job of jobs) {
    const b = job.backend;
    const why = await backendLabUnsupported(b);
    if (why) {
      for (const i of job.flows) out.set(resultKey(b, job.file, i), { problems: [], skip: why });
      continue;
    }
    const t0 = Date.now();
    const s = loadScenario(job.file);
    let lab: Lab | undefined;
    try {
      lab = await Lab.create(labSpecFor(s, `vmflows${backendTag(b)}`));
      if (!lab.closedPortsMarked) throw new Error('the lab cannot tell a closed port from REJECT here (nft socket expression missing?)');
      await serveScenario(
        lab,
        s,
        job.flows.map((i) => s.flows[i]),
      );
      const kpngMs = await applyOnce(b, lab, stateFor(s).items, configFor(s, proxyMode(b)));
      const t1 = Date.now();
      // kpng trace reads the rules back first (to-nft, to-iptables); it must predict what the packets did
      const traceable = b.name !== 'ipvs';
      const traces = traceable ? await Promise.all(job.flows.map((i) => traceInLab(lab!, s.flows[i]))) : [];
      const checked = await Promise.all(job.flows.map((i) => checkFlow(lab!, s, s.flows[i], GUEST_FLOW_TIMEOUT_MS)));
      checked.forEach((c, k) => {
        const traced = traceable && !c.problems.length ? compareTrace(s.flows[job.flows[k]!]!, traces[k]!, c.outcomes).map((p) => `kpng trace does not predict the real outcome: ${p}`) : [];
        out.set(resultKey(b, job.file, job.flows[k]), { problems: [...c.problems, ...traced] });
      });
      console.log(`${job.file} (${backendTag(b)}): lab ${t1 - t0 - kpngMs} ms, kpng --once ${kpngMs} ms, ${job.flows.length} flow(s) ${Date.now() - t1} ms`);
    } catch (e) {
      for (const i of job.flows) if (!out.has(resultKey(b, job.file, i))) out.set(resultKey(b, job.file, i), { problems: [`the lab failed: ${(e as Error).stack ?? e}`] });
    } finally {
      await lab?.close();
    }
  }
  return [...out];
}

if (isMain(import.meta.url)) await guestMain(guest);
