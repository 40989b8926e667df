/**
 * The shaper's only way to the kernel: `tc -batch -`, either one exec per operation (`batch`) or
 * one long-lived tc fed line by line (`TcSession`, the default: no spawn per operation).
 * A batch stops at the first failing line unless `force`; tc then names the line as
 * "Command failed -:N", which is how a failure is attributed (by position, not by message text).
 */
import { execa } from 'execa';
import { spawn, type ChildProcess } from 'node:child_process';
import { KubenetError } from '../errors.js';
import { dyingWithParent } from '../util/parent-death.js';

/** A tc/ip batch failed; `line` is the failing command (1-based `lineNo`) when the tool named one. */
export class TcBatchError extends KubenetError {
  readonly tool: string;
  readonly lineNo: number | undefined;
  readonly line: string | undefined;
  readonly stderr: string;
  constructor(tool: string, lines: string[], stderr: string, exitCode: number | undefined, failedLines: number[]) {
    const first = failedLines[0];
    const line = first === undefined ? undefined : lines[first - 1];
    const where = line === undefined ? '' : ` at line ${first}: ${line}`;
    super(`${tool} -batch failed (exit ${exitCode ?? 'signal'})${where}: ${stderr.trim().split('\n').slice(-3).join(' | ')}`);
    this.tool = tool;
    this.lineNo = first;
    this.line = line;
    this.stderr = stderr;
  }
}

export interface BatchResult {
  stdout: string;
  /** 1-based numbers of the lines that failed (only several with `force`), `optional` ones included. */
  failed: number[];
  stderr: string;
}

export interface BatchOptions {
  /** Run every line and report failures instead of throwing. */
  force?: boolean;
  /**
   * 1-based numbers of lines whose failure is expected and not an error (e.g. a `qdisc replace`
   * that the kernel refuses when the qdisc is already there). The batch runs with -force then.
   */
  optional?: ReadonlySet<number>;
  /** Run in the named network namespace (`TOOL -n NAME`, /var/run/netns/NAME). */
  netns?: string;
}

/** The failed lines that count. */
function realFailures(failed: number[], optional: ReadonlySet<number> | undefined): number[] {
  return optional ? failed.filter((n) => !optional.has(n)) : failed;
}

const FAILED_RE = /Command failed -:(\d+)/g;

/** Runs `tool [-force] -batch -` with the lines on stdin. Without force, throws on any failure. */
export async function batch(
  tool: 'tc' | 'ip' | 'bridge',
  lines: string[],
  opts: BatchOptions & { json?: boolean } = {},
): Promise<BatchResult> {
  if (lines.length === 0) return { stdout: '', failed: [], stderr: '' };
  const args = [
    ...(opts.netns !== undefined ? ['-n', opts.netns] : []),
    ...(opts.json ? ['-j'] : []),
    ...(opts.force || opts.optional ? ['-force'] : []),
    '-batch',
    '-',
  ];
  const r = await execa(tool, args, { input: lines.join('\n') + '\n', reject: false, stripFinalNewline: false });
  const stderr = String(r.stderr ?? '');
  const failed = [...stderr.matchAll(FAILED_RE)].map((m) => Number(m[1]));
  if (r.exitCode !== 0 && failed.length === 0) {
    // The tool itself could not run (missing binary, killed): nothing was attributed to a line.
    throw new TcBatchError(tool, lines, stderr || String(r.message ?? ''), r.exitCode, []);
  }
  const real = realFailures(failed, opts.optional);
  if (!opts.force && real.length > 0) throw new TcBatchError(tool, lines, stderr, r.exitCode, real);
  return { stdout: String(r.stdout ?? ''), failed, stderr };
}

/** A run written to a tc and not yet answered: its lines are first..marker-1 of that tc's, the marker ends it. */
interface PendingRun {
  first: number;
  marker: number;
  failed: number[];
  stderr: string[];
  resolve: (r: BatchResult) => void;
  reject: (e: unknown) => void;
}

/** One `tc -force -batch -` process and the runs written to it, answered in the order written. */
interface TcProcess {
  proc: ChildProcess;
  lineNo: number;
  buf: string;
  pending: PendingRun[];
}

/**
 * One long-lived `tc -force -batch -` fed through stdin: spawning tc costs far more than a line
 * through a running tc (measured: docs/shaping.md, "Spawns and the tc session"). Each run's lines
 * are followed by a marker line that always fails (`qdisc show dev /`); tc reports every failure
 * on stderr as "Command failed -:N" with N counted over the whole session, so the marker's number
 * ends the run and the numbers before it name the failed lines.
 *
 * Runs are pipelined: each is written as soon as it is asked for, so tc runs them back to back in
 * the order asked, without waiting for the agent to read one answer before it writes the next
 * (in a burst of pods a run waited 10.5 ms on average for the one before it: docs/shaping.md). Callers
 * order what must be ordered by awaiting (the shaper: per pod, and a class reused only after its
 * removal's run has answered). If tc dies, the runs written to it fail, and the next run starts a
 * new tc.
 *
 * tc's batch mode keeps memory for every line it has run and never frees it (iproute2 6.1 here),
 * so a long-lived session grows without bound as pods come and go. Once a tc has run
 * `recycleLines` lines the next run goes to a fresh tc, and the old one is retired: its stdin is
 * closed, it answers what it was given and exits. One spawn every ~200 pods added and deleted, and
 * the agent's helpers stay small (measured, with the soak that shows it: docs/shaping.md, "Spawns
 * and the tc session").
 */
export class TcSession {
  private current: TcProcess | undefined;
  /** Every tc with runs in flight or not yet gone (the current one and retired ones). */
  private readonly live = new Set<TcProcess>();

  /** Processes started so far (the first one included). */
  spawned = 0;

  constructor(
    private readonly timeoutMs = 30_000,
    private readonly recycleLines = 1_500,
  ) {}

  /** The current tc process's pid, undefined before the first run or after close(). */
  get pid(): number | undefined {
    return this.current?.proc.pid;
  }

  async run(lines: string[], opts: BatchOptions = {}): Promise<BatchResult> {
    let r = await this.runNow(lines);
    if (realFailures(r.result.failed, opts.optional).length > 0) {
      // tc caches interface name -> index for its lifetime; a veth or ifb re-created under the
      // same name makes that stale. Lines are idempotent (replace, or deletes of what should be
      // gone), so a failed run is retried once on a fresh tc before it counts.
      this.retire(r.tc);
      r = await this.runNow(lines);
    }
    const real = realFailures(r.result.failed, opts.optional);
    if (!opts.force && real.length > 0) throw new TcBatchError('tc', lines, r.result.stderr, 1, real);
    return r.result;
  }

  private spawnTc(): TcProcess {
    // Dies with the agent: lines it holds never run after the next agent's start (parent-death.ts).
    const proc = spawn(...dyingWithParent('tc', ['-force', '-batch', '-']), { stdio: ['pipe', 'ignore', 'pipe'] });
    this.spawned++;
    const tc: TcProcess = { proc, lineNo: 0, buf: '', pending: [] };
    this.live.add(tc);
    proc.stderr?.setEncoding('utf8');
    proc.stderr?.on('data', (d: string) => this.onData(tc, d));
    const fail = (err: unknown) => {
      if (this.current === tc) this.current = undefined;
      for (const p of tc.pending.splice(0)) p.reject(err);
    };
    proc.on('error', fail);
    // 'close', not 'exit': every answer tc wrote before it exited has been read by then.
    proc.on('close', (code, signal) => {
      this.live.delete(tc);
      fail(new KubenetError(`tc -batch session exited (${code ?? signal})`));
    });
    proc.stdin?.on('error', fail);
    proc.unref();
    this.setRef(tc, false);
    return tc;
  }

  private setRef(tc: TcProcess, on: boolean): void {
    const s = tc.proc.stderr as (NodeJS.ReadableStream & { ref?: () => void; unref?: () => void }) | null | undefined;
    if (on) s?.ref?.();
    else s?.unref?.();
  }

  private onData(tc: TcProcess, d: string): void {
    tc.buf += d;
    let nl: number;
    while ((nl = tc.buf.indexOf('\n')) >= 0) {
      const line = tc.buf.slice(0, nl);
      tc.buf = tc.buf.slice(nl + 1);
      const m = /^Command failed -:(\d+)$/.exec(line);
      const n = m ? Number(m[1]) : undefined;
      // A line belongs to the oldest run not yet answered: tc answers in the order it was given.
      const p = tc.pending[0];
      if (!p) continue;
      if (n === undefined) {
        p.stderr.push(line);
      } else if (n === p.marker) {
        tc.pending.shift();
        p.resolve({ stdout: '', failed: p.failed, stderr: p.stderr.join('\n') });
      } else if (n >= p.first && n < p.marker) {
        p.failed.push(n - p.first + 1);
        p.stderr.push(line);
      }
    }
    if (tc.pending.length === 0) this.setRef(tc, false);
  }

  /** No new runs go to this tc; it answers what it was given and exits. */
  private retire(tc: TcProcess | undefined): void {
    if (!tc) return;
    if (this.current === tc) this.current = undefined;
    tc.proc.stdin?.end();
  }

  private async runNow(lines: string[]): Promise<{ tc: TcProcess | undefined; result: BatchResult }> {
    if (lines.length === 0) return { tc: undefined, result: { stdout: '', failed: [], stderr: '' } };
    if (this.current && this.current.lineNo >= this.recycleLines) this.retire(this.current);
    const tc = (this.current ??= this.spawnTc());
    const first = tc.lineNo + 1;
    const marker = tc.lineNo + lines.length + 1;
    tc.lineNo = marker;
    this.setRef(tc, true);
    let timer: NodeJS.Timeout | undefined;
    try {
      const result = await new Promise<BatchResult>((resolve, reject) => {
        tc.pending.push({ first, marker, failed: [], stderr: [], resolve, reject });
        timer = setTimeout(() => {
          reject(new KubenetError(`tc -batch session: no answer in ${this.timeoutMs} ms`));
          this.kill(tc);
        }, this.timeoutMs);
        tc.proc.stdin?.write([...lines, 'qdisc show dev /'].join('\n') + '\n');
      });
      return { tc, result };
    } finally {
      clearTimeout(timer);
    }
  }

  private kill(tc: TcProcess): void {
    if (this.current === tc) this.current = undefined;
    tc.proc.stdin?.end();
    tc.proc.kill();
  }

  /** Ends every tc of the session; runs in flight fail. The next run starts a new tc. */
  close(): void {
    for (const tc of this.live) this.kill(tc);
    this.current = undefined;
  }
}
