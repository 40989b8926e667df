/**
 * The reference DHCP lease daemon (`dhcp daemon`, the dhcp IPAM plugin's other half), run by the
 * agent in dhcp mode: its socket in the agent's run dir (`-socketpath`, the plugin's
 * `daemonSocketPath`), its output in the agent's log, restarted with backoff whenever it exits, and
 * stopped with the agent (SIGTERM on stop; on a crash of the agent, the kernel's parent-death signal
 * through `setpriv --pdeathsig`, so no daemon outlives its agent and holds the socket).
 *
 * The daemon keeps its leases in memory only: after each restart `onRestart` runs (the agent has the
 * core acquire every known pod's lease again), so renewals continue and pods keep their addresses.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync, unlinkSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { KubenetError } from '../../errors.js';
import type { Logger } from '../../log.js';
import { moduleLogger } from '../../util/module-logger.js';
import { socketAnswers } from '../../pod/index.js';
import { dyingWithParent } from '../../util/parent-death.js';

export interface DhcpDaemonOptions {
  /** The dhcp plugin binary (the daemon is its `daemon` subcommand). */
  binary: string;
  /** Its socket; the pid file goes beside it. */
  socket: string;
  /** The daemon's per-attempt DHCP client timeout (`-timeout`), in seconds. */
  attemptTimeoutSec: number;
  log: Logger;
  /** After every start but the first: the daemon lost its leases. */
  onRestart?: () => void;
  /** Restart delays: doubled after each quick exit from `initialMs` up to `maxMs`. Default 1 s .. 30 s. */
  backoff?: { initialMs: number; maxMs: number };
  /** How long a start may take until the socket answers. Default 10 s. */
  readyTimeoutMs?: number;
}

/** A daemon that ran this long before it exited restarts after the initial delay again. */
const STABLE_MS = 60_000;

export class DhcpDaemon {
  private proc: ChildProcess | undefined;
  private stopping = false;
  private timer: NodeJS.Timeout | undefined;
  private delayMs: number;
  private startedAt = 0;
  /** Starts so far (1 after the first). */
  starts = 0;
  private readonly log: Logger;
  private readonly pidFile: string;

  constructor(private readonly o: DhcpDaemonOptions) {
    this.log = moduleLogger(o.log, 'dhcp-daemon');
    this.delayMs = o.backoff?.initialMs ?? 1000;
    this.pidFile = join(dirname(o.socket), 'dhcp.pid');
  }

  get pid(): number | undefined {
    return this.proc?.pid;
  }

  /** Starts the daemon and resolves once it answers on its socket; throws when it does not. */
  async start(): Promise<void> {
    this.stopping = false;
    await this.spawnAndWait();
  }

  private async spawnAndWait(): Promise<void> {
    this.killStale();
    const args = ['daemon', '-socketpath', this.o.socket, '-pidfile', this.pidFile, '-timeout', `${this.o.attemptTimeoutSec}s`];
    const [file, argv] = dyingWithParent(this.o.binary, args);
    const proc = spawn(file, argv, { stdio: ['ignore', 'pipe', 'pipe'] });
    this.proc = proc;
    this.startedAt = Date.now();
    this.starts++;
    for (const stream of [proc.stdout, proc.stderr]) {
      createInterface({ input: stream }).on('line', (line) => this.log.info({ daemon: 'dhcp', pid: proc.pid }, line));
    }
    let exited = false;
    proc.once('error', (err) => this.log.error({ err, binary: this.o.binary }, 'cannot run the DHCP lease daemon'));
    proc.once('exit', (code, signal) => {
      exited = true;
      this.onExit(proc, code, signal);
    });
    const deadline = Date.now() + (this.o.readyTimeoutMs ?? 10_000);
    while (!exited && Date.now() < deadline) {
      if (await socketAnswers(this.o.socket, 500)) {
        this.log.info({ pid: proc.pid, socket: this.o.socket, start: this.starts }, 'DHCP lease daemon answers');
        return;
      }
      await new Promise((r) => setTimeout(r, 50));
    }
    if (!exited) proc.kill('SIGKILL');
    throw new KubenetError(
      `the DHCP lease daemon ${this.o.binary} did not answer on ${this.o.socket} within ${(this.o.readyTimeoutMs ?? 10_000) / 1000} s`,
    );
  }

  private onExit(proc: ChildProcess, code: number | null, signal: NodeJS.Signals | null): void {
    if (this.proc === proc) this.proc = undefined;
    if (this.stopping) {
      this.log.info({ code, signal }, 'DHCP lease daemon stopped');
      return;
    }
    const ran = Date.now() - this.startedAt;
    if (ran >= STABLE_MS) this.delayMs = this.o.backoff?.initialMs ?? 1000;
    const delay = this.delayMs;
    this.delayMs = Math.min(this.delayMs * 2, this.o.backoff?.maxMs ?? 30_000);
    this.log.warn(
      { code, signal, ranMs: ran, restartInMs: delay },
      'DHCP lease daemon exited; restarting it (its leases are acquired again)',
    );
    this.timer = setTimeout(() => void this.restart(), delay);
  }

  private async restart(): Promise<void> {
    this.timer = undefined;
    if (this.stopping) return;
    try {
      await this.spawnAndWait();
      this.o.onRestart?.();
    } catch (err) {
      // Its exit (or the kill above) schedules the next try.
      this.log.error({ err }, 'DHCP lease daemon restart failed');
    }
  }

  /**
   * A daemon left by an earlier agent (pid file naming a live dhcp daemon on this socket) is killed,
   * and a socket file nobody serves is removed: the new daemon could not listen on it otherwise.
   */
  private killStale(): void {
    try {
      const pid = Number(readFileSync(this.pidFile, 'utf8').trim());
      const cmdline = Number.isInteger(pid) && pid > 1 ? readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0') : [];
      if (cmdline.includes('daemon') && cmdline.includes(this.o.socket)) {
        process.kill(pid, 'SIGKILL');
        this.log.warn({ pid }, 'killed a DHCP lease daemon an earlier agent left running');
      }
    } catch {
      // no pid file, or the process is gone
    }
    try {
      unlinkSync(this.o.socket);
    } catch {
      // none
    }
  }

  /** Stops the daemon (SIGTERM, SIGKILL after 5 s) and any restart pending. */
  async stop(): Promise<void> {
    this.stopping = true;
    clearTimeout(this.timer);
    const proc = this.proc;
    if (!proc || proc.exitCode !== null || proc.signalCode !== null) return;
    const exited = new Promise<void>((r) => proc.once('exit', () => r()));
    proc.kill('SIGTERM');
    let t: NodeJS.Timeout | undefined;
    const killed = await Promise.race([exited.then(() => false), new Promise<boolean>((r) => (t = setTimeout(() => r(true), 5000)))]);
    clearTimeout(t);
    if (killed) {
      proc.kill('SIGKILL');
      await exited;
    }
  }
}

/**
 * The daemon's per-attempt client timeout for a lease timeout: half of it, 1..10 s. Long enough for
 * servers that probe an address before offering it (dnsmasq pings it: ~3 s), so the first attempt
 * normally gets its offer; the daemon tries again 2±1 s after an attempt that got none.
 */
export function attemptTimeoutSec(dhcpTimeoutSec: number): number {
  return Math.max(1, Math.min(10, Math.floor(dhcpTimeoutSec / 2)));
}
