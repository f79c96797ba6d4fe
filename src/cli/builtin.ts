// kpng version and kpng demo.
import { registerCommand } from './commands.js';
import { version } from '../version.js';
import { runDemo } from './demo.js';
import { registeredBackends } from '../backends/registry.js';

registerCommand((program) => {
  program
    .command('version')
    .description('print the kpng version')
    .action(() => console.log(`kpng ${version()} (node ${process.version})`));
});

registerCommand((program, run) => {
  program
    .command('demo')
    .description('run kpng on an embedded example cluster and show what it does')
    .option('--example <file>', 'the example cluster (Kubernetes objects)')
    .action(function (this: import('commander').Command) {
      const opts = this.opts();
      return run((log, signal) => runDemo(opts, log, signal));
    });
});

registerCommand((program, run) => {
  program
    .command('cleanup')
    .description('remove everything kpng installed on this node (its nftables tables, iptables chains) and nothing else')
    .option('--backend <name...>', 'only these backends (default: all)')
    .action(function (this: import('commander').Command) {
      const opts = this.opts();
      return run(async (log) => {
        for (const b of registeredBackends()) {
          if (!b.cleanup || (opts.backend && !opts.backend.includes(b.name))) continue;
          const removed = await b.cleanup(log);
          for (const r of removed) console.log(`removed ${r}`);
        }
      });
    });
});
