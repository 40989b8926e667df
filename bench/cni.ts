/**
 * CNI ADD and DEL through the kubenet node agent vs the reference CNI chain (bridge + host-local +
 * bandwidth: the pinned release hack/build-upstream.sh built), both driven the way containerd drives them: through the reference
 * runtime library (libcni, native/build/libcni-driver), the same netns setup and pod identities, and
 * both shaping at 100 Mbit/s each way. Prints the goal lines of issues 10, 22 and 32 as
 * `goal <what> (<threshold>): PASS|MISS <figures>`, per mode:
 *
 * - static:  `kubenet daemon --pod-cidr …` (the embedded default; limits from runtimeConfig, as
 *            containerd passes the pod's annotations).
 * - cluster: `kubenet daemon --kubeconfig …` against a fake API server in this process
 *            (test/kit/fake-apiserver.ts) serving the Node with its pod CIDR and the pods with
 *            their bandwidth annotations; the kubenet side gets NO runtimeConfig, so its limits come
 *            from the annotations in the agent's pod watch (the path a runtime without the bandwidth
 *            capability takes). Every pod is in the API server, and delivered on the agent's watch,
 *            before its ADD; the API server counts the pod GETs made during the ADDs.
 *
 * The agent is the one that ships: `node dist/src/cli/main.js daemon` (compiled first) in a process
 * of its own, on its own bridge/ifb/socket/temp dirs (AgentHarness's config), reached through the
 * conflist it writes and the CNI binary it installs. (`--agent in-process` runs it inside this tsx
 * process instead.)
 *
 * Sequential rounds (latency): per pod, the kubenet ADD, the reference ADD and the floor ADD (the
 * reference bridge plugin alone with the agent's own bridge config, on a bridge of its own, exec'd
 * by a long-lived bash that times it with $EPOCHREALTIME: a lean exec'er) run one after the other,
 * the order rotating pod by pod so machine noise hits all alike; then the DELs likewise. The first
 * round is a warm-up. After each kubenet call (untimed) the bench reads the agent's /metrics: the
 * histogram sum's increase is the agent's own handling time of that call (from the request's
 * arrival on its socket to the answer written), so "agent − floor" is what the agent spends beyond
 * the bridge plugin's exec. After each kubenet DEL it also waits for the agent's veth deletions in
 * flight to reach 0 (the kernel frees a deleted veth in the background; that work must not land on
 * the next call).
 * An ADD's or DEL's time is the libcni call's own, as the driver measures it (`--report-time`): what
 * a runtime that links libcni (containerd, CRI-O) waits for. Each call still runs in a driver
 * process of its own, whose start (a Go runtime, a fork of this Node process) and config loading
 * no runtime pays per call and both sides would share; that process wall, what ADD and DEL were
 * measured by up to issue 22, is printed beside the goal lines.
 *
 * Sections, in this order, each of which runs alone with `--only NAME[,NAME]` (default: all but
 * the soak): outside, rounds, burst, overhead, soak. Each is a module of bench/cni/ (outside.ts,
 * rounds.ts, burst.ts, overhead.ts, soak.ts) driving one mode's CniBench (bench/cni/bench.ts).
 *
 * Outside client (issue 32): what an independent libcni client that runs one process per call sees
 * on a quiet machine. First, while the node is fresh, in `--outside-reps` repetitions (the agent
 * started afresh before each, so its first pods are the first calls it serves): a bash process runs
 * one libcni-driver process per call, one call at a time, `--pods` ADDs then as many DELs of one
 * side, then of the other (which goes first alternates), limits 10 Mbit/s both ways, nothing else
 * between the calls. Per call the libcni call's time (the driver's clock) and the process's wall
 * from bash; the goal takes the libcni calls' p50 over all repetitions.
 *
 * Burst: `--burst` pods (64) added and then deleted `--concurrency` (8) at a time through libcni,
 * kubenet and reference one after the other (order alternating over `--burst-reps` repetitions),
 * total wall time of ADDs + DELs per side. By default (`--burst-runtime batch`) one libcni-driver
 * process makes all the calls of a phase, goroutines `--concurrency` at a time, as containerd calls
 * libcni in-process; its own clock times the phase. `exec` starts a driver process per call from
 * this Node process, as the burst was measured up to issue 22: every call then also pays a Go
 * runtime's start and a fork of this large process (with the drivers, about a third of the CPU of
 * a kubenet burst, measured with perf: docs/pod.md), which no runtime pays and both sides share.
 * During each kubenet burst the bench watches the agent (issue 32): its event-loop delay (the
 * increase of its `kubenet_event_loop_delay_seconds` histogram over the burst: a 10 ms timer's
 * lateness, blocked runs counted) and `/healthz` GET on its socket every 10 ms, each answer timed.
 *
 * Forwarding overhead: STATUS (no agent work) through the installed binary exec'd from a `sh` loop
 * (a lean fork/exec, like a Go runtime), mean per call, minus the same call POSTed straight to the
 * socket from this process (p50). CHECK on an attached pod and execs from this Node process are
 * printed for context.
 *
 * Soak (`--soak N`, cluster mode only): N ADD/DEL cycles POSTed to the agent socket as the binary
 * sends them, 4 at a time, each pod created in the API server (annotated, delivered on the watch)
 * before its ADD and deleted after its DEL; the agent's RSS (VmRSS) after N/2 and N cycles.
 *
 * Prints numbers; asserts nothing. Root only. Creates only uniquely named links, netns and temp dirs,
 * removes them even on failure or Ctrl-C, and lists anything left behind. Sends no traffic.
 *
 * Usage: npx tsx bench/cni.ts [--mode static|cluster|both] [--only SECTIONS] [--pods N] [--rounds R]
 *          [--calls C] [--burst N] [--concurrency K] [--burst-reps R] [--outside-reps R] [--soak N]
 *          [--agent process|in-process]
 *   --mode         default both (static first)       --pods    pods per round and per outside side (default 30)
 *   --only         outside,rounds,burst,overhead,soak (default all but soak; soak needs --soak N)
 *   --outside-reps repetitions of the outside client (default 4)
 *   --rounds       counted rounds (default 3)         --calls   calls per overhead sample (default 100)
 *   --burst        pods of the burst (default 64; 0: skip)   --concurrency  burst concurrency (default 8)
 *   --burst-reps   repetitions per side (default 2)  --soak    ADD/DEL cycles of the soak (default 0: skip)
 *   --burst-runtime  batch (default: one runtime process) | exec (a driver process per call)
 * Run it under the machine-wide lock: flock /tmp/kubenet-traffic.lock npx tsx bench/cni.ts
 * KUBENET_LOG_LEVEL=debug shows the agent's logs (per-step times of every ADD: `steps`).
 * KBENCH_AGENT_NODE_FLAGS='--cpu-prof --cpu-prof-dir=/tmp/prof' passes node flags to the agent process.
 */
import { execa } from 'execa';
import { existsSync } from 'node:fs';
import { availableParallelism, release } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { FORWARDER, LIBCNI_DRIVER } from '../test/kit/agent-harness.js';
import { BenchArgs } from '../test/kit/bench-kit.js';
import { libcniVersion, refPluginsVersion } from '../test/kit/upstream.js';
import { CniBench } from './cni/bench.js';
import { burstSection } from './cni/burst.js';
import {
  ANNOTATIONS,
  Interrupted,
  load,
  NODE_NAME,
  REF_BIN_DIR,
  REF_PLUGINS,
  ROOT,
  RUNTIME_CONFIG,
  SECTIONS,
  type Mode,
  type Options,
  type Section,
} from './cni/common.js';
import { outsideSection } from './cni/outside.js';
import { overheadSection } from './cni/overhead.js';
import { roundsSection } from './cni/rounds.js';
import { soakSection } from './cni/soak.js';
import { pickSubnet, routedRanges } from './cni/subnets.js';

const USAGE =
  'usage: npx tsx bench/cni.ts [--mode static|cluster|both] [--only SECTION,...] [--pods N] [--rounds R] [--calls C] [--burst N] [--concurrency K] [--burst-reps R] [--burst-runtime batch|exec] [--outside-reps R] [--soak N] [--agent process|in-process]';

/** `--only a,b`: those sections (SECTIONS); default every section but the soak, which `--soak N` adds. */
function sectionsArg(args: BenchArgs, soak: number): Set<Section> {
  const only = args.str('only');
  if (only === undefined) return new Set(SECTIONS.filter((x) => x !== 'soak' || soak > 0));
  const raw = only.split(',').filter((x) => x !== '');
  const bad = raw.filter((x) => !(SECTIONS as readonly string[]).includes(x));
  if (raw.length === 0 || bad.length > 0)
    throw new Error(`--only: want sections among ${SECTIONS.join(', ')}, got ${JSON.stringify(only)}`);
  if (raw.includes('soak') && soak === 0) throw new Error('--only soak needs --soak N (cycles)');
  return new Set(raw as Section[]);
}

interface ModeResult {
  mode: Mode;
  goals: string[];
}

function blocker(): string | undefined {
  if (process.getuid?.() !== 0) return 'needs root (network namespaces, bridges, veths, tc)';
  if (!existsSync(FORWARDER)) return `needs ${FORWARDER}: bash hack/build-native.sh`;
  if (!existsSync(LIBCNI_DRIVER)) return `needs ${LIBCNI_DRIVER}: bash hack/build-libcni-driver.sh`;
  for (const p of [...REF_PLUGINS, 'loopback']) {
    if (!existsSync(join(REF_BIN_DIR, p)))
      return `needs the reference CNI plugin ${REF_BIN_DIR}/${p} (bash hack/build-upstream.sh cni-plugins)`;
  }
  return undefined;
}

/** One mode from start to cleanup; prints its tables and returns its goal lines. */
async function runMode(mode: Mode, o: Options, onBench: (b: CniBench | undefined) => void): Promise<ModeResult> {
  const bench = new CniBench(mode, o.pods, o.calls, o.agentMode);
  onBench(bench);
  const taken = await routedRanges();
  const kubenetCidr = pickSubnet(98, Math.max(o.pods, o.burst), taken);
  const refCidr = pickSubnet(99, Math.max(o.pods, o.burst), taken);
  const floorCidr = pickSubnet(97, o.pods, taken);
  const wall = performance.now();
  const goals: string[] = [];
  try {
    console.log(`\n======== ${mode} mode ========`);
    console.log(`load average at start ${load()}; sections ${[...o.sections].join(', ')}`);
    await bench.setup(kubenetCidr, refCidr, floorCidr);
    console.log(
      `kubenet:   agent ${o.agentMode === 'process' ? `process (node dist/src/cli/main.js daemon, pid ${bench.agentProc?.pid})` : 'in this process'}, ` +
        (mode === 'cluster'
          ? `watching a fake API server at ${bench.api?.url} (Node ${NODE_NAME}, pod CIDR ${kubenetCidr}; limits from the pods' annotations ${JSON.stringify(ANNOTATIONS)}), `
          : `--pod-cidr ${kubenetCidr}, runtimeConfig ${JSON.stringify(RUNTIME_CONFIG)}, `) +
        `bridge ${bench.h.bridge}, ifb ${bench.h.ifb}`,
    );
    console.log(
      `reference: ${REF_BIN_DIR} bridge+host-local → bandwidth (conflist refnet), bridge ${bench.refBridge}, ${refCidr}, runtimeConfig ${JSON.stringify(RUNTIME_CONFIG)}`,
    );
    console.log(
      `floor:     ${REF_BIN_DIR}/bridge alone with the agent's bridge config, exec'd by bash, bridge ${bench.floorBridge}, ${floorCidr}`,
    );

    // First, while the node is fresh: what its first pods pay is part of what an outside client sees.
    if (o.sections.has('outside')) await outsideSection(bench, o, goals);
    if (o.sections.has('rounds')) await roundsSection(bench, o, goals);
    if (o.sections.has('burst') && o.burst > 0) await burstSection(bench, o, goals);
    if (o.sections.has('overhead')) await overheadSection(bench, o, goals);
    if (o.sections.has('soak') && mode === 'cluster' && o.soak > 0) await soakSection(bench, o, goals);
    console.log(`load average at end ${load()}`);
    console.log(`\ngoals (${mode} mode)`);
    for (const g of goals) console.log(`  ${g}`);
    console.log(`${mode} mode: ${((performance.now() - wall) / 1000).toFixed(1)} s`);
    return { mode, goals };
  } finally {
    const problems = await bench.cleanup();
    for (const p of problems) console.error(`warning: cleanup: ${p}`);
    const left = await bench.leftovers();
    if (left.ours.length > 0) console.error(`warning: left behind by this run: ${left.ours.join(', ')}`);
    if (left.others.length > 0)
      console.error(
        `warning: links that appeared during the run and are still there (this run's, or another process's): ${left.others.join(', ')}`,
      );
    console.log(`${mode} mode cleanup done${left.ours.length === 0 ? ', nothing left behind' : ''}`);
    onBench(undefined);
    // biome-ignore lint/correctness/noUnsafeFinally: a bench that leaves links behind fails even when it measured
    if (left.ours.length > 0) throw new Error(`left behind: ${left.ours.join(', ')}`);
  }
}

async function main(): Promise<number> {
  const args = BenchArgs.parse(USAGE, [
    'mode',
    'pods',
    'rounds',
    'calls',
    'burst',
    'concurrency',
    'burst-reps',
    'burst-runtime',
    'soak',
    'agent',
    'only',
    'outside-reps',
  ]);
  const o: Options = {
    pods: args.int('pods', 30, 1, 4000),
    rounds: args.int('rounds', 3, 1, 1000),
    calls: args.int('calls', 100, 1, 100000),
    burst: args.int('burst', 64, 0, 250),
    concurrency: args.int('concurrency', 8, 1, 64),
    burstReps: args.int('burst-reps', 2, 1, 20),
    outsideReps: args.int('outside-reps', 4, 1, 20),
    soak: args.int('soak', 0, 0, 1_000_000),
    agentMode: args.oneOf('agent', 'process', ['process', 'in-process'] as const),
    burstRuntime: args.oneOf('burst-runtime', 'batch', ['batch', 'exec'] as const),
    sections: new Set(),
  };
  o.sections = sectionsArg(args, o.soak);
  const which = args.oneOf('mode', 'both', ['static', 'cluster', 'both'] as const);
  const modes: Mode[] = which === 'both' ? ['static', 'cluster'] : [which];
  const why = blocker();
  if (why) {
    console.error(`bench/cni: ${why}`);
    return 2;
  }
  const wall = performance.now();
  if (o.agentMode === 'process') {
    // The agent as it ships: compiled by the project's own tsc config into dist/.
    const tsc = await execa(process.execPath, [join(ROOT, 'node_modules/typescript/bin/tsc'), '-p', join(ROOT, 'tsconfig.json')], {
      reject: false,
    });
    if (tsc.exitCode !== 0) {
      console.error(`bench/cni: compiling the agent failed:\n${tsc.stdout}${tsc.stderr}`);
      return 1;
    }
  }
  let current: CniBench | undefined;
  let signals = 0;
  let aborted = false;
  const onSignal = (sig: string) => {
    signals++;
    aborted = true;
    if (current) current.aborted = true;
    console.error(signals === 1 ? `\n${sig}: stopping after the current call, then cleaning up` : `${sig}: still cleaning up, please wait`);
  };
  process.on('SIGINT', () => onSignal('SIGINT'));
  process.on('SIGTERM', () => onSignal('SIGTERM'));
  // Its reader gone (`... | head`): without a listener the EPIPE killed the bench before its cleanup,
  // leaving its netns, bridges and veths. Now it stops like on a signal; what it prints is dropped.
  for (const stream of [process.stdout, process.stderr]) {
    stream.on('error', () => {
      if (!aborted) onSignal('EPIPE');
    });
  }

  console.log('CNI ADD/DEL through libcni (as containerd drives it): kubenet agent vs reference chain, same run (issue 10 goals)');
  console.log(
    `kernel ${release()}, nproc ${availableParallelism()}, node ${process.version}, reference plugins ${await refPluginsVersion()} (${REF_BIN_DIR}), ` +
      `libcni ${libcniVersion()}`,
  );
  console.log(
    `pods ${o.pods} per round (sequential), rounds ${o.rounds} counted + 1 warm-up, kubenet/reference/floor interleaved pod by pod; burst ${o.burst} pods ${o.concurrency} at a time × ${o.burstReps}; ` +
      `overhead calls ${o.calls}; outside client ${o.outsideReps} × ${o.pods} pods per side; soak ${o.soak || 'off'}; sections ${[...o.sections].join(', ')}`,
  );
  const results: ModeResult[] = [];
  let exitCode = 0;
  for (const mode of modes) {
    if (aborted) break;
    try {
      results.push(await runMode(mode, o, (b) => (current = b)));
    } catch (err) {
      exitCode = aborted ? 130 : 1;
      console.error(
        aborted
          ? `${mode} mode interrupted: no results${err instanceof Interrupted ? '' : ` (${err instanceof Error ? err.message : String(err)})`}`
          : err,
      );
    }
  }
  if (results.length > 0) {
    console.log('\n======== goals ========');
    for (const r of results) for (const g of r.goals) console.log(`${r.mode.padEnd(7)}  ${g}`);
  }
  console.log(`\ntotal ${((performance.now() - wall) / 1000).toFixed(1)} s; load average ${load()}`);
  return exitCode;
}

main().then(
  (code) => process.exit(code),
  (err: unknown) => {
    console.error(err);
    process.exit(1);
  },
);
