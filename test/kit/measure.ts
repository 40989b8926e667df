/**
 * Measurements the e2e suites share: an iperf3 rate against its limit, and a ping kept running
 * across a disruption (an agent upgrade) with its loss counted.
 */
import type { ExecutionContext } from 'ava';

const MBIT = 1e6;

/** Logs a measured rate and asserts it: mean within ±10 % of `limit`, no 1 s interval above 1.25 ×. */
export function logRate(t: ExecutionContext, what: string, bps: number, intervals: number[], limit: number): void {
  t.log(
    `${what}: ${(bps / MBIT).toFixed(2)} Mbit/s of ${limit / MBIT} (${((bps / limit) * 100).toFixed(1)} %), 1 s intervals ${intervals.map((i) => (i / MBIT).toFixed(2)).join(' ')}`,
  );
  t.true(bps >= 0.9 * limit && bps <= 1.1 * limit, `${what}: ${bps} within ±10 % of ${limit}`);
  t.true(Math.max(...intervals) <= 1.25 * limit, `${what}: no 1 s interval above 1.25 × ${limit}: ${intervals.join(' ')}`);
}

/**
 * Logs a rate that no limit applies to (an unshaped destination) and asserts it is far above the
 * pod's limit `limit`: at least 5 ×.
 */
export function logUnshaped(t: ExecutionContext, what: string, bps: number, intervals: number[], limit: number): void {
  t.log(
    `${what}: ${(bps / MBIT).toFixed(1)} Mbit/s, not shaped (the pod's limit ${limit / MBIT}M), 1 s intervals ${intervals.map((i) => (i / MBIT).toFixed(0)).join(' ')}`,
  );
  t.true(bps >= 5 * limit, `${what}: ${bps} at least 5 × ${limit}`);
}

/** Runs a command where the ping should run (a node's namespaces); never rejects. */
export type Runner = (cmd: string, args: string[]) => Promise<{ stdout: string }>;

/**
 * Starts `ping -i 0.05` to `target` through `run` (for at most `deadlineS`); `stop()` interrupts it
 * (SIGINT, so ping prints its counts) and returns what it sent and lost.
 */
export function pingThroughout(run: Runner, target: string, deadlineS = 120): { stop: () => Promise<{ sent: number; lost: number }> } {
  const args = ['-i', '0.05', '-w', String(deadlineS), target];
  const pinger = run('ping', args);
  return {
    stop: async () => {
      await run('pkill', ['-INT', '-f', `ping ${args.join(' ')}`]);
      const m = /(\d+) packets transmitted, (\d+) received/.exec((await pinger).stdout);
      const sent = Number(m?.[1] ?? 0);
      return { sent, lost: sent - Number(m?.[2] ?? 0) };
    },
  };
}

/** Asserts a pingThroughout result: it ran (≥ 20 sent) and lost at most 1 s (20 pings of 50 ms). */
export function checkPingLoss(t: ExecutionContext, r: { sent: number; lost: number }): void {
  t.true(r.sent >= 20, `the ping ran (${r.sent} sent)`);
  t.true(r.lost * 50 <= 1000, `at most 1 s of loss: ${r.lost} of ${r.sent} lost`);
}
