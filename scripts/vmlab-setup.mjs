#!/usr/bin/env node
// Prepares the kernel lab (docs/kernel-lab.md) once: Debian's kernel package,
// its vmlinux and an initrd in the cache directory (KPNG_VMLAB_DIR, default
// /var/cache/kpng-vmlab). Quick when already prepared. Needs root and the
// Debian packages scripts/setup.mjs installs. Exit 1 when it could not.
import { register } from 'tsx/esm/api';

register();
const { prepareKernelLab } = await import('../src/lab/vm/prepare.ts');
try {
  prepareKernelLab({ log: (l) => console.error(l) });
} catch (e) {
  console.error(e instanceof Error ? e.message : String(e));
  process.exit(1);
}
