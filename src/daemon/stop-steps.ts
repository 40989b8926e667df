/**
 * The agent's orderly stop as a list of named steps, each bounded, the whole within a deadline.
 *
 * The DaemonSet gives the agent 30 s after SIGTERM before the kubelet kills it; a stop that hangs
 * on one part (a watch that will not close, a socket with a client that does not go) must not use
 * that up and be killed with the rest undone. Each step's time goes to the log, so a slow stop
 * says which part was slow.
 */
import type { Logger } from '../log.js';

export interface StopStep {
  /** What is stopped, for the log: "the pod watch". */
  name: string;
  run: () => unknown;
  /** How long the step may take before the stop goes on without it (default 3 s). */
  boundMs?: number;
  /** Being cut at the bound is expected (events still being posted): logged at debug, not warn. */
  cutIsExpected?: boolean;
}

/** The whole stop ends within this (the DaemonSet's grace is 30 s). */
export const STOP_DEADLINE_MS = 25_000;
const DEFAULT_BOUND_MS = 3_000;
/** What a step still gets once the deadline has passed: its synchronous part runs, its waiting is cut short. */
const AFTER_DEADLINE_MS = 100;
/** A step that took longer than this is logged at info. */
const SLOW_MS = 1_000;

/** Runs the steps in order; a step that throws or overruns is logged and the next one runs. */
export async function runStopSteps(log: Logger, steps: readonly StopStep[], deadlineMs = STOP_DEADLINE_MS): Promise<void> {
  const deadline = Date.now() + deadlineMs;
  for (const step of steps) {
    const bound = Math.max(AFTER_DEADLINE_MS, Math.min(step.boundMs ?? DEFAULT_BOUND_MS, deadline - Date.now()));
    const started = Date.now();
    let timer: NodeJS.Timeout | undefined;
    const outcome = await Promise.race([
      Promise.resolve()
        .then(step.run)
        .then(
          () => 'done' as const,
          (err: unknown) => err,
        ),
      new Promise<'cut'>((r) => (timer = setTimeout(() => r('cut'), bound))),
    ]);
    clearTimeout(timer);
    const ms = Date.now() - started;
    if (outcome === 'cut') {
      if (step.cutIsExpected) log.debug({ step: step.name, ms }, `stopping: ${step.name} cut after ${ms} ms`);
      else log.warn({ step: step.name, ms }, `stopping: ${step.name} did not finish in ${ms} ms; going on without it`);
    } else if (outcome !== 'done') {
      log.warn({ step: step.name, ms, err: outcome }, `stopping: ${step.name} failed; going on`);
    } else if (ms >= SLOW_MS) {
      log.info({ step: step.name, ms }, `stopping: ${step.name} took ${ms} ms`);
    } else {
      log.debug({ step: step.name, ms }, `stopping: ${step.name} took ${ms} ms`);
    }
  }
}
