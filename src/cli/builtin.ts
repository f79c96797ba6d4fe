// kpng version, kpng demo and kpng cleanup.
import { registerCommand } from './commands.js';
import { version } from '../runtime/version.js';
import { registeredBackends, type CleanupReport } from '../backends/registry.js';
import { suggest } from './command.js';

export function versionLine(): string {
  return `kpng ${version()} (node ${process.version})`;
}

registerCommand((program) => {
  program
    .command('version')
    .description('print the kpng version')
    .action(() => console.log(versionLine()));
});

registerCommand((program, run) => {
  program
    .command('demo')
    .description('run kpng on an embedded example cluster and show what it does')
    .option('--example <file>', 'the example cluster (Kubernetes objects)')
    .option('--backend <name>', 'the backend kpng programs the node with: nft, userspace (kpng proxies the connections itself), or ebpf (to-ebpf beside to-nft: the client pod in a cgroup of the demo\'s own)', 'nft')
    .action(function (this: import('commander').Command) {
      const opts = this.opts();
      // the demo (its lab, netns and eBPF helpers) loads when it runs
      return run(async (log, signal) => {
        const { runDemo } = await import('./demo.js');
        await runDemo(opts, log, signal);
      });
    });
});

const CLEANUP_HELP = `
What it removes:
  to-nft       the tables "ip kpng" and "ip6 kpng", and "inet kpng-localhost-nodeports"
               (localhost NodePorts through the userspace proxy).
  to-userspace the table "inet kpng-userspace" (its redirects to kpng's listeners; the
               listeners themselves go with the kpng process).
  to-iptables  in iptables-nft and iptables-legacy, IPv4 and IPv6: kpng's chains (filter
               and nat KUBE-SERVICES, KUBE-NODEPORTS, KUBE-EXTERNAL-SERVICES, KUBE-FORWARD,
               KUBE-PROXY-FIREWALL, KUBE-POSTROUTING, KUBE-MARK-MASQ, KUBE-PROXY-CANARY,
               and the per-service KUBE-SVC-/SVL-/EXT-/FW-/SEP- chains), and every rule of
               any other chain, built-in or not, that jumps (-j) or goes (-g) to one of
               them: such a rule points into what kpng installed. The rest of that chain
               stays.
  to-ebpf      under /sys/fs/bpf/kpng (KPNG_EBPF_BPFFS overrides it): its pinned links
               (link_kpng_*: detached from their cgroup) and maps (kpng_*), then the
               directory if nothing else is in it.

What stays:
  filter KUBE-FIREWALL and its INPUT/OUTPUT jumps (IPv4, written for localhost NodePorts):
  the DROP of non-local traffic to 127.0.0.0/8 that kubelet writes too (kpng cannot tell
  its copy from kubelet's). It guards net.ipv4.conf.all.route_localnet=1, which stays too.
  kube-proxy --cleanup leaves both alike. kubelet's own chains stay as well.

Each table goes in one step (one iptables-restore per table, one nft command per nftables
table): a table that cannot be cleaned stays as it was, and every other table and family
is still cleaned; each such table is reported on a "could not clean" line, and the exit
status is then 1.
`;

registerCommand((program, run) => {
  program
    .command('cleanup')
    .description('remove what kpng installed on this node (its nftables tables, its iptables chains and the rules jumping to them) and nothing else; KUBE-FIREWALL stays (see kpng cleanup --help)')
    .option('--backend <name...>', 'only these backends (default: all)')
    .addHelpText('after', CLEANUP_HELP)
    .action(function (this: import('commander').Command) {
      const opts = this.opts();
      return run(async (log) => {
        const backends = registeredBackends().filter((b) => b.cleanup);
        const names = backends.map((b) => b.name);
        for (const n of (opts.backend ?? []) as string[]) {
          if (names.includes(n)) continue;
          const like = suggest(n, names);
          throw new Error(`unknown backend ${n}${like ? `; did you mean ${like}?` : ''} (backends: ${names.join(', ')})`);
        }
        let failed = 0;
        for (const b of backends) {
          if (opts.backend && !opts.backend.includes(b.name)) continue;
          let report: CleanupReport;
          try {
            report = await b.cleanup!(log);
          } catch (e) {
            // a bug in one backend's cleanup does not keep the others from theirs
            report = { removed: [], kept: [], failed: [`the ${b.name} backend: ${(e as Error).message}`] };
          }
          for (const r of report.removed) console.log(`removed ${r}`);
          for (const k of report.kept) console.log(`kept ${k}`);
          for (const f of report.failed) log.error(`cleanup: could not clean ${f}`);
          failed += report.failed.length;
        }
        if (failed) throw new Error(`cleanup incomplete: ${failed} part${failed > 1 ? 's' : ''} left in place (see above)`);
      });
    });
});
