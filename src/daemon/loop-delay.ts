/**
 * The agent's event-loop delay, as a request arriving at any moment would meet it: a timer due every
 * `intervalMs`, and how late each run of it is. A loop blocked for longer than the interval also
 * misses the runs that fell due meanwhile; those are counted too, each as late as it would have been
 * (HdrHistogram's recordValueWithExpectedInterval: the correction for coordinated omission), so one
 * 600 ms block counts as the 60 late runs it stood for, not one sample among thousands.
 * The timer does not keep the process alive.
 */
import { performance } from 'node:perf_hooks';

export const LOOP_DELAY_INTERVAL_MS = 10;

/** Starts watching; `observe` gets each delay in seconds. Returns the function that stops it. */
export function watchEventLoopDelay(observe: (seconds: number) => void, intervalMs = LOOP_DELAY_INTERVAL_MS): () => void {
  let due = performance.now() + intervalMs;
  let timer: NodeJS.Timeout | undefined;
  const tick = () => {
    const now = performance.now();
    const late = Math.max(0, now - due);
    observe(late / 1000);
    for (let missed = late - intervalMs; missed >= intervalMs; missed -= intervalMs) observe(missed / 1000);
    due = now + intervalMs;
    timer = setTimeout(tick, intervalMs);
    timer.unref();
  };
  timer = setTimeout(tick, intervalMs);
  timer.unref();
  return () => clearTimeout(timer);
}
