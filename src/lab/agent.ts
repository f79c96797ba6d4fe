// The lab agent: one long-lived process per network namespace, commanded
// over stdin/stdout JSON lines. It runs TCP/UDP/SCTP servers that answer every
// message with "<local ip:port> <remote ip:port> <agent name> <request tag>"
// (so the client sees which endpoint answered and the endpoint's view of the
// client, which shows masquerading), and clients that connect from a given source address
// and report what happened. Connections can be kept open and used again.
//
// Its process is agent-main.ts, run as a file by a plain node (agentCommand).
// SCTP goes through a Python helper (sctp-helper.ts), started on the first
// SCTP request.
import { createHash } from 'node:crypto';
import { existsSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { SCTP_HELPER_PY } from './sctp-helper.js';

export type LabProtocol = 'TCP' | 'UDP' | 'SCTP';

/** What one connection attempt (or one exchange on a kept connection) gave. */
export type Outcome =
  | {
      kind: 'answered';
      /** the agent (namespace) that answered */
      by: string;
      /** the address the server saw itself at: the endpoint when DNATed */
      local: string;
      /** the address the server saw the client at: not the client's when masqueraded */
      remote: string;
      /** the client's own address (ip:port) */
      client: string;
      ms: number;
    }
  | {
      /**
       * refused: ICMP port unreachable (kpng's REJECT); timeout: no answer
       * (DROP); unreachable: no host, or a port nobody listens on in the lab;
       * closed: a kept connection ended
       */
      kind: 'refused' | 'timeout' | 'unreachable' | 'reset' | 'closed' | 'error';
      code?: string;
      /** TCP, SCTP: the handshake completed before the failure */
      connected?: boolean;
      client?: string;
      ms: number;
    };

export interface ConnectArgs {
  protocol: LabProtocol;
  /** source address to bind (port 0) */
  src: string;
  dst: string;
  port: number;
  timeoutMs: number;
}

export type AgentRequest =
  | { id: number; op: 'ping' }
  | { id: number; op: 'sysctl'; values: Record<string, string> }
  | { id: number; op: 'listen'; protocol: LabProtocol; host: string; port: number }
  | { id: number; op: 'unlisten'; protocol?: LabProtocol; port?: number; dropConnections?: boolean }
  | ({ id: number; op: 'connect' } & ConnectArgs)
  | ({ id: number; op: 'burst'; count: number } & ConnectArgs)
  | ({ id: number; op: 'open'; cid: string } & ConnectArgs)
  | { id: number; op: 'send'; cid: string; timeoutMs: number }
  | { id: number; op: 'close'; cid: string };

export interface AgentResponse {
  id: number;
  ok: boolean;
  error?: string;
  result?: unknown;
}

/**
 * The agent's process, as `ip netns exec <ns> <node> <entry> <name>` with
 * this environment: a plain node (no TypeScript loader: it starts in a
 * fraction of the time, and a lab starts an agent per namespace) running
 * agent-main's compiled module, or from the sources its transpiled copy.
 */
export function agentCommand(name: string): { args: string[]; env: NodeJS.ProcessEnv } {
  return { args: [process.execPath, agentEntry(), name], env: { ...process.env, KPNG_SCTP_HELPER: SCTP_HELPER_PY } };
}

/** agent-main as node runs it: compiled beside this module, or (from the sources) transpiled once into the temp directory */
function agentEntry(): string {
  const here = fileURLToPath(import.meta.url);
  if (here.endsWith('.js')) return join(dirname(here), 'agent-main.js');
  const source = readFileSync(join(dirname(here), 'agent-main.ts'), 'utf8');
  const file = join(tmpdir(), `kpng-lab-agent-${createHash('sha1').update(source).digest('hex').slice(0, 16)}.mjs`);
  if (existsSync(file)) return file;
  // the sources run through tsx, and TypeScript (a dev dependency) is there too
  const ts = createRequire(import.meta.url)('typescript') as typeof import('typescript');
  const js = ts.transpileModule(source, { compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 } }).outputText;
  // written aside, then renamed: agents started at once never read half a file
  const aside = `${file}.${process.pid}`;
  writeFileSync(aside, js);
  renameSync(aside, file);
  return file;
}
