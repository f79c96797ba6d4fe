// deploy/kustomize rendered as an operator renders it: the top
// kustomization (the operator's settings: image, API server address,
// config.yaml) over each overlay in turn, by `kubectl kustomize` (Debian's
// kubernetes-client, kustomize v2.0.3; newer ones render it alike).
import { spawnSync } from 'node:child_process';
import { copyFileSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { parse, parseAllDocuments } from 'yaml';
import { ROOT } from './cli.js';
import { skipOrFailInCI } from './ci.js';

export const KUSTOMIZE = join(ROOT, 'deploy/kustomize');
export const OVERLAYS = readdirSync(join(KUSTOMIZE, 'overlays')).sort();

/** why `kubectl kustomize` cannot run here (skipped on a developer's machine, a failure in CI) */
export function kustomizeMissing(): string | undefined {
  const r = spawnSync('kubectl', ['kustomize', '--help'], { encoding: 'utf8' });
  return skipOrFailInCI(r.status === 0 ? undefined : 'needs kubectl with kustomize (Debian: kubernetes-client)');
}

/** the top kustomization's text and what it holds */
export function topKustomization(): { text: string; doc: Record<string, any> } {
  const text = readFileSync(join(KUSTOMIZE, 'kustomization.yaml'), 'utf8');
  return { text, doc: parse(text) };
}

/** the overlay line of the top kustomization's bases ("- overlays/nft", or "- cleanup" on the way back) */
const OVERLAY_LINE = /^- (overlays\/[\w-]+|cleanup)$/m;

/** Renders a kustomization directory; throws with kubectl's message. */
export function kustomize(dir: string): Record<string, any>[] {
  const r = spawnSync('kubectl', ['kustomize', dir], { encoding: 'utf8', maxBuffer: 16 << 20 });
  if (r.status !== 0) throw new Error(`kubectl kustomize ${dir}: ${r.stderr}`);
  return parseAllDocuments(r.stdout).map((d) => d.toJS() as Record<string, any>);
}

/** The top kustomization with its overlay replaced by `overlay` (or `under`, a kustomization of deploy/kustomize: cleanup), rendered. */
export function renderOverlay(overlay: string, under = join('overlays', overlay)): Record<string, any>[] {
  const { text } = topKustomization();
  if (!OVERLAY_LINE.test(text)) throw new Error('deploy/kustomize/kustomization.yaml names no overlay');
  const dir = mkdtempSync(join(tmpdir(), `kpng-kustomize-${overlay}-`));
  try {
    writeFileSync(join(dir, 'kustomization.yaml'), text.replace(OVERLAY_LINE, `- ${relative(dir, join(KUSTOMIZE, under))}`));
    copyFileSync(join(KUSTOMIZE, 'config.yaml'), join(dir, 'config.yaml'));
    return kustomize(dir);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
