// Top-level commands other than sources (version, demo, cleanup...).
import type { Command } from 'commander';
import type { Logger } from '../runtime/log.js';

export type Runner = (fn: (log: Logger, signal: AbortSignal) => Promise<void>) => Promise<void>;
export type CommandDefinition = (program: Command, run: Runner) => void;

const commands: CommandDefinition[] = [];

export function registerCommand(def: CommandDefinition): void {
  commands.push(def);
}

export function registeredCommands(): readonly CommandDefinition[] {
  return commands;
}
