#!/usr/bin/env node
// Compiles to-ebpf's BPF programs (src/backends/ebpf/kpng.bpf.c) with clang
// into kpng.bpf.o beside the source, and beside the built backend when there
// is a build (dist/). Run by setup, build and prepare; without clang it says
// so and exits 0 unless --strict (to-ebpf then compiles on first use).
import { spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));
const src = join(root, 'src/backends/ebpf/kpng.bpf.c');
const out = join(root, 'src/backends/ebpf/kpng.bpf.o');
const strict = process.argv.includes('--strict');
const arch = process.arch === 'arm64' ? 'aarch64-linux-gnu' : 'x86_64-linux-gnu';

if (!existsSync(out) || statSync(out).mtimeMs < statSync(src).mtimeMs) {
  // -g: the maps' BTF (libbpf needs it; layout.ts is checked against it)
  const r = spawnSync('clang', ['-O2', '-g', '-target', 'bpf', `-I/usr/include/${arch}`, '-Wall', '-c', src, '-o', out], { stdio: 'inherit' });
  if (r.status !== 0) {
    console.error(`build-bpf: clang could not compile ${src}${r.error ? ` (${r.error.message})` : ''}: install clang, llvm, libbpf-dev (node scripts/setup.mjs)`);
    process.exit(strict ? 1 : 0);
  }
}
const dist = join(root, 'dist/backends/ebpf');
if (existsSync(dist)) copyFileSync(out, join(dist, 'kpng.bpf.o'));
