/**
 * The outside client (bench/cni.ts --only outside, issue 32): what an independent libcni client
 * that runs one process per call sees, against a fresh agent on a quiet node; per repetition and
 * pooled, and its goal.
 */
import { execa } from 'execa';
import { mkdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { median } from '../../test/kit/bench-kit.js';
import { LIBCNI_DRIVER, libcniCallArgs } from '../../test/kit/agent-harness.js';
import type { CniBench } from './bench.js';
import {
  GOAL_ADD_RATIO,
  goal,
  load,
  ms,
  OUTSIDE_RATE,
  shq,
  stats,
  type Mode,
  type Op,
  type Options,
  type Pod,
  type Side,
} from './common.js';

/** One repetition of the outside client: per side, each ADD's and DEL's time in call order. */
export interface OutsideRep {
  first: Side;
  /** The libcni call's own time (the driver's clock) and the driver process's wall from a bash client. */
  call: Record<Side, Record<Op, number[]>>;
  wall: Record<Side, Record<Op, number[]>>;
}

/** `o.outsideReps` repetitions of the outside client, which side goes first alternating; its table and goal. */
export async function outsideSection(bench: CniBench, o: Options, goals: string[]): Promise<void> {
  const mode = bench.mode;
  const reps: OutsideRep[] = [];
  for (let rep = 0; rep < o.outsideReps; rep++) {
    const t = performance.now();
    reps.push(await outside(bench, rep, o.pods, rep % 2 === 0 ? 'kubenet' : 'reference'));
    console.log(`outside client ${rep + 1}: ${((performance.now() - t) / 1000).toFixed(1)} s, load ${load()}`);
  }
  outsideReport(mode, reps, o, goals);
}

/**
 * The outside client of issue 32: an independent libcni client that runs one process per call
 * on a quiet machine. A bash process (a lean fork/exec, nothing of this Node process in the way)
 * runs one libcni-driver process per call, one call at a time: `n` ADDs then `n` DELs of one
 * side, then of the other (`first` first), limits OUTSIDE_RATE both ways; nothing else runs
 * between the calls (no metrics read, no settling). The agent is started afresh before, so its
 * first pods are the first calls it serves, as after a node's boot or an agent upgrade.
 * Per call: the libcni call's own time (the driver's clock) and the driver process's wall
 * ($EPOCHREALTIME around its exec in bash).
 */
async function outside(bench: CniBench, rep: number, n: number, first: Side): Promise<OutsideRep> {
  await bench.restartAgent();
  const sides: Side[] = first === 'kubenet' ? ['kubenet', 'reference'] : ['reference', 'kubenet'];
  const pods: Record<Side, Pod[]> = {
    kubenet: Array.from({ length: n }, (_, i) => ({ ...bench.pod('kubenet', 300 + rep, i), rate: OUTSIDE_RATE })),
    reference: Array.from({ length: n }, (_, i) => ({ ...bench.pod('reference', 300 + rep, i), rate: OUTSIDE_RATE })),
  };
  const all = [...pods.kubenet, ...pods.reference];
  const dir = join(bench.refRoot, `outside-${rep}`);
  await mkdir(dir, { recursive: true });
  const lines: string[] = [];
  for (const side of sides) {
    for (const op of ['ADD', 'DEL'] as const) {
      for (const [i, p] of pods[side].entries()) {
        const args = [...libcniCallArgs(bench.libcniDirs(side), bench.request(op === 'ADD' ? 'add' : 'del', p)), '--report-time'];
        lines.push(`call ${side} ${op} ${i} ${[LIBCNI_DRIVER, ...args].map(shq).join(' ')}`);
      }
    }
  }
  const script = [
    'd=$1',
    'call() {',
    '  local side=$1 op=$2 i=$3 s e rc ms= line; shift 3',
    '  s=$EPOCHREALTIME',
    '  "$@" > "$d/$side-$op-$i.out" 2> "$d/err"; rc=$?',
    '  e=$EPOCHREALTIME',
    // biome-ignore lint/suspicious/noTemplateCurlyInString: shell parameter expansions, not a template
    '  while IFS= read -r line; do case $line in "libcni-driver: libcni call "*) ms=${line#libcni-driver: libcni call }; ms=${ms% ms};; esac; done < "$d/err"',
    '  if [ $rc -ne 0 ] || [ -z "$ms" ]; then echo "fail $side $op $i rc=$rc $(tr "\\n" " " < "$d/err")"; exit 1; fi',
    '  echo "ok $side $op $i $s $e $ms"',
    '}',
    ...lines,
  ].join('\n');
  const call = { kubenet: { ADD: [] as number[], DEL: [] as number[] }, reference: { ADD: [] as number[], DEL: [] as number[] } };
  const wall = { kubenet: { ADD: [] as number[], DEL: [] as number[] }, reference: { ADD: [] as number[], DEL: [] as number[] } };
  try {
    await bench.addNetns(all);
    await bench.publishPods(all);
    bench.trackRefPods(pods.reference, true);
    bench.checkAbort();
    // stdin not a socket: bash would take itself for an rshd's child and read ~/.bashrc.
    const r = await execa('bash', ['-c', script, 'bash', dir], { reject: false, stdin: 'ignore', env: { LC_ALL: 'C' } });
    for (const line of r.stdout.split('\n')) {
      const [status, side, op, , s0, e0, callMs] = line.split(' ') as [string, Side, Op, string, string, string, string];
      if (status !== 'ok') continue;
      call[side][op].push(Number(callMs));
      wall[side][op].push((Number(e0) - Number(s0)) * 1000);
    }
    for (let i = 0; i < call.reference.ADD.length; i++)
      bench.noteIfbs(await readFile(join(dir, `reference-ADD-${i}.out`), 'utf8').catch(() => ''));
    if (r.exitCode !== 0)
      throw new Error(`outside client, rep ${rep + 1}: ${r.stdout.split('\n').find((l) => l.startsWith('fail')) ?? r.stderr}`);
    bench.trackRefPods(pods.reference, false);
    await bench.settle();
    bench.unpublishPods(all);
    return { first, call, wall };
  } finally {
    await bench.dropNetns(all);
  }
}

/** The outside client's figures (per repetition and pooled) and its goal. */
function outsideReport(mode: Mode, reps: OutsideRep[], o: Options, goals: string[]): void {
  console.log(
    `\noutside client (${mode} mode): a bash client, one libcni-driver process per call, ${o.pods} pods per side, ${OUTSIDE_RATE / 1e6}M both ways, the agent started afresh before each repetition; ms`,
  );
  console.log('rep  first      side       op   libcni call p50   p99 | first 3 calls           | rest p50 | process wall p50');
  const pooled = { kubenet: [] as number[], reference: [] as number[] };
  const pooledWall = { kubenet: [] as number[], reference: [] as number[] };
  const ratios: string[] = [];
  for (const [i, r] of reps.entries()) {
    for (const side of ['kubenet', 'reference'] as const) {
      for (const op of ['ADD', 'DEL'] as const) {
        const xs = r.call[side][op];
        const s = stats(xs);
        console.log(
          `${String(i + 1).padStart(3)}  ${r.first.padEnd(9)}  ${side.padEnd(9)}  ${op}  ${ms(s.p50, 17)}  ${ms(s.p99, 5)} | ${xs
            .slice(0, 3)
            .map((x) => x.toFixed(1))
            .join(' ')
            .padEnd(22)} | ${ms(median(xs.slice(3)), 8)} | ${ms(median(r.wall[side][op]), 16)}`,
        );
      }
      pooled[side].push(...r.call[side].ADD);
      pooledWall[side].push(...r.wall[side].ADD);
    }
    ratios.push((median(r.call.kubenet.ADD) / median(r.call.reference.ADD)).toFixed(3));
  }
  const k = median(pooled.kubenet);
  const ref = median(pooled.reference);
  const kw = median(pooledWall.kubenet);
  const rw = median(pooledWall.reference);
  // Which side went first matters (docs/pod.md, "What an outside client sees"): each order pooled.
  const byOrder = (['kubenet', 'reference'] as const).flatMap((first) => {
    const rs = reps.filter((r) => r.first === first);
    if (rs.length === 0) return [];
    const kk = median(rs.flatMap((r) => r.call.kubenet.ADD));
    const rr = median(rs.flatMap((r) => r.call.reference.ADD));
    return [`${first} first ${(kk / rr).toFixed(3)} × (${kk.toFixed(2)} vs ${rr.toFixed(2)})`];
  });
  console.log(`ADD p50 by order: ${byOrder.join('; ')}`);
  goals.push(
    goal(
      `ADD p50 against the reference as an outside client sees it (a libcni process per call, fresh agent, ${o.pods} pods per side, ${OUTSIDE_RATE / 1e6}M)`,
      `≤ ${GOAL_ADD_RATIO} ×`,
      k / ref <= GOAL_ADD_RATIO,
      `${(k / ref).toFixed(3)} × (libcni call ${k.toFixed(2)} vs ${ref.toFixed(2)} ms, p50 of ${pooled.kubenet.length} each; per repetition ${ratios.join(', ')}; ${byOrder.join('; ')}; process wall ${kw.toFixed(2)} vs ${rw.toFixed(2)} ms: ${(kw / rw).toFixed(3)} ×)`,
    ),
  );
}
