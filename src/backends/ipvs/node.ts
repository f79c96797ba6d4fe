// What to-ipvs changes on the node besides IPVS and its table: the ip_vs
// module, kube-proxy's IPVS sysctls, and the dummy interface kube-ipvs0 that
// holds every service address (so the node accepts their packets and IPVS
// sees them at LOCAL_IN). Behind an interface: tests give an in-memory one.
import { isIPv4 } from 'node:net';
import { runTool, type ToolError } from '../shared/tool.js';
import { DUMMY } from './ruleset.js';

export interface IpvsNode {
  /** loads ip_vs, sets the sysctls, creates kube-ipvs0 (up); warns what it cannot */
  prepare(o: { ipv6: boolean; strictARP: boolean; warn: (msg: string, err: string) => void }): Promise<void>;
  /** the service addresses on kube-ipvs0 */
  addresses(): Promise<Set<string>>;
  /** binds and unbinds addresses; resolves with what failed (one line each), the rest done */
  change(add: readonly string[], del: readonly string[]): Promise<string[]>;
  /** removes kube-ipvs0 (cleanup); false if it was not there */
  remove(): Promise<boolean>;
}

/** kube-proxy's IPVS settings: conntrack for IPVS's connections (masquerading needs it), no-destination connections expire */
const SYSCTLS: [string, string][] = [
  ['net.ipv4.vs.conntrack', '1'],
  ['net.ipv4.vs.expire_nodest_conn', '1'],
  ['net.ipv4.vs.expire_quiescent_template', '1'],
  ['net.ipv4.vs.conn_reuse_mode', '0'],
  ['net.ipv4.ip_forward', '1'],
];

/** The node through ip, sysctl and modprobe. */
export class ToolNode implements IpvsNode {
  constructor(private readonly tools: { ip?: string; sysctl?: string; modprobe?: string } = {}) {}

  async prepare(o: { ipv6: boolean; strictARP: boolean; warn: (msg: string, err: string) => void }): Promise<void> {
    // IPVS loads its schedulers itself
    await runTool(this.tools.modprobe ?? 'modprobe', ['ip_vs']).catch((e: ToolError) => o.warn('ipvs: modprobe ip_vs failed; trying anyway', e.message));
    const sysctls = [...SYSCTLS];
    if (o.ipv6) sysctls.push(['net.ipv6.conf.all.forwarding', '1']);
    if (o.strictARP) sysctls.push(['net.ipv4.conf.all.arp_ignore', '1'], ['net.ipv4.conf.all.arp_announce', '2']);
    for (const [k, v] of sysctls) await runTool(this.tools.sysctl ?? 'sysctl', ['-qw', `${k}=${v}`]).catch((e: ToolError) => o.warn(`ipvs: cannot set ${k}`, e.message));
    await this.ip(['link', 'add', DUMMY, 'type', 'dummy']).catch((e: ToolError) => {
      if (!e.isExists) throw e;
    });
    // up, so IPv6 addresses work; a dummy interface answers nothing on the wire
    await this.ip(['link', 'set', DUMMY, 'up']);
  }

  async addresses(): Promise<Set<string>> {
    return boundAddresses(await this.ip(['-j', 'addr', 'show', 'dev', DUMMY]).catch(() => '[]'));
  }

  async change(add: readonly string[], del: readonly string[]): Promise<string[]> {
    if (!add.length && !del.length) return [];
    const line = (verb: string, a: string) => `address ${verb} ${a}/${isIPv4(a) ? 32 : 128} dev ${DUMMY}${verb === 'add' && !isIPv4(a) ? ' nodad' : ''}`;
    const lines = [...del.map((a) => line('del', a)), ...add.map((a) => line('add', a))];
    // -force: one address that cannot be changed does not stop the others
    return this.ip(['-force', '-batch', '-'], lines.join('\n') + '\n').then(
      () => [],
      (e: ToolError) => {
        const failed = [...(e.stderr ?? '').matchAll(/Command failed -:(\d+)/g)].map((m) => lines[Number(m[1]) - 1]).filter(Boolean);
        return failed.length ? failed : [e.message];
      },
    );
  }

  async remove(): Promise<boolean> {
    return this.ip(['link', 'del', DUMMY]).then(
      () => true,
      (e: ToolError) => {
        if (/Cannot find device|does not exist/.test(e.stderr ?? '')) return false;
        throw e;
      },
    );
  }

  private ip(args: string[], input?: string): Promise<string> {
    return runTool(this.tools.ip ?? 'ip', args, input === undefined ? {} : { input });
  }
}

/** The service addresses on kube-ipvs0, from `ip -j addr show dev kube-ipvs0` (its own IPv6 link-local address is none). */
export function boundAddresses(ipJson: string): Set<string> {
  const j = JSON.parse(ipJson || '[]') as { addr_info?: { local: string; scope?: string }[] }[];
  return new Set(j.flatMap((l) => (l.addr_info ?? []).filter((a) => a.scope !== 'link').map((a) => a.local)));
}
