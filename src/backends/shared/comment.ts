// Comments on dataplane objects name the Service they are for. A name comes
// from outside (a file, another brain) and may be long or odd: a comment the
// tool refuses would fail the whole transaction, so comments are made safe
// where they are built. nft refuses comments over 128 bytes; the kernel keeps
// iptables comments up to 255.
import { createHash } from 'node:crypto';

export const NFT_COMMENT_MAX = 128;
export const IPTABLES_COMMENT_MAX = 255;

// printable ASCII but quotes and backslash: nothing that needs escaping
const SAFE = /^[\x20\x21\x23-\x26\x28-\x5b\x5d-\x7e]*$/;
const UNSAFE = /[^\x20\x21\x23-\x26\x28-\x5b\x5d-\x7e]/g;

/**
 * `text` as a comment no tool refuses: characters that would need quoting
 * become '_', and a long one is cut, ending in '~' and a hash of the whole
 * text so that two long names stay two comments.
 */
export function safeComment(text: string, max: number): string {
  if (text.length <= max && SAFE.test(text)) return text;
  const clean = text.replace(UNSAFE, '_');
  if (clean.length <= max) return clean;
  const hash = createHash('sha256').update(text).digest('hex').slice(0, 8);
  return `${clean.slice(0, max - hash.length - 1)}~${hash}`;
}
