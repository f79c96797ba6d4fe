// The kernel lab: commands under Debian's stock kernel in QEMU, for what the
// machines' own kernel lacks (IPVS, SCTP, dummy links). See docs/kernel-lab.md.
export { runInVm, shellQuote, removeStaleRuns, listRuns, type VmRunOptions, type VmRunResult } from './run.js';
export { prepareKernelLab, readManifest, kernelLabDir, kernelLabUnavailable, kernelLabHostUnsupported, KERNEL_LAB_PACKAGES, DEFAULT_VMLAB_DIR, type KernelLabManifest } from './prepare.js';
