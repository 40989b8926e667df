/**
 * The forwarding overhead (bench/cni.ts --only overhead): what the installed CNI binary adds per
 * call to the same call POSTed straight to the agent's socket, from this process and from a lean
 * `sh` loop; its table and goal.
 */
import { execa } from 'execa';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { mean } from '../../test/kit/bench-kit.js';
import { postCni } from '../../test/kit/agent-harness.js';
import { cniArgs } from '../../test/kit/test-pod.js';
import type { CniBench } from './bench.js';
import { GOAL_OVERHEAD_MS, goal, ms, stats, type Options, type Stats } from './common.js';

export interface Overhead {
  label: string;
  /** Per call through the binary exec'd from this process, POSTed from this process, /bin/true exec'd from this process. */
  bin: Stats;
  post: Stats;
  floor: Stats;
  /** Median of (binary − POST) over neighbouring pairs. */
  pairedOverhead: number;
  /** Mean per call of the binary and of /bin/true exec'd from a `sh` loop. */
  shBin: number;
  shFloor: number;
}

/** CHECK and STATUS through the binary against the socket; the table and the goal. */
export async function overheadSection(bench: CniBench, o: Options, goals: string[]): Promise<void> {
  const over = await measureOverhead(bench);
  console.log(`\nforwarding overhead, ms per call (${o.calls} calls each, interleaved)`);
  console.log("from this process: binary = the installed binary exec'd with execa, POST = the same call straight to the socket,");
  console.log("  overhead = median of paired (binary − POST); beyond exec = overhead − /bin/true exec'd the same way");
  console.log('from a sh loop (lean fork/exec, like a Go runtime): mean per call; overhead = sh binary − POST p50');
  console.log(
    'call                   binary p50  POST p50  /bin/true p50  overhead  beyond exec | binary p99  POST p99 | sh: binary  /bin/true  overhead',
  );
  for (const x of over) {
    console.log(
      `${x.label.padEnd(21)}  ${ms(x.bin.p50, 10)}  ${ms(x.post.p50)}  ${ms(x.floor.p50, 13)}  ${ms(x.pairedOverhead)}  ${ms(x.pairedOverhead - x.floor.p50, 11)} | ` +
        `${ms(x.bin.p99, 10)}  ${ms(x.post.p99)} | ${ms(x.shBin, 10)}  ${ms(x.shFloor, 9)}  ${ms(x.shBin - x.post.p50)}`,
    );
  }
  const status = over[1]!;
  const overhead = status.shBin - status.post.p50;
  goals.push(
    goal(
      'forwarding overhead of the installed binary per call',
      `≤ ${GOAL_OVERHEAD_MS} ms`,
      overhead <= GOAL_OVERHEAD_MS,
      `${overhead.toFixed(2)} ms (STATUS exec'd from sh, mean, minus the POST p50; /bin/true alone from sh ${status.shFloor.toFixed(2)})`,
    ),
  );
}

/**
 * What the installed binary adds per call: the same call exec'd through it vs POSTed to the
 * socket from here, interleaved call by call (order rotating); overhead is the median of the
 * paired differences (neighbours in time share the machine's noise). /bin/true exec'd the same
 * way is the floor: what any exec costs from this (large) Node process. The same binary and
 * /bin/true run in a `sh` loop show what the exec costs from a lean exec'er, closer to a Go
 * runtime's fork/exec; those are means (a loop's total over its iterations).
 */
async function measureOverhead(bench: CniBench): Promise<Overhead[]> {
  const p = bench.pod('kubenet', 999, 0);
  await bench.addNetns([p]);
  await bench.publishPods([p]);
  try {
    await bench.add(p);
    const socket = bench.h.config.socket;
    const bin = join(bench.h.config.cniBinDir, 'kubenet');
    const out: Overhead[] = [];
    for (const [label, command, conf] of [
      ['CHECK (pod attached)', 'CHECK', { cniVersion: '1.0.0', name: 'kubenet', type: 'kubenet', socket }],
      ['STATUS', 'STATUS', { cniVersion: '1.1.0', name: 'kubenet', type: 'kubenet', socket }],
    ] as const) {
      const stdin = JSON.stringify(conf);
      const env: Record<string, string> = {
        CNI_COMMAND: command,
        CNI_CONTAINERID: p.id,
        CNI_NETNS: p.netnsPath,
        CNI_IFNAME: 'eth0',
        CNI_ARGS: cniArgs(p),
        CNI_PATH: [bench.h.config.cniBinDir, ...bench.h.config.pluginBinDirs].join(':'),
      };
      const confFile = join(bench.h.root, `bench-${command}.json`);
      await writeFile(confFile, stdin);
      const shLoop = async (exe: string, n: number): Promise<number> => {
        const script = `i=0; while [ $i -lt ${n} ]; do "$1" < "$2" > /dev/null || exit 1; i=$((i+1)); done`;
        const s = performance.now();
        const r = await execa('/bin/sh', ['-c', script, 'sh', exe, confFile], { env, extendEnv: false, reject: false });
        if (r.exitCode !== 0) throw new Error(`sh loop over ${exe} ${command} failed (exit ${r.exitCode}): ${r.stderr}`);
        return (performance.now() - s) / n;
      };
      const runs = {
        bin: async () => {
          const r = await execa(bin, [], { input: stdin, env, extendEnv: false, reject: false });
          if (r.exitCode !== 0) throw new Error(`binary ${command} failed (exit ${r.exitCode}): ${r.stdout} ${r.stderr}`);
        },
        post: async () => {
          const r = await postCni(socket, env, stdin);
          if (r.status !== 200) throw new Error(`POST ${command} failed (${r.status}): ${r.body}`);
        },
        floor: async () => {
          await execa('/bin/true', [], { input: stdin, env, extendEnv: false, reject: false });
        },
      };
      const keys = ['bin', 'post', 'floor'] as const;
      const t: Record<(typeof keys)[number], number[]> = { bin: [], post: [], floor: [] };
      for (let i = 0; i < 10; i++) for (const k of keys) await runs[k](); // warm-up
      for (let i = 0; i < bench.calls; i++) {
        for (let j = 0; j < keys.length; j++) {
          bench.checkAbort();
          const k = keys[(i + j) % keys.length]!;
          const s = performance.now();
          await runs[k]();
          t[k].push(performance.now() - s);
        }
      }
      // Lean exec'er: blocks of 10 calls, binary and /bin/true loops alternating.
      const sh = { bin: [] as number[], floor: [] as number[] };
      const blocks = Math.max(1, Math.round(bench.calls / 10));
      for (let b = 0; b < blocks; b++) {
        bench.checkAbort();
        for (const k of b % 2 === 0 ? (['bin', 'floor'] as const) : (['floor', 'bin'] as const)) {
          sh[k].push(await shLoop(k === 'bin' ? bin : '/bin/true', 10));
        }
      }
      out.push({
        label,
        bin: stats(t.bin),
        post: stats(t.post),
        floor: stats(t.floor),
        pairedOverhead: stats(t.bin.map((x, i) => x - (t.post[i] ?? NaN))).p50,
        shBin: mean(sh.bin),
        shFloor: mean(sh.floor),
      });
    }
    return out;
  } finally {
    if (bench.liveNetns.has(p.netns)) {
      await bench.libcni('del', p).catch(() => undefined);
      await bench.delNetns([p.netns]);
    }
    bench.unpublishPods([p]);
  }
}
