/**
 * The burst (bench/cni.ts --only burst): `--burst` pods added then deleted `--concurrency` at a
 * time through libcni, kubenet and reference one after the other; wall time and CPU of each side,
 * and during each kubenet burst the agent's event-loop delay and /healthz answers; their goals.
 */
import { performance } from 'node:perf_hooks';
import { median } from '../../test/kit/bench-kit.js';
import { libcniBatch } from '../../test/kit/agent-harness.js';
import { addBuckets, bucketQuantile, HEALTH_POLL_MS, watchAgent, type AgentSeen } from './agent-watch.js';
import type { CniBench } from './bench.js';
import {
  GOAL_BURST_RATIO,
  GOAL_HEALTH_P99_MS,
  GOAL_LOOP_P99_MS,
  goal,
  load,
  ms,
  pool,
  stats,
  type BurstRuntime,
  type Options,
  type Pod,
  type Side,
} from './common.js';
import { agentTreeCpu, procCpu, type BurstCpu } from './cpu.js';

export interface BurstRep {
  side: Side;
  addMs: number;
  delMs: number;
  totalMs: number;
  /**
   * CPU time (ms) over the whole burst, and over its ADDs alone (the DELs' is the difference): this
   * process's children (libcni drivers and what they ran), the agent's own, the agent's helpers and
   * what they ran (spawner + plugins, tc).
   */
  cpu: BurstCpu;
  addCpu: BurstCpu;
  /** Kubenet side: what the agent's event loop and its /healthz did over the burst. */
  agentSeen?: AgentSeen;
}

/** `o.burstReps` bursts per side, which side goes first alternating; a line per burst, then the goals. */
export async function burstSection(bench: CniBench, o: Options, goals: string[]): Promise<void> {
  const burst: BurstRep[] = [];
  for (let rep = 0; rep < o.burstReps; rep++) {
    for (const side of rep % 2 === 0 ? (['kubenet', 'reference'] as const) : (['reference', 'kubenet'] as const)) {
      bench.checkAbort();
      const b = await oneBurst(bench, side, rep, o.burst, o.concurrency, o.burstRuntime);
      burst.push(b);
      // CPU (ms) as "whole burst (of it the ADDs)".
      const both = (k: keyof BurstCpu) => `${b.cpu[k]} (${b.addCpu[k]})`;
      const cpu =
        side === 'kubenet' && o.agentMode === 'process'
          ? `, CPU ms (ADDs' share): runtime side ${both('runtime')}, agent ${both('agent')}, its spawner+plugins+tc ${both('helpers')}`
          : `, CPU ms (ADDs' share): runtime side (libcni + plugins) ${both('runtime')}`;
      const seen = b.agentSeen;
      const agent = seen
        ? `; agent event loop p99 ~${bucketQuantile(seen.loop, 0.99).ms.toFixed(1)} ms, /healthz p50 ${stats(seen.health).p50.toFixed(1)} p99 ${stats(seen.health).p99.toFixed(1)} max ${stats(seen.health).max.toFixed(1)} ms (${seen.health.length} GETs, ${seen.healthFailures} failed)` +
          (seen.mainThread
            ? `, its main thread ran ${seen.mainThread.runMs.toFixed(0)} ms and waited for a CPU ${seen.mainThread.waitMs.toFixed(0)} ms of ${seen.mainThread.windowMs.toFixed(0)}`
            : '')
        : '';
      console.log(
        `burst ${rep + 1} ${side.padEnd(9)}: ${o.burst} ADDs ${ms(b.addMs, 0)} ms + ${o.burst} DELs ${ms(b.delMs, 0)} ms = ${ms(b.totalMs, 0)} ms (${o.concurrency} at a time, ${o.burstRuntime === 'batch' ? 'one runtime process' : 'a driver process per call'})${cpu}${agent}, load ${load()}`,
      );
    }
  }
  burstReport(burst, o, goals);
}

/** `n` pods added `concurrency` at a time, then deleted likewise, on one side; wall times. */
async function oneBurst(
  bench: CniBench,
  side: Side,
  rep: number,
  n: number,
  concurrency: number,
  runtime: BurstRuntime,
): Promise<BurstRep> {
  const agentPid = bench.agentProc?.pid;
  const sample = (): BurstCpu => ({ runtime: procCpu('self').reaped, ...(agentPid ? agentTreeCpu(agentPid) : { agent: 0, helpers: 0 }) });
  const since = (a: BurstCpu, b: BurstCpu): BurstCpu => ({
    runtime: b.runtime - a.runtime,
    agent: b.agent - a.agent,
    helpers: b.helpers - a.helpers,
  });
  const pods = Array.from({ length: n }, (_, i) => bench.pod(side, 500 + rep, i));
  try {
    await bench.addNetns(pods);
    await bench.publishPods(pods);
    const watch = side === 'kubenet' ? await watchAgent(bench.h, agentPid) : undefined;
    const cpu0 = sample();
    let addMs: number;
    let delMs: number;
    let cpuAdded: BurstCpu;
    if (runtime === 'batch') {
      addMs = await batch(bench, 'add', pods, concurrency);
      cpuAdded = sample();
      delMs = await batch(bench, 'del', pods, concurrency);
    } else {
      const t0 = performance.now();
      await pool(
        concurrency,
        pods.map((p) => () => bench.add(p)),
      );
      cpuAdded = sample();
      const t1 = performance.now();
      await pool(
        concurrency,
        pods.map((p) => () => bench.del(p)),
      );
      addMs = t1 - t0;
      delMs = performance.now() - t1;
    }
    const cpu1 = sample();
    const agentSeen = await watch?.stop();
    if (side === 'kubenet') await bench.settle();
    bench.unpublishPods(pods);
    return {
      side,
      addMs,
      delMs,
      totalMs: addMs + delMs,
      cpu: since(cpu0, cpu1),
      addCpu: since(cpu0, cpuAdded),
      ...(agentSeen ? { agentSeen } : {}),
    };
  } finally {
    await bench.dropNetns(pods);
  }
}

/**
 * `cmd` of every pod through one libcni-driver process (`batch`), `concurrency` at a time, as
 * containerd calls libcni in-process; the wall time the driver measured from its first call's
 * start to its last call's end (ms).
 */
async function batch(bench: CniBench, cmd: 'add' | 'del', pods: Pod[], concurrency: number): Promise<number> {
  const side = pods[0]?.side;
  if (!side || side === 'floor' || pods.some((p) => p.side !== side)) throw new Error('batch: pods of one libcni side');
  const dirs = bench.libcniDirs(side);
  const requests = pods.map((p) => bench.request(cmd, p));
  if (side === 'reference' && cmd === 'add') bench.trackRefPods(pods, true);
  const r = await libcniBatch(dirs, requests, concurrency);
  const answered = r.answers.filter(Boolean);
  const failed = answered.filter((a) => a.error);
  if (r.exitCode !== 0 || answered.length !== pods.length || failed.length > 0) {
    throw new Error(
      `${side} batch ${cmd} failed (exit ${r.exitCode}, ${answered.length}/${pods.length} answered): ${failed[0]?.error ?? r.stderr}`,
    );
  }
  for (const a of answered) {
    if (cmd === 'add') {
      if (!a.result?.ips?.length) throw new Error(`${side} ADD ${pods[a.i]?.name}: result has no IP: ${JSON.stringify(a.result)}`);
      if (side === 'reference') bench.noteIfbs(JSON.stringify(a.result));
    }
  }
  if (side === 'reference' && cmd === 'del') bench.trackRefPods(pods, false);
  if (r.wallMs === undefined) throw new Error(`${side} batch ${cmd}: no wallMs line`);
  return r.wallMs;
}

/** The bursts' figures and goals: wall time against the reference, and the agent's responsiveness meanwhile. */
function burstReport(burst: BurstRep[], o: Options, goals: string[]): void {
  const k = median(burst.filter((b) => b.side === 'kubenet').map((b) => b.totalMs));
  const r = median(burst.filter((b) => b.side === 'reference').map((b) => b.totalMs));
  goals.push(
    goal(
      `${o.burst} pods added then deleted ${o.concurrency} at a time against the reference`,
      `≤ ${GOAL_BURST_RATIO} ×`,
      k / r <= GOAL_BURST_RATIO,
      `${(k / r).toFixed(3)} × (${k.toFixed(0)} vs ${r.toFixed(0)} ms, medians of ${o.burstReps}, ${o.burstRuntime === 'batch' ? 'libcni in one runtime process' : 'a libcni driver process per call'})`,
    ),
  );
  const seen = burst.flatMap((b) => (b.agentSeen ? [b.agentSeen] : []));
  if (seen.length === 0) return;
  const loop = bucketQuantile(
    seen.reduce<Array<[number, number]>>((a, x) => addBuckets(a, x.loop), []),
    0.99,
  );
  const upper = (q: { upperMs: number }) =>
    q.upperMs === Infinity ? `over ${(seen[0]?.loop.at(-2)?.[0] ?? 0) * 1000} ms` : `≤ ${q.upperMs} ms`;
  goals.push(
    goal(
      `event-loop delay p99 during the ${o.burst}-pod bursts`,
      `≤ ${GOAL_LOOP_P99_MS} ms`,
      loop.within(GOAL_LOOP_P99_MS / 1000),
      `~${loop.ms.toFixed(1)} ms (its bucket ${upper(loop)}; ${loop.n} samples of a 10 ms timer over ${seen.length} kubenet bursts, blocked runs counted)`,
    ),
  );
  const health = stats(seen.flatMap((x) => x.health));
  const failures = seen.reduce((a, x) => a + x.healthFailures, 0);
  goals.push(
    goal(
      `/healthz answer p99 during the ${o.burst}-pod bursts`,
      `≤ ${GOAL_HEALTH_P99_MS} ms`,
      health.p99 <= GOAL_HEALTH_P99_MS && failures === 0,
      `${health.p99.toFixed(1)} ms (p50 ${health.p50.toFixed(1)}, max ${health.max.toFixed(1)}, ${health.n} GETs every ${HEALTH_POLL_MS} ms, ${failures} failed)`,
    ),
  );
}
