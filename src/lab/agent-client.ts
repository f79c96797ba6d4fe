// The lab's side of an agent: spawns it inside a namespace and sends it
// requests; every request has a deadline.
import { spawn, type ChildProcess } from 'node:child_process';
import { agentCommand, type AgentRequest, type AgentResponse } from './agent.js';

type RequestBody = AgentRequest extends infer R ? (R extends { id: number } ? Omit<R, 'id'> : never) : never;

/**
 * How long an agent may take to answer beyond the operation's own time: in
 * the kernel lab (QEMU without KVM, 10-30 times slower, more on a busy
 * machine) a node process can need more than 10 s to start.
 */
export const AGENT_MARGIN_MS = process.env.KPNG_VMLAB ? 60_000 : 10_000;

export class Agent {
  private proc?: ChildProcess;
  private nextId = 1;
  private readonly pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void; timer: NodeJS.Timeout }>();
  private stderr = '';
  private exited = false;

  constructor(
    /** the agent's name: what it answers with (pod name, node name, "world") */
    readonly name: string,
    /** its network namespace */
    readonly ns: string,
  ) {}

  get pid(): number | undefined {
    return this.proc?.pid;
  }

  /** Starts the agent; resolves once it is ready. */
  start(timeoutMs = AGENT_MARGIN_MS): Promise<void> {
    // its own process group: a Ctrl-C meant for the lab's owner must not kill
    // it under a running request (the owner stops it; it also exits on EOF)
    const agent = agentCommand(this.name);
    const p = spawn('ip', ['netns', 'exec', this.ns, ...agent.args], { env: agent.env, stdio: ['pipe', 'pipe', 'pipe'], detached: true });
    this.proc = p;
    p.stdin!.on('error', () => {});
    p.stderr!.on('data', (d) => (this.stderr = (this.stderr + d).slice(-4000)));
    return new Promise((resolve, reject) => {
      let ready = false;
      let buf = '';
      const timer = setTimeout(() => {
        if (!ready) reject(new Error(`agent ${this.name} (${this.ns}) did not start within ${timeoutMs} ms: ${this.stderr}`));
      }, timeoutMs);
      p.stdout!.on('data', (d) => {
        buf += d;
        let i: number;
        while ((i = buf.indexOf('\n')) >= 0) {
          const line = buf.slice(0, i);
          buf = buf.slice(i + 1);
          let msg: AgentResponse & { ready?: string };
          try {
            msg = JSON.parse(line);
          } catch {
            continue;
          }
          if (msg.ready !== undefined) {
            ready = true;
            clearTimeout(timer);
            resolve();
            continue;
          }
          const w = this.pending.get(msg.id);
          if (!w) continue;
          this.pending.delete(msg.id);
          clearTimeout(w.timer);
          if (msg.ok) w.resolve(msg.result);
          else w.reject(new Error(`agent ${this.name}: ${msg.error}`));
        }
      });
      p.on('exit', (code, signal) => {
        this.exited = true;
        clearTimeout(timer);
        const err = new Error(`agent ${this.name} (${this.ns}) exited (${code ?? signal}): ${this.stderr}`);
        if (!ready) reject(err);
        for (const w of this.pending.values()) {
          clearTimeout(w.timer);
          w.reject(err);
        }
        this.pending.clear();
      });
    });
  }

  /** Sends a request; rejects after timeoutMs (the operation's own timeout plus a margin). */
  request<T = unknown>(body: RequestBody, timeoutMs = AGENT_MARGIN_MS): Promise<T> {
    if (!this.proc || this.exited) return Promise.reject(new Error(`agent ${this.name} is not running`));
    const id = this.nextId++;
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new Error(`agent ${this.name}: no answer to ${body.op} within ${timeoutMs} ms`));
      }, timeoutMs);
      this.pending.set(id, { resolve: resolve as (v: unknown) => void, reject, timer });
      this.proc!.stdin!.write(JSON.stringify({ ...body, id }) + '\n');
    });
  }

  /** Stops the agent: EOF first (it exits and closes its sockets), SIGKILL if it lingers. */
  async stop(graceMs = 1000): Promise<void> {
    const p = this.proc;
    if (!p || this.exited) return;
    const gone = new Promise<void>((r) => p.once('exit', () => r()));
    p.stdin!.end();
    const t = setTimeout(() => p.kill('SIGKILL'), graceMs);
    await gone;
    clearTimeout(t);
  }

  /** For exit handlers: no waiting. */
  killSync(): void {
    if (this.proc && !this.exited) this.proc.kill('SIGKILL');
  }
}
