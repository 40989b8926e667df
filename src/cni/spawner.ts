/**
 * The agent's side of native/kubenet-spawner: a tiny C process started once (lazily, at the first
 * plugin exec) that forks and execs CNI plugins on request and relays their stdin, stdout, stderr
 * and wait status over its stdin/stdout (the frame protocol is documented in the C file).
 *
 * Why not child_process: libuv forks the whole agent for every child, and the fork copies the
 * page tables of the whole agent, so every exec costs more as the agent's RSS grows. The spawner's
 * fork copies only its own tiny process (measured: docs/cni.md, "Plugin execs"). It also makes
 * plugins die with the agent: when the agent dies, the spawner sees EOF (or its parent-death
 * signal), SIGKILLs every running plugin's process group and exits.
 *
 * One spawner per agent process, shared by every caller; it and its pipes are unref'd, so it never
 * keeps the agent alive (a run in flight keeps its timeout timer, which does). If it dies, the runs
 * in flight fail (the plugin's group was killed with it) and the next run starts a new one.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { accessSync, constants as fsConstants } from 'node:fs';
import { constants as osConstants } from 'node:os';
import type { Socket } from 'node:net';
import { packagePath } from '../util/package-root.js';

/** Relative to the package root, as hack/build-native.sh builds it. */
export const SPAWNER_BUILD_PATH = 'native/build/kubenet-spawner';
/** After a kill, how long to wait for the spawner's report before giving up on it. */
const KILL_GRACE_MS = 2000;

/** How one run ended. Exactly one of exitCode / signal / errno is set unless the spawner failed (`failure`). */
export interface SpawnOutcome {
  pid: number | undefined;
  exitCode: number | undefined;
  signal: NodeJS.Signals | undefined;
  /** The plugin could not be started: errno name from pipe/fork/execve, e.g. ENOENT, EACCES. */
  errno: string | undefined;
  /** The spawner itself failed or died during the run. */
  failure: Error | undefined;
  timedOut: boolean;
  stdout: string;
  stderr: string;
}

interface Run {
  id: number;
  pid: number | undefined;
  stdout: Buffer[];
  stderr: Buffer[];
  timedOut: boolean;
  timer: NodeJS.Timeout | undefined;
  done(o: Partial<SpawnOutcome>): void;
}

const SIGNAL_NAMES = new Map<number, NodeJS.Signals>(Object.entries(osConstants.signals).map(([k, v]) => [v, k as NodeJS.Signals]));
const ERRNO_NAMES = new Map<number, string>(Object.entries(osConstants.errno).map(([k, v]) => [v, k]));

export function spawnerBinaryPath(): string {
  return packagePath(SPAWNER_BUILD_PATH);
}

/** Text as execa gives it: UTF-8, one final newline removed. */
function text(chunks: Buffer[]): string {
  const s = Buffer.concat(chunks).toString('utf8');
  if (s.endsWith('\r\n')) return s.slice(0, -2);
  return s.endsWith('\n') ? s.slice(0, -1) : s;
}

function frame(type: string, id: number, payloadLength: number): Buffer {
  const b = Buffer.allocUnsafe(9 + payloadLength);
  b.writeUInt32LE(5 + payloadLength, 0);
  b.write(type, 4, 'latin1');
  b.writeUInt32LE(id, 5);
  return b;
}

export class PluginSpawner {
  private child: ChildProcess | undefined;
  private readonly runs = new Map<number, Run>();
  private nextId = 1;
  private pending: Buffer = Buffer.alloc(0);

  constructor(readonly binaryPath: string = spawnerBinaryPath()) {}

  /** True when the spawner binary is there to be started. */
  available(): boolean {
    try {
      accessSync(this.binaryPath, fsConstants.X_OK);
      return true;
    } catch {
      return false;
    }
  }

  /** pid of the running spawner process, if one runs (tests). */
  get pid(): number | undefined {
    return this.child?.pid;
  }

  /**
   * Starts `path` (argv[0] = path) with exactly `env`, writes `stdin` to it and closes it, and
   * collects stdout and stderr until the plugin exited and both are at EOF. After `timeoutMs` the
   * plugin's whole process group is SIGKILLed and the output so far is returned (timedOut).
   * Never rejects: failures are in the outcome.
   */
  run(path: string, env: Record<string, string>, stdin: string | Uint8Array, timeoutMs: number): Promise<SpawnOutcome> {
    return new Promise<SpawnOutcome>((resolveRun) => {
      let child: ChildProcess;
      try {
        child = this.ensureStarted();
      } catch (err) {
        resolveRun(outcome({ failure: err instanceof Error ? err : new Error(String(err)) }));
        return;
      }
      const id = this.nextId;
      this.nextId = this.nextId >= 0xffff_fff0 ? 1 : this.nextId + 1;
      const run: Run = {
        id,
        pid: undefined,
        stdout: [],
        stderr: [],
        timedOut: false,
        timer: undefined,
        done: (o) => {
          if (!this.runs.delete(id)) return;
          clearTimeout(run.timer);
          resolveRun(outcome({ pid: run.pid, timedOut: run.timedOut, stdout: text(run.stdout), stderr: text(run.stderr), ...o }));
        },
      };
      this.runs.set(id, run);
      run.timer = setTimeout(() => {
        run.timedOut = true;
        this.send(child, frame('K', id, 0));
        // The spawner answers once the group is killed and reaped; do not wait for it forever.
        run.timer = setTimeout(() => run.done({}), KILL_GRACE_MS);
      }, timeoutMs);

      const input = typeof stdin === 'string' ? Buffer.from(stdin, 'utf8') : stdin;
      const strings = Buffer.from([path, ...Object.entries(env).map(([k, v]) => `${k}=${v}`)].join('\0') + '\0', 'utf8');
      const msg = frame('S', id, 4 + input.byteLength + strings.byteLength);
      msg.writeUInt32LE(input.byteLength, 9);
      msg.set(input, 13);
      msg.set(strings, 13 + input.byteLength);
      this.send(child, msg);
    });
  }

  /** Stops the spawner (it kills whatever still runs); runs in flight fail. For tests and shutdown. */
  async close(): Promise<void> {
    const child = this.child;
    if (!child) return;
    const exited = new Promise<void>((ok) =>
      child.exitCode !== null || child.signalCode !== null ? ok() : child.once('exit', () => ok()),
    );
    child.ref(); // else an otherwise idle process would exit before the wait is over
    child.stdin?.end();
    await exited;
  }

  private send(child: ChildProcess, buf: Buffer): void {
    if (this.child !== child) return; // that spawner is gone; its runs already failed
    child.stdin?.write(buf);
  }

  private ensureStarted(): ChildProcess {
    if (this.child) return this.child;
    // detached: its own session, so a terminal's SIGINT to the agent's group does not reach it.
    const child = spawn(this.binaryPath, [String(process.pid)], { stdio: ['pipe', 'pipe', 'inherit'], detached: true });
    this.child = child;
    this.pending = Buffer.alloc(0);
    const lost = (why: Error) => {
      if (this.child !== child) return;
      this.child = undefined;
      for (const run of [...this.runs.values()]) run.done({ failure: why });
    };
    child.once('error', (err) => lost(new Error(`plugin spawner ${this.binaryPath}: ${err.message}`, { cause: err })));
    child.once('exit', (code, signal) => lost(new Error(`plugin spawner ${this.binaryPath} exited (${signal ?? `status ${code}`})`)));
    child.stdin?.on('error', () => undefined); // EPIPE when it died: reported by 'exit'
    child.stdout?.on('data', (chunk: Buffer) => this.receive(chunk));
    child.unref();
    (child.stdin as Socket | null)?.unref();
    (child.stdout as Socket | null)?.unref();
    return child;
  }

  private receive(chunk: Buffer): void {
    const buf = this.pending.length === 0 ? chunk : Buffer.concat([this.pending, chunk]);
    let off = 0;
    while (buf.length - off >= 4) {
      const len = buf.readUInt32LE(off);
      if (buf.length - off < 4 + len) break;
      const type = String.fromCharCode(buf[off + 4] ?? 0);
      const id = buf.readUInt32LE(off + 5);
      const payload = buf.subarray(off + 9, off + 4 + len);
      off += 4 + len;
      this.frame(type, id, payload);
    }
    this.pending = off === buf.length ? Buffer.alloc(0) : buf.subarray(off);
  }

  private frame(type: string, id: number, payload: Buffer): void {
    const run = this.runs.get(id);
    if (!run) return; // a run that timed out and was given up on
    switch (type) {
      case 'P':
        run.pid = payload.readUInt32LE(0);
        break;
      case 'O':
        run.stdout.push(payload); // a view of the socket's chunk, which is never reused
        break;
      case 'E':
        run.stderr.push(payload);
        break;
      case 'F': {
        const e = payload.readUInt32LE(0);
        run.done({ errno: ERRNO_NAMES.get(e) ?? `errno ${e}` });
        break;
      }
      case 'X': {
        const status = payload.readInt32LE(0);
        // <sys/wait.h>: exited when the low 7 bits are 0; else killed by that signal.
        const sig = status & 0x7f;
        if (sig === 0) run.done({ exitCode: (status >> 8) & 0xff });
        else run.done({ signal: SIGNAL_NAMES.get(sig) ?? (`SIG${sig}` as NodeJS.Signals) });
        break;
      }
      default:
        break;
    }
  }
}

function outcome(o: Partial<SpawnOutcome>): SpawnOutcome {
  return {
    pid: o.pid,
    exitCode: o.exitCode,
    signal: o.signal,
    errno: o.errno,
    failure: o.failure,
    timedOut: o.timedOut ?? false,
    stdout: o.stdout ?? '',
    stderr: o.stderr ?? '',
  };
}

let shared: PluginSpawner | undefined;

/** The process-wide spawner. */
export function sharedSpawner(): PluginSpawner {
  shared ??= new PluginSpawner();
  return shared;
}
