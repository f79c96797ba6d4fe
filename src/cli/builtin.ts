// kpng version and kpng demo.
import { registerCommand } from './commands.js';
import { version } from './main.js';
import { runDemo } from './demo.js';

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
