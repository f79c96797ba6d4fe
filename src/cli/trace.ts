// kpng trace: where a packet goes on this node and why, from the rules the
// kernel holds (src/trace).
import { InvalidArgumentError, Option, type Command } from 'commander';
import { registerCommand } from './commands.js';

const HELP = `
Reads kpng's rules back from the kernel (to-nft: nft -j list table ip|ip6 kpng; to-iptables:
iptables-save, iptables-nft or iptables-legacy) and follows the first packet of a new
connection through them: each chain, map and rule it meets, the verdict (accept, DNAT to one
of N endpoints with their probabilities, masquerade or not, REJECT, DROP) and the Kubernetes
reason for it. A source address of this node means a packet made on the node (output);
any other, a packet arriving from outside (prerouting); --iif makes it arriving anyway.
Run it on the node (in the node's network namespace), as root.

Examples:
  kpng trace --src 10.244.1.5 --dst 10.96.0.10 --dport 53 --proto udp
  kpng trace --src 198.51.100.7 --dst 192.168.0.2 --dport 30080 -o json
`;

/** A port written in decimal (Number() would take 0x50 for 80 and 1e1 for 10): the first refusal is the flag's. */
function port(v: string): number {
  const n = /^[0-9]{1,5}$/.test(v) ? Number(v) : NaN;
  if (!(n >= 1 && n <= 65535)) throw new InvalidArgumentError('not a port (a decimal number, 1-65535)');
  return n;
}

registerCommand((program, run) => {
  program
    .command('trace')
    .description("follow a packet through kpng's rules in the kernel: the path, the verdict and why")
    .requiredOption('--src <ip>', 'source address')
    .requiredOption('--dst <ip>', 'destination address')
    .requiredOption('--dport <port>', 'destination port', port)
    .addOption(new Option('--proto <protocol>', 'protocol').choices(['tcp', 'udp', 'sctp']).default('tcp'))
    .option('--sport <port>', 'source port', port, 40000)
    .option('--iif <interface>', 'the interface the packet arrives on (makes it an arriving packet)')
    .addOption(new Option('--backend <name>', "whose rules (default: the one whose rules are on the node, nft first)").choices(['nft', 'iptables']))
    .addOption(new Option('--iptables-mode <mode>', 'iptables-nft or iptables-legacy (default: the one holding KUBE-SERVICES)').choices(['nft', 'legacy']))
    .addOption(new Option('-o, --output <format>', 'output format').choices(['text', 'json']).default('text'))
    .addHelpText('after', HELP)
    // a wrong flag is told in one line (the help above would bury it)
    .showHelpAfterError(false)
    .action(function (this: Command) {
      const o = this.opts();
      return run(async () => {
        // the rule readers load when the command runs
        const { formatTrace, trace, traceJSON, TraceError } = await import('../trace/index.js');
        try {
          const t = await trace({ src: o.src, dst: o.dst, dport: o.dport, proto: o.proto, sport: o.sport, iif: o.iif, backend: o.backend, iptablesMode: o.iptablesMode });
          console.log(o.output === 'json' ? traceJSON(t) : formatTrace(t));
        } catch (e) {
          if (e instanceof TraceError) {
            // a usage problem or no rules: one line, no stack
            e.stack = `kpng trace: ${e.message}`;
          }
          throw e;
        }
      });
    });
});
