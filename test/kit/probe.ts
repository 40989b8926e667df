/**
 * A kubelet-like TCP probe between two of our namespaces: a tiny server in one, a client in the
 * other that opens a new connection, sends a request line, reads the answer and closes, every
 * `intervalMs` (probe-worker.mjs does the work inside the namespaces). Only the test's own
 * namespaces and addresses are used.
 */
import { execa, type ResultPromise } from 'execa';
import { fileURLToPath } from 'node:url';
import type { TopoPod } from './topo.js';

const WORKER = fileURLToPath(new URL('./probe-worker.mjs', import.meta.url));

export interface ProbeServer {
  host: string;
  port: number;
  stop(): Promise<void>;
}

let portSeq = 0;

/**
 * Starts the probe server in `pod`'s namespace on its IPv4 address. A server that does not come
 * up (port taken, slow start) is the tool failing, not a measurement: tried again on another
 * port, at most three times.
 */
export async function startProbeServer(pod: TopoPod): Promise<ProbeServer> {
  for (let attempt = 1; ; attempt++) {
    const port = 40000 + ((process.pid * 13 + portSeq++) % 20000);
    const proc: ResultPromise = execa('ip', ['netns', 'exec', pod.netns, process.execPath, WORKER, 'server', pod.ip4, String(port)], {
      reject: false,
    });
    const up = await new Promise<boolean>((resolve) => {
      const timer = setTimeout(() => resolve(false), 5000);
      proc.stdout?.on('data', (d: Buffer) => {
        if (d.toString().includes('listening')) {
          clearTimeout(timer);
          resolve(true);
        }
      });
      void proc.then(() => {
        clearTimeout(timer);
        resolve(false);
      });
    });
    const stop = async () => {
      proc.kill('SIGKILL');
      await proc.catch(() => undefined);
    };
    if (up) return { host: pod.ip4, port, stop };
    await stop();
    if (attempt >= 3) throw new Error(`probe server did not start in ${pod.netns}: ${String((await proc).stderr ?? '')}`);
  }
}

export interface ProbeResult {
  /** per try in start order: connect-to-answer time in ms, or null (failed or timed out) */
  ms: Array<number | null>;
  errors: Record<string, number>;
}

/** Runs the probe client in `from` against `server` for `durationMs`; resolves when every try ended. */
export async function runProbes(
  from: TopoPod,
  server: ProbeServer,
  opts: { intervalMs?: number; durationMs: number; timeoutMs?: number },
): Promise<ProbeResult> {
  const interval = opts.intervalMs ?? 200;
  const timeout = opts.timeoutMs ?? 2000;
  const r = await execa(
    'ip',
    [
      'netns',
      'exec',
      from.netns,
      process.execPath,
      WORKER,
      'client',
      server.host,
      String(server.port),
      String(interval),
      String(opts.durationMs),
      String(timeout),
    ],
    {
      reject: false,
      timeout: opts.durationMs + timeout + 10_000,
    },
  );
  const line = r.stdout.trim().split('\n').pop() ?? '';
  try {
    return JSON.parse(line) as ProbeResult;
  } catch {
    throw new Error(`probe client printed no result (exit ${r.exitCode}): ${r.stderr || r.stdout}`);
  }
}

export interface ProbeStats {
  tries: number;
  failed: number;
  p50: number;
  p99: number;
  max: number;
  /** share of all tries (failures count as misses) that answered within the given ms */
  within(ms: number): number;
}

export function probeStats(r: ProbeResult): ProbeStats {
  const ok = r.ms.filter((x): x is number => typeof x === 'number').sort((a, b) => a - b);
  const tries = r.ms.length;
  // Percentiles over all tries: a failed try counts as slower than any answer.
  const pct = (q: number) => {
    const i = Math.min(tries - 1, Math.ceil(q * tries) - 1);
    return i < ok.length ? (ok[Math.max(0, i)] ?? NaN) : Infinity;
  };
  return {
    tries,
    failed: tries - ok.length,
    p50: pct(0.5),
    p99: pct(0.99),
    max: ok.length === tries ? (ok[ok.length - 1] ?? NaN) : Infinity,
    within: (ms) => (tries === 0 ? NaN : ok.filter((x) => x <= ms).length / tries),
  };
}
