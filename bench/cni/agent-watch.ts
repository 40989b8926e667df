/** The agent's responsiveness during bench/cni.ts's bursts: its event-loop delay histogram, /healthz polled, its main thread's schedstat. */
import { readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import type { AgentHarness } from '../../test/kit/agent-harness.js';
import { sleep } from './common.js';

/** The agent's responsiveness over a window: its event-loop delay histogram's increase, and /healthz polled meanwhile. */
export interface AgentSeen {
  /** Bucket upper bound (s; Infinity last) → samples, not cumulative. */
  loop: Array<[number, number]>;
  /** Each /healthz answer's time (ms), and the polls that failed or were not 200. */
  health: number[];
  healthFailures: number;
  /** The agent's main thread over the window (agent in its own process): ms on a CPU, and ms runnable but waiting for one. */
  mainThread?: { runMs: number; waitMs: number; windowMs: number };
}

/** /proc/PID/task/PID/schedstat of a process's main thread: ns on a CPU, ns waiting on a run queue. */
export function mainThreadSched(pid: number | undefined): { run: number; wait: number } | undefined {
  if (pid === undefined) return undefined;
  try {
    const [run = NaN, wait = NaN] = readFileSync(`/proc/${pid}/task/${pid}/schedstat`, 'utf8').split(' ').map(Number);
    return { run, wait };
  } catch {
    return undefined;
  }
}

export const LOOP_METRIC = 'kubenet_event_loop_delay_seconds';
export const HEALTH_POLL_MS = 10;

/** The cumulative buckets of a label-less histogram in Prometheus text: [upper bound (s), count], +Inf last. */
export function histogramBuckets(text: string, metric: string): Array<[number, number]> {
  const out: Array<[number, number]> = [];
  for (const m of text.matchAll(new RegExp(`^${metric}_bucket\\{le="([^"]+)"\\} ([0-9.e+-]+)$`, 'gm'))) {
    out.push([m[1] === '+Inf' ? Infinity : Number(m[1]), Number(m[2])]);
  }
  return out.sort((a, b) => a[0] - b[0]);
}

/** Per-bucket samples added between two cumulative readings of the same histogram. */
export function bucketDelta(before: Array<[number, number]>, after: Array<[number, number]>): Array<[number, number]> {
  let prev = 0;
  return after.map(([le, cum], i) => {
    const d = cum - (before[i]?.[1] ?? 0);
    const own = d - prev;
    prev = d;
    return [le, own];
  });
}

/** Bucket-wise sum of per-bucket samples. */
export function addBuckets(a: Array<[number, number]>, b: Array<[number, number]>): Array<[number, number]> {
  if (a.length === 0) return b;
  return a.map(([le, n], i) => [le, n + (b[i]?.[1] ?? 0)]);
}

/**
 * The q-quantile of per-bucket samples: the bucket it falls in and a linear guess inside it (ms).
 * `within(bound)`: whether at least q of the samples are at or under `bound` (s), exactly.
 */
export function bucketQuantile(
  buckets: Array<[number, number]>,
  q: number,
): { n: number; ms: number; upperMs: number; within: (bound: number) => boolean } {
  const n = buckets.reduce((a, [, c]) => a + c, 0);
  const target = q * n;
  let cum = 0;
  let lower = 0;
  let found = { ms: NaN, upperMs: NaN };
  for (const [le, c] of buckets) {
    if (cum + c >= target && c > 0) {
      found =
        le === Infinity
          ? { ms: Infinity, upperMs: Infinity }
          : { ms: (lower + ((le - lower) * (target - cum)) / c) * 1000, upperMs: le * 1000 };
      break;
    }
    cum += c;
    lower = le;
  }
  const within = (bound: number) => buckets.filter(([le]) => le <= bound).reduce((a, [, c]) => a + c, 0) >= target;
  return { n, ...found, within };
}

/**
 * Watches the agent (through its harness; `pid`: its own process, if any) from now until `stop()`:
 * its event-loop delay histogram (read before and after: the increase is this window's) and
 * /healthz GET every HEALTH_POLL_MS on its socket, each on a new connection as a probe makes it,
 * the next one HEALTH_POLL_MS after the last one's start (or at once when that took longer).
 */
export async function watchAgent(h: AgentHarness, pid: number | undefined): Promise<{ stop(): Promise<AgentSeen> }> {
  const loop0 = histogramBuckets((await h.get('/metrics')).body, LOOP_METRIC);
  if (loop0.length === 0) throw new Error(`the agent exports no ${LOOP_METRIC}`);
  const sched0 = mainThreadSched(pid);
  const t0 = performance.now();
  const health: number[] = [];
  let healthFailures = 0;
  let stopped = false;
  const polling = (async () => {
    while (!stopped) {
      const t0 = performance.now();
      try {
        const r = await h.get('/healthz');
        health.push(performance.now() - t0);
        if (r.status !== 200) healthFailures++;
      } catch {
        healthFailures++;
      }
      const wait = t0 + HEALTH_POLL_MS - performance.now();
      if (wait > 0) await sleep(wait);
    }
  })();
  return {
    stop: async () => {
      stopped = true;
      const sched1 = mainThreadSched(pid);
      const windowMs = performance.now() - t0;
      await polling;
      const loop1 = histogramBuckets((await h.get('/metrics')).body, LOOP_METRIC);
      const mainThread =
        sched0 && sched1 ? { runMs: (sched1.run - sched0.run) / 1e6, waitMs: (sched1.wait - sched0.wait) / 1e6, windowMs } : undefined;
      return { loop: bucketDelta(loop0, loop1), health, healthFailures, ...(mainThread ? { mainThread } : {}) };
    },
  };
}
