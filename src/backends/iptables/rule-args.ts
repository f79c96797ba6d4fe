// Reading a rule as iptables-save prints it ("-A CHAIN ... -j TARGET"): its
// arguments split the way iptables-restore splits them, so that text inside
// a quoted argument (a comment saying "-j KUBE-SERVICES") is never taken for
// an option.

/**
 * The arguments of one iptables-save/-restore line, as iptables-restore reads
 * them (add_param_to_argv): blanks separate arguments; a double quote opens a
 * quoted argument, in which a backslash escapes the next character (iptables-
 * save writes \" \\ \') and the closing quote ends the argument.
 */
export function ruleArgs(line: string): string[] {
  const args: string[] = [];
  let cur = '';
  let quoted = false;
  for (let i = 0; i < line.length; i++) {
    const c = line[i]!;
    if (quoted) {
      if (c === '\\' && i + 1 < line.length) cur += line[++i];
      else if (c !== '"') cur += c;
      else {
        quoted = false;
        args.push(cur);
        cur = '';
      }
    } else if (c === '"') {
      quoted = true;
    } else if (c === ' ' || c === '\t' || c === '\n' || c === '\r') {
      if (cur) args.push(cur);
      cur = '';
    } else {
      cur += c;
    }
  }
  if (cur || quoted) args.push(cur);
  return args;
}

const JUMP = new Set(['-j', '--jump', '-g', '--goto']);

/**
 * The chain a saved rule jumps (-j) or goes (-g) to, or undefined. iptables-
 * save prints the target last, and a jump to a chain has no target options:
 * such a rule ends with "-j CHAIN" (or "-g CHAIN"), whatever its matches hold.
 */
export function jumpTarget(line: string): string | undefined {
  const args = ruleArgs(line);
  const n = args.length;
  // "-A CHAIN" and then at least "-j TARGET"
  if (n < 4 || !JUMP.has(args[n - 2]!)) return undefined;
  return args[n - 1];
}
