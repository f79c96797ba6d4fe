// Where a test cannot run (no root, a missing tool), it is skipped on a
// developer's machine and fails in CI (CI=true): a green CI run means every
// test ran.
export function skipOrFailInCI(why: string | undefined): string | undefined {
  if (why && process.env.CI === 'true') throw new Error(`this test cannot run here, and CI must run it: ${why}`);
  return why;
}
