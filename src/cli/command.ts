// kpng's commander Command (commander's documented way to customise every
// subcommand: a subclass whose createCommand makes more of it). A usage error
// is two lines, the error and where the help is, never the whole help that
// scrolls the error away; an unknown word is matched against the real names
// and kube-proxy's (`to-nftables` is to-nft), and a backend named where a sink
// goes says where it goes; every missing required flag is named at once.
import { Command, type ErrorOptions, type HelpContext } from 'commander';
import { registeredBackends } from '../backends/registry.js';

export class KpngCommand extends Command {
  override createCommand(name?: string): KpngCommand {
    return new KpngCommand(name);
  }

  /** "kpng file to-local" */
  commandPath(): string {
    const names: string[] = [];
    for (let c: Command | null = this; c; c = c.parent) names.unshift(c.name());
    return names.join(' ');
  }

  override error(message: string, errorOptions?: ErrorOptions): never {
    // a command that runs and has subcommands (to-nft, which may have to-ebpf
    // beside it) takes a word after it that is none of them as an argument
    if (errorOptions?.code === 'commander.excessArguments' && this.commands.length) this.unknownCommand();
    this.showHelpAfterError(`(see ${this.commandPath()} --help)`);
    // commander's "(Did you mean x?)" goes on the error's line
    return super.error(message.replace(/\n\(Did you mean (.*)\?\)$/, '; did you mean $1?'), errorOptions);
  }

  /** A command that needs a subcommand, run without one: what it needs, in one line (the root shows its help). */
  override help(context?: HelpContext | ((s: string) => string)): never {
    if (typeof context === 'object' && context.error && this.parent && this.commands.length) {
      const names = this.commands.map((c) => c.name());
      this.error(`error: ${this.commandPath()} needs one of: ${names.join(', ')}`, { code: 'commander.help' });
    }
    return super.help(context as HelpContext);
  }

  /** commander's: called for the first required option missing; this names every one of this command. */
  missingMandatoryOptionValue(): never {
    const missing = this.options.filter((o) => o.mandatory && this.getOptionValue(o.attributeName()) === undefined).map((o) => `'${o.flags}'`);
    this.error(`error: required option${missing.length > 1 ? 's' : ''} ${missing.join(', ')} not specified`, { code: 'commander.missingMandatoryOptionValue' });
  }

  /** commander's: a word that is no subcommand here. */
  unknownCommand(): never {
    const word = this.args[0] ?? '';
    const here = this.commands.map((c) => c.name());
    const backend = backendNamed(word);
    let hint = '';
    if (backend && !here.includes(backend)) {
      // a backend programs a node: it goes under to-local, or kpng local
      hint = here.includes('to-local')
        ? `; ${backend} is a backend, it goes under to-local: ${this.commandPath()} to-local ${backend}`
        : `; ${backend} is a backend: kpng kube to-local ${backend}, or kpng local --api ADDRESS ${backend}`;
    } else {
      const like = suggest(word, here);
      if (like) hint = `; did you mean ${like}?`;
    }
    this.error(`error: unknown command '${word}'${hint}`, { code: 'commander.unknownCommand' });
  }
}

/** The backend command a word names: its own name (to-nft), or kube-proxy's mode for it (to-nftables, nftables). */
function backendNamed(word: string): string | undefined {
  const bare = word.replace(/^to-/, '');
  for (const b of registeredBackends()) if (bare === b.name || bare === b.proxyMode) return `to-${b.name}`;
  return undefined;
}

/**
 * The command a mistyped word meant: the candidate, or one of its aliases
 * (a backend's kube-proxy mode, the name without "to-"), closest by edit
 * distance, when it is close enough (a third of the word). Commander's own
 * matcher is internal to it and knows no aliases.
 */
export function suggest(word: string, candidates: readonly string[]): string | undefined {
  const modes = new Map(registeredBackends().map((b) => [b.name, b.proxyMode]));
  let best: { name: string; d: number } | undefined;
  for (const name of candidates) {
    const bare = name.replace(/^to-/, '');
    const mode = modes.get(bare);
    const aliases = [name, bare, ...(mode ? [`to-${mode}`, mode] : [])];
    for (const a of aliases) {
      const d = editDistance(word, a);
      if (!best || d < best.d) best = { name, d };
    }
  }
  return best && best.d <= Math.max(1, Math.floor(word.length / 3)) ? best.name : undefined;
}

/** Optimal string alignment distance: insertions, deletions, substitutions and swaps of two neighbours. */
function editDistance(a: string, b: string): number {
  const d = Array.from({ length: a.length + 1 }, (_, i) => [i, ...new Array<number>(b.length).fill(0)]);
  for (let j = 1; j <= b.length; j++) d[0]![j] = j;
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      d[i]![j] = Math.min(d[i - 1]![j]! + 1, d[i]![j - 1]! + 1, d[i - 1]![j - 1]! + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) d[i]![j] = Math.min(d[i]![j]!, d[i - 2]![j - 2]! + 1);
    }
  }
  return d[a.length]![b.length]!;
}
