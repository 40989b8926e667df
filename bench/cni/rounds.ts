/**
 * The sequential rounds (bench/cni.ts --only rounds): per pod the kubenet ADD, the reference ADD
 * and the floor's bridge exec one after the other, the order rotating pod by pod, then the DELs
 * likewise; a warm-up round first (which also checks both sides shape). Latency per side, the
 * agent's own time per call, and the goals they judge.
 */
import { execa } from 'execa';
import { performance } from 'node:perf_hooks';
import { median } from '../../test/kit/bench-kit.js';
import type { CniBench } from './bench.js';
import {
  GOAL_ADD_RATIO,
  GOAL_AGENT_OWN_MS,
  GOAL_DEL_RATIO,
  goal,
  load,
  ms,
  RATE,
  stats,
  type Mode,
  type Op,
  type Options,
  type Pod,
  type Stats,
} from './common.js';

export interface RoundSamples {
  kubenet: Record<Op, number[]>;
  reference: Record<Op, number[]>;
  agent: Record<Op, number[]>;
  floor: Record<Op, number[]>;
  /** The libcni driver process's wall time per call, as ADD and DEL were measured up to issue 22. */
  wall: { kubenet: Record<Op, number[]>; reference: Record<Op, number[]> };
  podGets: number;
  addsInWatch: number;
}

/** The warm-up round, `o.rounds` counted rounds, their table and goals. */
export async function roundsSection(bench: CniBench, o: Options, goals: string[]): Promise<void> {
  const mode = bench.mode;
  const samples: RoundSamples = {
    kubenet: { ADD: [], DEL: [] },
    reference: { ADD: [], DEL: [] },
    agent: { ADD: [], DEL: [] },
    floor: { ADD: [], DEL: [] },
    wall: { kubenet: { ADD: [], DEL: [] }, reference: { ADD: [], DEL: [] } },
    podGets: 0,
    addsInWatch: 0,
  };
  let t = performance.now();
  const verified = await round(bench, 0, undefined);
  console.log(`warm-up round: ${((performance.now() - t) / 1000).toFixed(1)} s; shaping checked on the first pod: ${verified}`);
  for (let r = 1; r <= o.rounds; r++) {
    t = performance.now();
    await round(bench, r, samples);
    console.log(`round ${r}: ${((performance.now() - t) / 1000).toFixed(1)} s, load ${load()}`);
  }
  roundsReport(mode, samples, await bench.agentRssMb(), goals);
}

/**
 * Both sides must really shape, or the comparison is unfair: the agent reports the pod's limits,
 * and the reference bandwidth plugin made its ifb with a tbf on it. Untimed; warm-up round only.
 */
async function verifyShaping(bench: CniBench, k: Pod, r: Pod, refAddStdout: string): Promise<string> {
  const status = JSON.parse((await bench.h.get('/v1/status')).body) as { pods: Array<{ id: string; limits: Record<string, number> }> };
  const limits = status.pods.find((p) => p.id === k.id)?.limits;
  if (limits?.ingress !== RATE || limits?.egress !== RATE)
    throw new Error(`kubenet pod ${k.name} is not shaped as asked: ${JSON.stringify(limits)}`);
  const ifb = (JSON.parse(refAddStdout) as { interfaces?: Array<{ name?: string }> }).interfaces?.find((i) =>
    i.name?.startsWith('bwp'),
  )?.name;
  if (!ifb) throw new Error(`reference pod ${r.name}: the bandwidth plugin reported no ifb: ${refAddStdout}`);
  const tc = (await execa('tc', ['qdisc', 'show', 'dev', ifb], { reject: false })).stdout;
  if (!/\btbf\b/.test(tc)) throw new Error(`reference pod ${r.name}: no tbf on ${ifb}: ${tc}`);
  return `kubenet limits ${JSON.stringify(limits)}${bench.mode === 'cluster' ? ' (from the annotations)' : ''}; reference ifb ${ifb} with tbf`;
}

/**
 * One round: pods set up one at a time, kubenet, reference and floor interleaved with the order
 * rotating; then torn down the same way. Samples: libcni wall times per side, the agent's own
 * time per kubenet call, the floor's bridge exec.
 */
async function round(bench: CniBench, r: number, samples: RoundSamples | undefined): Promise<string> {
  const triples = Array.from(
    { length: bench.pods },
    (_, i) => [bench.pod('kubenet', r, i), bench.pod('reference', r, i), bench.pod('floor', r, i)] as const,
  );
  const order = (i: number, t: readonly [Pod, Pod, Pod]) => [0, 1, 2].map((j) => t[(i + r + j) % 3] as Pod);
  const all = triples.flat();
  let verified = '';
  try {
    await bench.addNetns(all);
    await bench.publishPods(all);
    await bench.resetCallTimes();
    const getsBefore = bench.podGets();
    for (const [i, t] of triples.entries()) {
      for (const p of order(i, t)) {
        bench.checkAbort();
        const { ms, wallMs } = await bench.add(p);
        if (p.side === 'kubenet') {
          const own = await bench.agentCallMs('ADD');
          samples?.agent.ADD.push(own);
        }
        if (p.side === 'floor') samples?.floor.ADD.push(ms);
        else {
          samples?.[p.side].ADD.push(ms);
          samples?.wall[p.side].ADD.push(wallMs ?? NaN);
        }
      }
      if (!samples && i === 0) verified = await verifyShaping(bench, t[0], t[1], bench.lastRefAdd);
    }
    if (samples) {
      samples.podGets += bench.podGets() - getsBefore;
      samples.addsInWatch += bench.api ? triples.length : 0;
    }
    for (const [i, t] of triples.entries()) {
      for (const p of order(i, t)) {
        bench.checkAbort();
        const { ms, wallMs } = await bench.del(p);
        if (p.side === 'kubenet') {
          const own = await bench.agentCallMs('DEL');
          samples?.agent.DEL.push(own);
          await bench.settle();
        }
        if (p.side === 'floor') samples?.floor.DEL.push(ms);
        else {
          samples?.[p.side].DEL.push(ms);
          samples?.wall[p.side].DEL.push(wallMs ?? NaN);
        }
      }
    }
    bench.unpublishPods(all);
    return verified;
  } finally {
    await bench.dropNetns(all);
  }
}

/** The sequential rounds' figures (latency, the agent's own time) and the goals they judge. */
function roundsReport(mode: Mode, samples: RoundSamples, rssMb: number, goals: string[]): void {
  const st = {
    kubenet: { ADD: stats(samples.kubenet.ADD), DEL: stats(samples.kubenet.DEL) },
    reference: { ADD: stats(samples.reference.ADD), DEL: stats(samples.reference.DEL) },
  };
  const agent = { ADD: stats(samples.agent.ADD), DEL: stats(samples.agent.DEL) };
  const floor = { ADD: stats(samples.floor.ADD), DEL: stats(samples.floor.DEL) };
  console.log(
    `\nlatency per call, ms (${mode} mode; kubenet/reference: the libcni call, as a runtime linking libcni sees it; agent: its own handling of the call; floor: bridge exec'd by bash)`,
  );
  console.log('side        op      n       p50       p99       min      mean       max');
  const row = (label: string, op: Op, s: Stats) =>
    console.log(
      `${label.padEnd(10)}  ${op}  ${String(s.n).padStart(5)}  ${ms(s.p50)}  ${ms(s.p99)}  ${ms(s.min)}  ${ms(s.mean)}  ${ms(s.max)}`,
    );
  for (const op of ['ADD', 'DEL'] as const) {
    row('kubenet', op, st.kubenet[op]);
    row('reference', op, st.reference[op]);
    console.log(
      `ratio k/r   ${op}         ${(st.kubenet[op].p50 / st.reference[op].p50).toFixed(3).padStart(8)}  ${(st.kubenet[op].p99 / st.reference[op].p99).toFixed(3).padStart(8)}`,
    );
    row('  agent', op, agent[op]);
    row('  floor', op, floor[op]);
    console.log(`  outside the agent (libcni, the binary's exec, transport): ${ms(st.kubenet[op].p50 - agent[op].p50, 0)} ms at p50`);
  }
  console.log(`agent RSS after the rounds ${rssMb.toFixed(0)} MB`);
  const own = agent.ADD.p50 - floor.ADD.p50;
  goals.push(
    goal(
      `agent's own time per ADD beyond the bridge exec, p50`,
      `≤ ${GOAL_AGENT_OWN_MS} ms`,
      own <= GOAL_AGENT_OWN_MS,
      `${own.toFixed(2)} ms (agent ${agent.ADD.p50.toFixed(2)} − bridge from bash ${floor.ADD.p50.toFixed(2)}, p50s of ${agent.ADD.n} calls each)`,
    ),
  );
  // The driver process's wall (its Go runtime's start, a fork of this process, the config's
  // loading) as ADD and DEL were measured up to issue 22: printed beside, both sides pay it.
  const wallText = (op: Op) => {
    const k = median(samples.wall.kubenet[op]);
    const r = median(samples.wall.reference[op]);
    return `driver process wall ${k.toFixed(2)} vs ${r.toFixed(2)} ms: ${(k / r).toFixed(3)} ×`;
  };
  for (const [op, limit] of [
    ['ADD', GOAL_ADD_RATIO],
    ['DEL', GOAL_DEL_RATIO],
  ] as const) {
    const ratio = st.kubenet[op].p50 / st.reference[op].p50;
    goals.push(
      goal(
        `${op} p50 against the reference, sequential rounds`,
        `≤ ${limit} ×`,
        ratio <= limit,
        `${ratio.toFixed(3)} × (libcni call ${st.kubenet[op].p50.toFixed(2)} vs ${st.reference[op].p50.toFixed(2)} ms; ${wallText(op)})`,
      ),
    );
  }
  if (mode === 'cluster') {
    goals.push(
      goal(
        'no ADD waits on the API server for a pod already in the watch',
        '0 pod GETs',
        samples.podGets === 0,
        `${samples.podGets} pod GETs during ${samples.addsInWatch} ADDs of pods delivered on the watch`,
      ),
    );
  }
}
