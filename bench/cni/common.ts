/** What bench/cni.ts's sections share: the setup's constants and goals, the pod and call types, the options, small helpers. */
import { execa } from 'execa';
import { loadavg } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { summary, type Summary } from '../../test/kit/bench-kit.js';
import type { TestPod } from '../../test/kit/test-pod.js';
import { REF_PLUGINS_DIR } from '../../test/kit/upstream.js';

export const ROOT = fileURLToPath(new URL('../..', import.meta.url));
/** The `kubenet` command as package.json's bin ships it. */
export const DIST_MAIN = join(ROOT, 'dist/src/cli/main.js');
export const REF_BIN_DIR = REF_PLUGINS_DIR;
export const REF_PLUGINS = ['bridge', 'host-local', 'bandwidth'];
/** 100 Mbit/s both ways; bursts as containerd 1.6 passes them when the pod sets none. */
export const RATE = 100_000_000;
export const bandwidthConfig = (rate: number) => ({
  bandwidth: { ingressRate: rate, ingressBurst: 4294967295, egressRate: rate, egressBurst: 4294967295 },
});
export const RUNTIME_CONFIG = bandwidthConfig(RATE);
/** The same limits as pod annotations (cluster mode). */
export const annotationsOf = (rate: number) => ({
  'kubernetes.io/ingress-bandwidth': `${rate / 1e6}M`,
  'kubernetes.io/egress-bandwidth': `${rate / 1e6}M`,
});
export const ANNOTATIONS = annotationsOf(RATE);
/** The outside client's limits (issue 32): 10 Mbit/s both ways. */
export const OUTSIDE_RATE = 10_000_000;
export const NODE_NAME = 'kbench-node';
export const POD_GET = /^\/api\/v1\/namespaces\/[^/]+\/pods\/[^/]+$/;

// Goals of issue 10, tightened by issue 22 (own time 1.5 -> 1.0 ms, ADD 0.9 -> 0.85x).
export const GOAL_AGENT_OWN_MS = 1.0;
export const GOAL_ADD_RATIO = 0.85;
export const GOAL_DEL_RATIO = 0.3;
export const GOAL_BURST_RATIO = 0.75;
export const GOAL_RSS_MB = 100;
export const GOAL_RSS_GROWTH = 0.05;
export const GOAL_OVERHEAD_MS = 1;
// Issue 32: the agent never blocks.
export const GOAL_LOOP_P99_MS = 10;
export const GOAL_HEALTH_P99_MS = 20;
export const SOAK_CONCURRENCY = 4;

export type Side = 'kubenet' | 'reference';
/** How the burst's runtime calls libcni: in one process (batch, as containerd), or a driver process per call (exec). */
export type BurstRuntime = 'batch' | 'exec';
export type Mode = 'static' | 'cluster';
export type AgentMode = 'process' | 'in-process';
export type Op = 'ADD' | 'DEL';

/** A test pod, which side of the comparison sets it up, and its limits both ways (bits/s; default RATE). */
export type Pod = TestPod & { side: Side | 'floor'; rate?: number };
/** The bench's sections, each of which can run alone (`--only`). */
export const SECTIONS = ['outside', 'rounds', 'burst', 'overhead', 'soak'] as const;
export type Section = (typeof SECTIONS)[number];

export interface Call {
  exitCode: number;
  stdout: string;
  stderr: string;
  /** The libcni call's own time, as the driver measured it (a runtime linking libcni sees this). */
  ms: number;
  /** The driver process's wall time from this process: its start, the config's loading and the call. */
  wallMs: number;
}

export class Interrupted extends Error {}

export interface Options {
  pods: number;
  rounds: number;
  calls: number;
  burst: number;
  concurrency: number;
  burstReps: number;
  outsideReps: number;
  soak: number;
  agentMode: AgentMode;
  burstRuntime: BurstRuntime;
  sections: Set<Section>;
}

// ---------------------------------------------------------------------------------------------
// statistics and printing

export type Stats = Summary;
export const stats = (xs: number[]): Stats => summary(xs);
export const ms = (x: number, w = 8) => x.toFixed(2).padStart(w);
export const verdict = (ok: boolean) => (ok ? 'PASS' : 'MISS');
/** A goal line as DESIGN's bench contract has it: `goal <what> (<threshold>): PASS|MISS <figures>`. */
export const goal = (what: string, threshold: string, ok: boolean, figures: string) =>
  `goal ${what} (${threshold}): ${verdict(ok)} ${figures}`;
export const sleep = (msec: number) => new Promise<void>((r) => setTimeout(r, msec));
/** A word for a POSIX shell, single-quoted. */
export const shq = (w: string) => `'${w.replace(/'/g, `'\\''`)}'`;
export const load = () =>
  loadavg()
    .map((x) => x.toFixed(2))
    .join(' ');

/** Runs `jobs` with at most `n` at a time; every job runs, the first failure is rethrown at the end. */
export async function pool<T>(n: number, jobs: Array<() => Promise<T>>): Promise<T[]> {
  const out: T[] = [];
  let next = 0;
  let failure: unknown;
  const worker = async () => {
    while (next < jobs.length) {
      const i = next++;
      try {
        out[i] = await (jobs[i] as () => Promise<T>)();
      } catch (err) {
        failure ??= err;
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(n, jobs.length) }, worker));
  if (failure !== undefined) throw failure;
  return out;
}

/** A label-less sample from Prometheus text exposition; NaN when the metric is absent. */
export function metricValue(text: string, metric: string): number {
  return Number(new RegExp(`^${metric} ([0-9.e+-]+)$`, 'm').exec(text)?.[1] ?? NaN);
}

export async function linkNames(): Promise<string[]> {
  const r = await execa('ip', ['-j', 'link', 'show'], { reject: false });
  return (JSON.parse(r.stdout || '[]') as Array<{ ifname: string }>).map((l) => l.ifname);
}
