/**
 * The soak (bench/cni.ts --soak N, cluster mode only): N ADD/DEL cycles POSTed to the agent's
 * socket, 4 at a time, each pod in the API server for its cycle; the agent's RSS and its helpers'
 * over the run, and the goals on them.
 */
import { performance } from 'node:perf_hooks';
import { postCni } from '../../test/kit/agent-harness.js';
import { cniArgs } from '../../test/kit/test-pod.js';
import type { CniBench } from './bench.js';
import { GOAL_RSS_GROWTH, GOAL_RSS_MB, goal, load, pool, SOAK_CONCURRENCY, type Options } from './common.js';

export interface SoakResult {
  cycles: number;
  seconds: number;
  /** mb: the agent process; helpersMb: its child processes (the tc session, the spawner) together. */
  rss: Array<{ cycles: number; mb: number; helpersMb: number }>;
  gets: number;
}

/** `o.soak` cycles and the RSS goals (the caller runs it in cluster mode only). */
export async function soakSection(bench: CniBench, o: Options, goals: string[]): Promise<void> {
  const soak = await runSoak(bench, o.soak);
  const mid = soak.rss.find((x) => x.cycles >= soak.cycles / 2) ?? soak.rss[0]!;
  const end = soak.rss[soak.rss.length - 1]!;
  const growth = (end.mb - mid.mb) / mid.mb;
  goals.push(
    goal(
      `agent RSS after ${soak.cycles} ADD/DEL cycles, and the second half's growth`,
      `≤ ${GOAL_RSS_MB} MB, ≤ ${GOAL_RSS_GROWTH * 100} %`,
      end.mb <= GOAL_RSS_MB && growth <= GOAL_RSS_GROWTH,
      `${end.mb.toFixed(1)} MB, ${mid.cycles} → ${end.cycles} cycles ${growth >= 0 ? '+' : ''}${(growth * 100).toFixed(1)} % ` +
        `(${soak.rss.map((x) => `${x.cycles}: ${x.mb.toFixed(1)}`).join(', ')} MB; ${soak.seconds.toFixed(0)} s; ${soak.gets} pod GETs)`,
    ),
  );
  // The agent's helpers are its memory too: a helper that grows per pod (tc's batch mode did) is the agent growing.
  const tree = Math.max(...soak.rss.map((x) => x.mb + x.helpersMb));
  goals.push(
    goal(
      'the agent with its helpers (tc session, spawner) at every sample',
      `≤ ${GOAL_RSS_MB} MB`,
      tree <= GOAL_RSS_MB,
      `at most ${tree.toFixed(1)} MB (helpers ${soak.rss.map((x) => `${x.cycles}: ${x.helpersMb.toFixed(1)}`).join(', ')} MB)`,
    ),
  );
}

/**
 * `cycles` ADD/DEL cycles POSTed straight to the agent socket (what the CNI binary sends), 4 at
 * a time, each into one of 4 netns that are reused; in cluster mode each pod is created in the API
 * server (annotated, delivered) before its ADD and deleted after its DEL, in batches of 100.
 * The agent's RSS after the first cycle batch, at the half and at the end.
 */
async function runSoak(bench: CniBench, cycles: number): Promise<SoakResult> {
  const socket = bench.h.config.socket;
  const stdin = JSON.stringify({ cniVersion: '1.0.0', name: 'kubenet', type: 'kubenet', socket });
  const slots = Array.from({ length: SOAK_CONCURRENCY }, (_, i) => bench.pod('kubenet', 700, i));
  await bench.addNetns(slots);
  const started = performance.now();
  const gets0 = bench.podGets();
  const rss: SoakResult['rss'] = [];
  const BATCH = 100;
  let done = 0;
  try {
    for (let b = 0; b < cycles; b += BATCH) {
      const n = Math.min(BATCH, cycles - b);
      const pods = Array.from({ length: n }, (_, i) => bench.pod('kubenet', 800, b + i));
      await bench.publishPods(pods);
      const free = [...slots];
      await pool(
        SOAK_CONCURRENCY,
        pods.map((p) => async () => {
          bench.checkAbort();
          const slot = free.pop()!;
          try {
            const env = {
              CNI_CONTAINERID: p.id,
              CNI_NETNS: slot.netnsPath,
              CNI_IFNAME: 'eth0',
              CNI_ARGS: cniArgs(p),
              CNI_PATH: bench.h.config.pluginBinDirs.join(':'),
            };
            const add = await postCni(socket, { CNI_COMMAND: 'ADD', ...env }, stdin);
            if (add.status !== 200) throw new Error(`soak ADD ${p.name} failed (${add.status}): ${add.body}`);
            const del = await postCni(socket, { CNI_COMMAND: 'DEL', ...env }, stdin);
            if (del.status !== 200) throw new Error(`soak DEL ${p.name} failed (${del.status}): ${del.body}`);
          } finally {
            free.push(slot);
          }
          done++;
        }),
      );
      bench.unpublishPods(pods);
      if (b === 0 || done === Math.ceil(cycles / 2 / BATCH) * BATCH || done === cycles) {
        await bench.settle();
        rss.push({ cycles: done, mb: await bench.agentRssMb(), helpersMb: bench.helpersRssMb() });
      }
      if (done % 1000 === 0) {
        const sample = { cycles: done, mb: await bench.agentRssMb(), helpersMb: bench.helpersRssMb() };
        if (!rss.some((x) => x.cycles === done)) rss.push(sample);
        console.log(
          `  soak: ${done} cycles, ${((performance.now() - started) / 1000).toFixed(0)} s, agent RSS ${sample.mb.toFixed(1)} MB, its helpers ${sample.helpersMb.toFixed(1)} MB, load ${load()}`,
        );
      }
    }
  } finally {
    await bench.delNetns(slots.map((p) => p.netns));
  }
  return { cycles: done, seconds: (performance.now() - started) / 1000, rss, gets: bench.podGets() - gets0 };
}
