// Errors that any layer raises and the command line reports in one line.

/** A value the operator gave (a flag, a config field, a file) is wrong: names it and says why. */
export class ConfigError extends Error {
  constructor(
    readonly field: string,
    readonly reason: string,
  ) {
    super(`${field}: ${reason}`);
  }
}
