// Packet flows in the kernel lab (docs/kernel-lab.md): flows this kernel
// cannot carry (SCTP) go through the same lab, kpng and checkFlow as on the
// host, inside Debian's kernel under QEMU, all in one VM: the host half
// (runFlowsInKernelLab) boots it with this file as the command; the guest
// half (when run as a script) runs the jobs one lab at a time. An ebpf+nft
// job gets a LabCgroup of the guest's own (its cgroupPath and bpffs are
// placeholders), the pod agents in it, and the flows checked as pod flows
// translated at the socket (SCTP is not: to-nft serves it).
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Lab, LabCgroup, labCgroupUnsupported } from '../../src/lab/index.js';
import { libbpfUnavailable } from '../../src/backends/ebpf/libbpf.js';
import { applyOnce, backendLabUnsupported, backendTag, proxyMode, type LabBackend } from './lab-kpng.js';
import { checkFlow, compareTrace, traceInLab, configFor, labSpecFor, loadScenario, placePodAgents, serveScenario, socketTranslated, stateFor } from './lab-flows.js';
import { GuestRunFailed, emitPartial, guestMain, isMain, runScriptInVm } from './kernel-lab.js';

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
// kpng --once takes 10-20 s there (to-nft), 20-40 s with to-ebpf beside it
// (a cold start, the BPF object loaded); more under load
const GUEST_KPNG_TIMEOUT_MS = 180_000;

export const resultKey = (b: LabBackend, file: string, index: number): string => `${backendTag(b)} ${file} #${index}`;

/**
 * Sends the jobs' flows in one kernel-lab VM. When the VM or the guest
 * script fails (not a flow: a flow's wrong outcome is its problem, never
 * retried), what it finished counts, the failure is logged with the guest's
 * last words, and the rest runs once more in a new VM if there is time; a
 * flow still without a result gets the failure as its problem. Never rejects.
 */
export async function runFlowsInKernelLab(jobs: FlowJob[], timeoutMs = 15 * 60_000): Promise<KernelLabFlows> {
  const deadline = Date.now() + timeoutMs;
  const results = new Map<string, FlowJobResult>();
  const logs: string[] = [];
  let bootMs = -1;
  let failure = '';
  const t0 = Date.now();
  let todo = jobs;
  for (let attempt = 1; todo.length && attempt <= 2; attempt++) {
    const left = deadline - Date.now();
    // a normal run takes 2 minutes: a second one needs room
    if (attempt > 1 && left < 5 * 60_000) break;
    try {
      const r = await runScriptInVm<[string, FlowJobResult][]>(fileURLToPath(import.meta.url), todo, { timeoutMs: left });
      for (const [k, v] of r.result) results.set(k, v);
      if (bootMs < 0) bootMs = r.bootMs;
      logs.push(r.log);
    } catch (e) {
      const partials = e instanceof GuestRunFailed ? (e.partials as [string, FlowJobResult][][]) : [];
      for (const part of partials) for (const [k, v] of part) results.set(k, v);
      failure = (e as Error).message;
      logs.push(`kernel lab run ${attempt} FAILED (the VM or the guest script, not a flow; its finished labs count): ${failure}`);
    }
    todo = jobs.map((j) => ({ ...j, flows: j.flows.filter((i) => !results.has(resultKey(j.backend, j.file, i))) })).filter((j) => j.flows.length);
  }
  for (const j of todo) for (const i of j.flows) results.set(resultKey(j.backend, j.file, i), { problems: [`the kernel lab failed before this flow's result: ${failure}`] });
  return { results, bootMs, ms: Date.now() - t0, log: logs.join('\n') };
}

/** MemAvailable and the OOM killer's count, for the guest's log */
function memoryNote(): string {
  try {
    const avail = /MemAvailable:\s+(\d+)/.exec(readFileSync('/proc/meminfo', 'utf8'))?.[1];
    const oom = /oom_kill (\d+)/.exec(readFileSync('/proc/vmstat', 'utf8'))?.[1];
    return `, memory available ${Math.round(Number(avail) / 1024)} MiB, oom kills ${oom ?? '?'}`;
  } catch {
    return '';
  }
}

async function guest(jobs: FlowJob[]): Promise<[string, FlowJobResult][]> {
  const out = new Map<string, FlowJobResult>();
  for (const job of jobs) {
    const before = out.size;
    const b = job.backend;
    const why = (b.name === 'ebpf+nft' ? (labCgroupUnsupported() ?? libbpfUnavailable()) : undefined) ?? (await backendLabUnsupported(b));
    if (why) {
      for (const i of job.flows) out.set(resultKey(b, job.file, i), { problems: [], skip: why });
      emitPartial([...out].slice(before));
      continue;
    }
    const t0 = Date.now();
    const s = loadScenario(job.file);
    let lab: Lab | undefined;
    let cg: LabCgroup | undefined;
    try {
      if (b.name === 'ebpf+nft') cg = LabCgroup.create('vmflows');
      lab = await Lab.create(labSpecFor(s, `vmflows${backendTag(b)}`));
      if (!lab.closedPortsMarked) throw new Error('the lab cannot tell a closed port from REJECT here (nft socket expression missing?)');
      if (cg) placePodAgents(lab, s, cg);
      await serveScenario(
        lab,
        s,
        job.flows.map((i) => s.flows[i]),
      );
      const kb: LabBackend = cg ? { name: 'ebpf+nft', cgroupPath: cg.path, bpffs: join(cg.bpffs, 'kpng') } : b;
      const kpngMs = await applyOnce(kb, lab, stateFor(s).items, configFor(s, proxyMode(b)), GUEST_KPNG_TIMEOUT_MS);
      const t1 = Date.now();
      // kpng trace reads the rules back first (to-nft, to-iptables); it must predict what the packets did
      // (not for flows eBPF translates at the socket: nftables never sees them)
      const traceable = (i: number) => b.name !== 'ipvs' && !(cg && socketTranslated(lab!, s, s.flows[i]));
      const traces = await Promise.all(job.flows.map((i) => (traceable(i) ? traceInLab(lab!, s.flows[i]) : undefined)));
      const checked = await Promise.all(job.flows.map((i) => checkFlow(lab!, s, s.flows[i], GUEST_FLOW_TIMEOUT_MS, { socketLB: !!cg })));
      checked.forEach((c, k) => {
        const t = traces[k];
        const traced = t && !c.problems.length ? compareTrace(s.flows[job.flows[k]!]!, t, c.outcomes).map((p) => `kpng trace does not predict the real outcome: ${p}`) : [];
        out.set(resultKey(b, job.file, job.flows[k]), { problems: [...c.problems, ...traced] });
      });
      console.log(`${job.file} (${backendTag(b)}): lab ${t1 - t0 - kpngMs} ms, kpng --once ${kpngMs} ms, ${job.flows.length} flow(s) ${Date.now() - t1} ms${memoryNote()}`);
    } catch (e) {
      for (const i of job.flows) if (!out.has(resultKey(b, job.file, i))) out.set(resultKey(b, job.file, i), { problems: [`the lab failed: ${(e as Error).stack ?? e}${memoryNote()}`] });
    } finally {
      try {
        await lab?.close();
      } finally {
        cg?.close();
      }
    }
    emitPartial([...out].slice(before));
  }
  return [...out];
}

if (isMain(import.meta.url)) await guestMain(guest);
