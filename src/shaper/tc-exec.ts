/**
 * The shaper's only way to the kernel: `tc -batch -`, either one exec per operation (`batch`) or
 * one long-lived tc fed line by line (`TcSession`, the default: no spawn per operation).
 * A batch stops at the first failing line unless `force`; tc then names the line as
 * "Command failed -:N", which is how a failure is attributed (by position, not by message text).
 */
import { execa } from 'execa';
import { spawn, type ChildProcess } from 'node:child_process';
import { KubenetError } from '../errors.js';

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
}

/** The failed lines that count. */
function realFailures(failed: number[], optional: ReadonlySet<number> | undefined): number[] {
  return optional ? failed.filter((n) => !optional.has(n)) : failed;
}

const FAILED_RE = /Command failed -:(\d+)/g;

/** Runs `tool [-force] -batch -` with the lines on stdin. Without force, throws on any failure. */
export async function batch(tool: 'tc' | 'ip', lines: string[], opts: BatchOptions & { json?: boolean } = {}): Promise<BatchResult> {
  if (lines.length === 0) return { stdout: '', failed: [], stderr: '' };
  const args = [...(opts.json ? ['-j'] : []), ...(opts.force || opts.optional ? ['-force'] : []), '-batch', '-'];
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

/**
 * One long-lived `tc -force -batch -` fed through stdin: spawning tc costs far more than a line
 * through a running tc (measured: docs/shaping.md, "Spawns and the tc session"). Each run's lines
 * are followed by a marker line that always fails (`qdisc show dev /`); tc reports every failure
 * on stderr as "Command failed -:N" with N counted over the whole session, so the marker's number
 * ends the run and the numbers before it name the failed lines.
 * Runs are serialized. If tc dies, the run in flight fails and the next run starts a new tc.
 *
 * tc's batch mode keeps memory for every line it has run and never frees it (iproute2 6.1 here),
 * so a long-lived session grows without bound as pods come and go. A session is therefore replaced
 * by a fresh tc between two runs once it has run `recycleLines` lines: one spawn every ~200 pods
 * added and deleted, and the agent's helpers stay small (measured, with the soak that shows it:
 * docs/shaping.md, "Spawns and the tc session").
 */
export class TcSession {
  private proc: ChildProcess | undefined;
  private lineNo = 0;
  private buf = '';
  private tail: Promise<unknown> = Promise.resolve();
  private pending:
    | { proc: ChildProcess; first: number; marker: number; failed: number[]; stderr: string[]; resolve: (r: BatchResult) => void; reject: (e: unknown) => void; lines: string[] }
    | undefined;

  /** Processes started so far (the first one included). */
  spawned = 0;

  constructor(
    private readonly timeoutMs = 30_000,
    private readonly recycleLines = 1_500,
  ) {}

  /** The current tc process's pid, undefined before the first run or after close(). */
  get pid(): number | undefined {
    return this.proc?.pid;
  }

  run(lines: string[], opts: BatchOptions = {}): Promise<BatchResult> {
    const once = async (): Promise<BatchResult> => {
      const r = await this.runNow(lines, { force: true });
      if (realFailures(r.failed, opts.optional).length === 0) return r;
      // tc caches interface name -> index for its lifetime; a veth or ifb re-created under the
      // same name makes that stale. Lines are idempotent (replace, or deletes of what should be
      // gone), so a failed run is retried once on a fresh tc before it counts.
      this.close();
      return this.runNow(lines, { force: true });
    };
    const checked = async (): Promise<BatchResult> => {
      const r = await once();
      const real = realFailures(r.failed, opts.optional);
      if (!opts.force && real.length > 0) throw new TcBatchError('tc', lines, r.stderr, 1, real);
      return r;
    };
    const next = this.tail.then(checked, checked);
    this.tail = next.catch(() => undefined);
    return next;
  }

  private spawnTc(): ChildProcess {
    const proc = spawn('tc', ['-force', '-batch', '-'], { stdio: ['pipe', 'ignore', 'pipe'] });
    this.spawned++;
    this.lineNo = 0;
    this.buf = '';
    proc.stderr?.setEncoding('utf8');
    proc.stderr?.on('data', (d: string) => this.onData(d));
    const fail = (err: unknown) => {
      if (this.proc === proc) this.proc = undefined;
      const p = this.pending;
      if (p?.proc !== proc) return;
      this.pending = undefined;
      p.reject(err);
    };
    proc.on('error', fail);
    proc.on('exit', (code, signal) => fail(new KubenetError(`tc -batch session exited (${code ?? signal})`)));
    proc.stdin?.on('error', fail);
    proc.unref();
    return proc;
  }

  private setRef(on: boolean): void {
    const s = this.proc?.stderr as (NodeJS.ReadableStream & { ref?: () => void; unref?: () => void }) | null | undefined;
    if (on) s?.ref?.();
    else s?.unref?.();
  }

  private onData(d: string): void {
    this.buf += d;
    let nl: number;
    while ((nl = this.buf.indexOf('\n')) >= 0) {
      const line = this.buf.slice(0, nl);
      this.buf = this.buf.slice(nl + 1);
      const p = this.pending;
      if (!p) continue;
      const m = /^Command failed -:(\d+)$/.exec(line);
      if (!m) {
        p.stderr.push(line);
        continue;
      }
      const n = Number(m[1]);
      if (n === p.marker) {
        this.pending = undefined;
        p.resolve({ stdout: '', failed: p.failed, stderr: p.stderr.join('\n') });
      } else if (n >= p.first && n < p.marker) {
        p.failed.push(n - p.first + 1);
        p.stderr.push(line);
      }
    }
  }

  private async runNow(lines: string[], opts: { force?: boolean }): Promise<BatchResult> {
    if (lines.length === 0) return { stdout: '', failed: [], stderr: '' };
    // Between runs (they are serialized): nothing is pending on the old process.
    if (this.proc && this.lineNo >= this.recycleLines) this.close();
    const proc = (this.proc ??= this.spawnTc());
    const first = this.lineNo + 1;
    const marker = this.lineNo + lines.length + 1;
    this.lineNo = marker;
    this.setRef(true);
    let timer: NodeJS.Timeout | undefined;
    try {
      const res = await new Promise<BatchResult>((resolve, reject) => {
        this.pending = { proc, first, marker, failed: [], stderr: [], resolve, reject, lines };
        timer = setTimeout(() => {
          reject(new KubenetError(`tc -batch session: no answer in ${this.timeoutMs} ms`));
          this.close();
        }, this.timeoutMs);
        proc.stdin?.write([...lines, 'qdisc show dev /'].join('\n') + '\n');
      });
      if (!opts.force && res.failed.length > 0) throw new TcBatchError('tc', lines, res.stderr, 1, res.failed);
      return res;
    } finally {
      clearTimeout(timer);
      this.setRef(false);
    }
  }

  close(): void {
    const p = this.proc;
    this.proc = undefined;
    if (p) {
      p.stdin?.end();
      p.kill();
    }
  }
}
