/**
 * Shaping bench: kubenet-ts Shaper vs the reference CNI `bandwidth` plugin, same run.
 *   (1) asked vs measured rate at 1M..1G in both directions (iperf3 goodput and the L2 rate the
 *       shaping qdisc/class actually sent, from its byte counters, worst 1 s interval, the bulk
 *       flow's retransmissions and segments) and, while that flow saturates the limit, a ping
 *       (10/s) and a kubelet-like TCP probe (new connection, request, answer, every 200 ms) from
 *       the shaped pod: loss, RTT, probe p99 and share within 100/250 ms; then PASS/MISS per goal
 *       of issue 14 (1b);
 *   (2) per-pod setup and teardown cost with 10, 100, 500 pods already shaped (probe pods added and
 *       removed at each level, ours and the reference interleaved).
 *   [--dirs egress,ingress] [--impls ours,exec,ref,unshaped] [--unshaped-cidrs 10] (cost table: which
 *       implementations to run; unshaped = ours with that many unshaped destinations on its ifb)
 *   (3) live re-shaping through the agent as it runs in a cluster (`kubenet daemon` in its own
 *       process, watching the fake API server of test/kit, pods added through its CNI binary with
 *       their limits from their annotations), with 10, 100, 500 shaped pods on the node: the time from
 *       a pod's annotation change (both directions) to the kernel holding the new rate in both of its
 *       htb classes (polled over netlink every ms), p50/p99 over --changes changes, and to the Event the
 *       agent posts after it; the cost of a /metrics scrape (wall time p50/p99, the agent's CPU time,
 *       the size and the per-pod series);
 *   (4) accuracy after a re-shape: one iperf3 flow whose limit is changed 2 s in (from twice and
 *       from half the rate), goodput and wire rate from 2 s after the change to the end, against the
 *       goals of (1b) (goodput ±5 %, wire ±2 %).
 *   (5) many pods at once, and one flow at 1G / 5G / 10G (issue 32): bench/shaping-aggregate.ts.
 *   (6) guarantees, borrowing and priority bands in the node's tree (issue 33): bench/shaping-guarantees.ts.
 * Root only. Creates its own bridges, namespaces and veths (traffic only between them) and removes
 * them. Usage: npx tsx bench/shaping.ts [--only rates,cost,live,reshape,aggregate,highrate] [--quick] [--seconds 10] [--rates 1M,10M,100M,1G]
 *   [--sizes 10,100,500] [--probes 10] [--no-rates] [--no-cost] [--no-live] [--no-reshape]
 *   [--live-sizes 10,100,500] [--changes 50] [--scrapes 20] [--reshape-rates 1M,10M,100M] [--cc cubic]
 *   [--high-rates 1G,5G,10G] [--agg-sizes 2,8,32] [--agg-seconds 10] [--agg-rounds 3] [--agg-dests lan,pods]
 *   [--agg-protos tcp,udp,udp200] [--agg-cases above,binding,tax] [--agg-limit 100G] [--agg-binding 200M]
 *   [--agg-binding-udp 20M] [--agg-udp 2G] [--agg-shards N] [--agg-capacity 10G] [--agg-tax-capacity 100G] [--agg-perf]
 *   [--capacity 10G] (ours of (1) and of the cost table in the node's trees at that capacity both ways)
 *   [--guarantee-capacity 100M] [--guarantee-capacities 1G,10G] [--guarantee-seconds 10] [--guarantee-shards N]
 * Traffic runs ((1), (4)) hold the machine-wide traffic lock (test/kit/traffic-lock.ts).
 */
import { execa, type ResultPromise } from 'execa';
import { availableParallelism } from 'node:os';
import { shardsFor } from '../src/shaper/shard-names.js';
import { createSocket } from 'node:dgram';
import { readdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { configFlags } from '../src/daemon/config/config.js';
import { classList } from '../src/netlink/index.js';
import { formatBandwidth, parseBandwidth } from '../src/bandwidth/limits.js';
import { burstBytes } from '../src/shaper/sizing.js';
import { Shaper } from '../src/shaper/tc.js';
import { parseUnshaped } from '../src/shaper/unshaped.js';
import { probeStats, runProbes, startProbeServer, type ProbeResult, type ProbeServer, type ProbeStats } from '../test/kit/probe.js';
import { ipBatch, iperf, makeTopology, pingRtt, type IperfResult, type TopoPod } from '../test/kit/topo.js';
import { AgentHarness } from '../test/kit/agent-harness.js';
import { FakeApiServer, fakeKubeConfig, node as nodeObject, pod as podObject } from '../test/kit/fake-apiserver.js';
import { delIfbs, uniq } from '../test/kit/kernel.js';
import type { TestPod } from '../test/kit/test-pod.js';
import { REF_PLUGINS_DIR, refPlugin, refPluginsVersion } from '../test/kit/upstream.js';
import { withTrafficLock } from '../test/kit/traffic-lock.js';
import { BenchArgs, median, percentile, printTable } from '../test/kit/bench-kit.js';
import { aggregateBench } from './shaping-aggregate.js';
import { guaranteesBench } from './shaping-guarantees.js';

/** The sections, in the order they run; `--only a,b` runs those alone, `--no-NAME` leaves one out. */
const SECTIONS = ['rates', 'highrate', 'cost', 'live', 'reshape', 'aggregate', 'guarantees'] as const;
const args = BenchArgs.parse(
  'usage: npx tsx bench/shaping.ts [--only SECTION,...] [--no-SECTION] [--quick] and the flags of its header (sections: ' +
    SECTIONS.join(', ') +
    ')',
  [
    'only',
    'seconds',
    'rates',
    'sizes',
    'probes',
    'impls',
    'capacity',
    'unshaped-cidrs',
    'dirs',
    'live-sizes',
    'changes',
    'scrapes',
    'reshape-rates',
    'cc',
    'high-rates',
    'agg-sizes',
    'agg-seconds',
    'agg-rounds',
    'agg-dests',
    'agg-protos',
    'agg-cases',
    'agg-limit',
    'agg-binding',
    'agg-binding-udp',
    'agg-udp',
    'agg-shards',
    'agg-capacity',
    'agg-tax-capacity',
    'guarantee-capacity',
    'guarantee-capacities',
    'guarantee-seconds',
    'guarantee-shards',
  ],
  ['quick', 'agg-perf', ...SECTIONS.map((x) => `no-${x}`)],
);
const only = args.str('only')?.split(',');
for (const name of only ?? []) {
  if (!(SECTIONS as readonly string[]).includes(name)) {
    console.error(`bench/shaping.ts: unknown section ${name} (sections: ${SECTIONS.join(', ')})`);
    process.exit(2);
  }
}
const runs = (name: (typeof SECTIONS)[number]) => (only ? only.includes(name) : !args.has(`no-${name}`));
const quick = args.has('quick');
const seconds = args.num('seconds', quick ? 5 : 10);
const rates = args.list('rates', '1M,10M,100M,1G');
const sizes = args.nums('sizes', quick ? '10,100' : '10,100,500');
const probes = args.num('probes', 10);
/**
 * The cost table's passes: by default each other implementation runs in a pass of its own beside
 * ours (the reference, the unshaped CIDRs, the exec mode), each pair interleaved probe by probe, and
 * a goal is judged in the pass that holds its pair. All four in one pass put 1 500+ shaped pods of
 * three shaper variants on the node, and the exec variant's tc spawns (each dumps every link of the
 * machine) made the setups beside them dearer: ours at 500 pods 7.7-10.1 ms there, 2.4-4.4 ms in the
 * passes without it (docs/shaping.md). `--impls` runs the ones named in one pass, as before.
 */
const implPasses: Array<Set<string>> = args.str('impls')
  ? [new Set(args.list('impls', ''))]
  : [new Set(['ours', 'ref']), new Set(['ours', 'unshaped']), new Set(['ours', 'exec'])];
/**
 * `--capacity Q`: ours in the node's trees (issue 33) at that capacity both ways, in (1) and the cost
 * table, on the agent's default shards (2 per CPU: the capacity split over them, shares.ts).
 */
const benchCapacity = args.str('capacity') ? parseBandwidth(args.str('capacity') ?? '', 'capacity') : undefined;
const treeOpts = benchCapacity
  ? { capacity: { egress: benchCapacity, ingress: benchCapacity }, shards: shardsFor(0, availableParallelism()) }
  : {};
/** How many unshaped destinations the `unshaped` implementation's ifb holds (issue 24: 10). */
const unshapedCount = args.num('unshaped-cidrs', 10);
const dirs = args.list('dirs', 'egress,ingress') as Array<'egress' | 'ingress'>;
const liveSizes = args.nums('live-sizes', quick ? '10,100' : '10,100,500');
const changes = args.num('changes', 50);
const scrapes = args.num('scrapes', 20);
const reshapeRates = args.list('reshape-rates', '1M,10M,100M');
/** TCP congestion control of the (4) flows; default the host's (net.ipv4.tcp_congestion_control). */
const congestion = args.str('cc');
const BANDWIDTH_BIN = refPlugin('bandwidth');
const NET_NAME = 'kshbench';

const mbit = (v: number) => (v / 1e6).toFixed(v < 10e6 ? 3 : 1);
const pct = (v: number, ref: number) => `${v >= ref ? '+' : ''}${(((v - ref) / ref) * 100).toFixed(1)}%`;

// ---------- the reference plugin ----------

async function refExec(command: 'ADD' | 'DEL', pod: TopoPod, rate: number, burstBits: number): Promise<void> {
  const conf = {
    cniVersion: '1.0.0',
    name: NET_NAME,
    type: 'bandwidth',
    runtimeConfig: { bandwidth: { ingressRate: rate, ingressBurst: burstBits, egressRate: rate, egressBurst: burstBits } },
    prevResult: {
      cniVersion: '1.0.0',
      interfaces: [{ name: pod.hostVeth }, { name: 'eth0', sandbox: pod.netnsPath }],
      ips: [{ address: `${pod.ip4}/16`, interface: 1 }],
    },
  };
  const r = await execa(BANDWIDTH_BIN, [], {
    input: JSON.stringify(conf),
    reject: false,
    extendEnv: false,
    env: {
      CNI_COMMAND: command,
      CNI_CONTAINERID: pod.id,
      CNI_NETNS: pod.netnsPath,
      CNI_IFNAME: 'eth0',
      CNI_PATH: REF_PLUGINS_DIR,
      PATH: process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin',
    },
  });
  if (r.exitCode !== 0) throw new Error(`bandwidth ${command} ${pod.id}: ${r.stdout} ${r.stderr}`);
}

/** The reference leaves its tbf on the host veth after DEL (it dies with the veth); clear it between runs. */
async function refScrub(pod: TopoPod): Promise<void> {
  await execa('tc', ['qdisc', 'del', 'dev', pod.hostVeth, 'root'], { reject: false });
  await execa('tc', ['qdisc', 'del', 'dev', pod.hostVeth, 'ingress'], { reject: false });
}

// ---------- counters: what the shaping qdisc/class really sent (L2 bytes) ----------

/** First "Sent N bytes" of `tc -s <args>` (the one object the args select). */
async function tcBytes(args: string[]): Promise<number> {
  const r = await execa('tc', ['-s', ...args], { reject: false });
  const m = /Sent (\d+) bytes/.exec(r.stdout);
  return m?.[1] ? Number(m[1]) : NaN;
}

/** Which counter carries the pod's traffic in one direction, for ours or the reference. */
function counterFor(impl: 'ours' | 'ref', dir: 'egress' | 'ingress', pod: TopoPod, ifb: string, refIfb: () => Promise<string>) {
  // Ours in the ingress tree (--capacity): the pod's class on `<ifb>.in`, the only pod there.
  if (dir === 'ingress' && impl === 'ours' && benchCapacity) return () => tcBytes(['class', 'show', 'dev', `${ifb}.in`, 'classid', '1:1']);
  if (dir === 'ingress') return () => tcBytes(['qdisc', 'show', 'dev', pod.hostVeth, 'root']);
  if (impl === 'ours') return () => tcBytes(['class', 'show', 'dev', ifb, 'classid', '1:1']);
  return async () => tcBytes(['qdisc', 'show', 'dev', await refIfb(), 'root']);
}

/** Ours only: the interactive leaf of the pod in one direction (its bytes are inside the class's). */
function interactiveCounterFor(dir: 'egress' | 'ingress', pod: TopoPod, ifb: string) {
  if (dir === 'ingress' && benchCapacity) return () => tcBytes(['class', 'show', 'dev', `${ifb}.in`, 'classid', '1:801']);
  if (dir === 'ingress') return () => tcBytes(['class', 'show', 'dev', pod.hostVeth, 'classid', '2:2']);
  return () => tcBytes(['class', 'show', 'dev', ifb, 'classid', '1:801']);
}

async function findRefIfb(): Promise<string> {
  const r = await execa('ip', ['-j', 'link', 'show', 'type', 'ifb']);
  const links = JSON.parse(r.stdout || '[]') as Array<{ ifname: string }>;
  const l = links.find((x) => x.ifname.startsWith('bwp'));
  if (!l) throw new Error('reference ifb not found');
  return l.ifname;
}

interface RateRow {
  impl: 'ours' | 'ref';
  asked: number;
  dir: 'egress' | 'ingress';
  goodput: number;
  l2: number;
  worst1s: number;
  retransmits: number | undefined;
  segments: number | undefined;
  ping: Awaited<ReturnType<typeof pingRtt>>;
  probe: ProbeStats;
  /** /proc/loadavg's 1-minute figure before and after the run */
  load: [number, number];
  /** ours: the interactive leaf's share of the L2 bytes in the loaded direction */
  interactiveShare?: number;
}

async function loadavg(): Promise<number> {
  return Number((await readFile('/proc/loadavg', 'utf8')).split(' ')[0]);
}

/**
 * One 10 s iperf3 run saturating the pod's limit in one direction, with a ping (10/s) from the pod
 * to the peer and a TCP probe (new connection, request, answer, every 200 ms) from the pod to a
 * server in the peer, both from 1 s after the start to 1 s before the end. Either way a ping and
 * a probe cross both of the pod's shaped directions: the loaded one and the other.
 */
async function measure(
  impl: 'ours' | 'ref',
  dir: 'egress' | 'ingress',
  rate: number,
  a: TopoPod,
  b: TopoPod,
  ifb: string,
  probeServer: ProbeServer,
): Promise<RateRow> {
  const counter = counterFor(impl, dir, a, ifb, findRefIfb);
  const interactive = impl === 'ours' ? interactiveCounterFor(dir, a, ifb) : async () => NaN;
  // L2 rate: counter sampled 1 s after start and 0.5 s before the end, over measured wall time.
  const samples: Array<[number, number, number]> = [];
  const timers: NodeJS.Timeout[] = [];
  let pingP: Promise<Awaited<ReturnType<typeof pingRtt>>> | undefined;
  let probeP: Promise<ProbeResult> | undefined;
  const window = seconds - 2;
  const onStart = () => {
    for (const ms of [1000, (seconds - 0.5) * 1000]) {
      timers.push(
        setTimeout(() => {
          const at = performance.now();
          void Promise.all([counter(), interactive()]).then(([bytes, ibytes]) => samples.push([at, bytes, ibytes]));
        }, ms),
      );
    }
    pingP = new Promise((res) => timers.push(setTimeout(() => void pingRtt(a, b, window * 10, 0.1).then(res), 1000)));
    probeP = new Promise((res, rej) =>
      timers.push(setTimeout(() => runProbes(a, probeServer, { durationMs: window * 1000 }).then(res, rej), 1000)),
    );
  };
  const load0 = await loadavg();
  let r: IperfResult;
  try {
    // egress = FROM a: a is the client sending; ingress = TO a: b's server sends (-R).
    r = await iperf(b, a, {
      seconds,
      reverse: dir === 'ingress',
      onStart,
      onRetry: (err, n) => console.error(`  iperf3 run ${n} failed (${err.message}); running it again`),
    });
  } finally {
    timers.forEach(clearTimeout);
  }
  const ping = await pingP;
  const probe = await probeP;
  if (!ping || !probe) throw new Error('ping or probe did not run');
  await new Promise((res) => setTimeout(res, 200));
  const [s0, s1] = samples.sort((x, y) => x[0] - y[0]);
  const l2 = s0 && s1 ? ((s1[1] - s0[1]) * 8) / ((s1[0] - s0[0]) / 1000) : NaN;
  const interactiveShare = s0 && s1 && impl === 'ours' ? (s1[2] - s0[2]) / (s1[1] - s0[1]) : undefined;
  return {
    ...(interactiveShare === undefined ? {} : { interactiveShare }),
    impl,
    asked: rate,
    dir,
    goodput: r.bps,
    l2,
    worst1s: Math.max(...r.intervals),
    retransmits: r.retransmits,
    segments: r.segments,
    ping,
    probe: probeStats(probe),
    load: [load0, await loadavg()],
  };
}

/** The probe bound of the goal: 100 ms at 10M and above, 250 ms below. */
const probeBound = (rate: number) => (rate >= 10e6 ? 100 : 250);

interface Goal {
  name: string;
  pass: boolean;
  detail: string;
}

/** The issue's goals for one rate and direction: ours against the reference of the same run. */
function goals(ours: RateRow, ref: RateRow): Goal[] {
  const bound = probeBound(ours.asked);
  const retrAllowed = (ref.retransmits ?? 0) + 0.01 * (ours.segments ?? 0);
  const err = (v: number) => (v - ours.asked) / ours.asked;
  return [
    { name: 'ping loss<=1%', pass: ours.ping.loss <= 1, detail: `${ours.ping.loss}%` },
    { name: 'ping<=ref/2', pass: ours.ping.avg <= ref.ping.avg / 2, detail: `${ours.ping.avg.toFixed(2)}/${ref.ping.avg.toFixed(2)}` },
    { name: `probe<=${bound}ms>=99%`, pass: ours.probe.within(bound) >= 0.99, detail: `${(ours.probe.within(bound) * 100).toFixed(1)}%` },
    {
      name: 'retr<=ref+1%',
      pass: (ours.retransmits ?? Infinity) <= retrAllowed,
      detail: `${ours.retransmits ?? '?'}<=${Math.floor(retrAllowed)}`,
    },
    { name: 'wire±2%', pass: Math.abs(err(ours.l2)) <= 0.02, detail: pct(ours.l2, ours.asked) },
    {
      name: 'goodput±5%',
      pass: Math.abs(err(ours.goodput)) <= 0.05,
      // What the ping and probe took of the limit (they are the pod's traffic too, so inside it).
      detail: `${pct(ours.goodput, ours.asked)}${ours.interactiveShare === undefined ? '' : ` (int ${(ours.interactiveShare * 100).toFixed(1)}%)`}`,
    },
    { name: 'worst1s<=1.25x', pass: ours.worst1s <= 1.25 * ours.asked, detail: `${(ours.worst1s / ours.asked).toFixed(2)}x` },
  ];
}

/** Bytes the pod's host veth counted (`ip -s link`): received = from the pod, sent = to it. */
async function vethBytes(dev: string, dir: 'egress' | 'ingress'): Promise<number> {
  const r = await execa('ip', ['-s', '-j', 'link', 'show', 'dev', dev]);
  const l = (JSON.parse(r.stdout) as Array<{ stats64?: { rx?: { bytes?: number }; tx?: { bytes?: number } } }>)[0];
  return Number(dir === 'egress' ? l?.stats64?.rx?.bytes : l?.stats64?.tx?.bytes);
}

/** One unshaped flow of the pod in one direction: its wire rate (the veth's counter, same window as measure()) and goodput. */
async function unshapedFlow(dir: 'egress' | 'ingress', a: TopoPod, b: TopoPod): Promise<{ l2: number; goodput: number }> {
  const samples: Array<[number, number]> = [];
  const timers: NodeJS.Timeout[] = [];
  const r = await iperf(b, a, {
    seconds,
    reverse: dir === 'ingress',
    onStart: () => {
      for (const ms of [1000, (seconds - 0.5) * 1000]) {
        timers.push(
          setTimeout(() => {
            const at = performance.now();
            void vethBytes(a.hostVeth, dir).then((bytes) => samples.push([at, bytes]));
          }, ms),
        );
      }
    },
    onRetry: (err, n) => console.error(`  iperf3 run ${n} failed (${err.message}); running it again`),
  }).finally(() => timers.forEach(clearTimeout));
  await new Promise((res) => setTimeout(res, 200));
  const [s0, s1] = samples.sort((x, y) => x[0] - y[0]);
  return { l2: s0 && s1 ? ((s1[1] - s0[1]) * 8) / ((s1[0] - s0[0]) / 1000) : NaN, goodput: r.bps };
}

/**
 * (1) at the given rates. `highRate`: also the pod's unshaped flow each way first, and the goal of
 * issue 32 per rate and direction: ours on the wire >= 0.95x min(limit, the unshaped wire rate).
 */
async function rateBench(rateList: string[] = rates, highRate = false): Promise<void> {
  const topo = await makeTopology(2);
  const [a, b] = topo.pods as [TopoPod, TopoPod];
  const ifb = `kshbi${topo.tag}`;
  const shaper = new Shaper({ ifbName: ifb, ...treeOpts });
  const rows: RateRow[] = [];
  const goalRows: string[][] = [];
  let goalNames: string[] = [];
  let misses = 0;
  let probeServer: ProbeServer | undefined;
  try {
    await shaper.init();
    probeServer = await startProbeServer(b);
    const unshaped = new Map<string, { l2: number; goodput: number }>();
    if (highRate) {
      for (const dir of dirs) {
        const u = await unshapedFlow(dir, a, b);
        unshaped.set(dir, u);
        console.error(`  unshaped ${dir}: L2 ${mbit(u.l2)} goodput ${mbit(u.goodput)} Mbit/s`);
      }
    }
    const highRateGoals: string[] = [];
    for (const q of rateList) {
      const rate = parseBandwidth(q, 'rate');
      const burstBits = burstBytes(rate) * 8;
      for (const dir of dirs) {
        await shaper.ensure({ id: a.id, hostVeth: a.hostVeth, ips: [a.ip4, a.ip6], limits: { ingress: rate, egress: rate } });
        const ours = await measure('ours', dir, rate, a, b, ifb, probeServer);
        rows.push(ours);
        await shaper.remove(a.id);
        await refExec('ADD', a, rate, burstBits);
        let ref: RateRow;
        try {
          ref = await measure('ref', dir, rate, a, b, ifb, probeServer);
          rows.push(ref);
        } finally {
          await refExec('DEL', a, rate, burstBits).catch((e: unknown) => console.error(String(e)));
          await refScrub(a);
        }
        for (const x of [ours, ref]) {
          console.error(
            `  ${x.impl} ${q} ${dir}: goodput ${mbit(x.goodput)} L2 ${mbit(x.l2)} worst1s ${mbit(x.worst1s)} retr ${x.retransmits}/${x.segments} ` +
              `ping ${x.ping.avg}ms loss ${x.ping.loss}% probe p99 ${x.probe.p99.toFixed(1)}ms load ${x.load.join('->')}`,
          );
        }
        const u = unshaped.get(dir);
        if (u) {
          const bound = Math.min(rate, u.l2);
          const ok = ours.l2 >= 0.95 * bound;
          if (!ok) misses++;
          highRateGoals.push(
            `goal single flow at ${q} ${dir} (wire >= 0.95x min(limit, unshaped ${mbit(u.l2)} Mbit/s)): ${ok ? 'PASS' : 'MISS'} ${mbit(ours.l2)} Mbit/s = ${(ours.l2 / bound).toFixed(3)}x; goodput ${mbit(ours.goodput)} (unshaped ${mbit(u.goodput)}); ref ${mbit(ref.l2)}`,
          );
        }
        const g = goals(ours, ref);
        goalNames = g.map((x) => x.name);
        misses += g.filter((x) => !x.pass).length;
        goalRows.push([mbit(rate), dir, ...g.map((x) => `${x.pass ? 'PASS' : 'MISS'} ${x.detail}`)]);
      }
    }
    const idle = await pingRtt(a, b, 10);
    const ms = (v: number) => (Number.isFinite(v) ? v.toFixed(v < 10 ? 2 : 0) : 'fail');
    printTable(
      `(1) asked vs measured, ${seconds} s iperf3 runs with a ping (10/s) and a TCP probe (connect + request + answer, every 200 ms) from the pod over the ${seconds - 2} s in the middle. ` +
        `L2 = bytes the shaping qdisc/class sent (wire rate the limit applies to); int share = ours: part of L2 sent by the interactive leaf (the ping's and probe's packets, inside the limit); ` +
        `goodput = iperf3 TCP payload (max ~95.6% of L2 at MTU 1500); ` +
        `retr/segs = the bulk flow's retransmissions (iperf3) / data segments; load = 1-min loadavg before->after. Idle RTT ${idle.avg} ms.`,
      [
        'impl',
        'asked',
        'dir',
        'L2 Mbit/s',
        'L2 err',
        'int share',
        'goodput',
        'gp err',
        'worst 1s',
        'ping avg/max ms',
        'loss',
        'probe p50/p99 ms',
        '<=100ms',
        '<=250ms',
        'retr/segs',
        'load',
      ],
      rows.map((x) => [
        x.impl,
        mbit(x.asked),
        x.dir,
        mbit(x.l2),
        pct(x.l2, x.asked),
        x.interactiveShare === undefined ? '' : `${(x.interactiveShare * 100).toFixed(1)}%`,
        mbit(x.goodput),
        pct(x.goodput, x.asked),
        `${(x.worst1s / x.asked).toFixed(2)}x`,
        `${x.ping.avg.toFixed(2)}/${x.ping.max.toFixed(1)}`,
        `${x.ping.loss}%`,
        `${ms(x.probe.p50)}/${ms(x.probe.p99)}`,
        `${(x.probe.within(100) * 100).toFixed(1)}%`,
        `${(x.probe.within(250) * 100).toFixed(1)}%`,
        `${x.retransmits ?? '?'}/${x.segments ?? '?'}`,
        `${x.load[0].toFixed(2)}->${x.load[1].toFixed(2)}`,
      ]),
    );
    printTable(
      '(1b) goals of issue 14 for ours, against the reference of the same run (ping<=ref/2: ours/ref avg ms; retr: ours <= ref + 1% of our segments)',
      ['asked', 'dir', ...goalNames],
      goalRows,
    );
    for (const line of highRateGoals) console.log(line);
    console.log(`rate goals: ${goalRows.length * goalNames.length + highRateGoals.length - misses} PASS, ${misses} MISS`);
  } finally {
    await probeServer?.stop();
    await shaper.reset().catch(() => undefined);
    shaper.close();
    await refExec('DEL', a, 1e6, 1e6).catch(() => undefined);
    await topo.destroy();
  }
}

// ---------- (2) cost ----------

async function costBench(impls: Set<string>): Promise<void> {
  const maxN = Math.max(...sizes);
  const total = maxN + probes;
  console.error(`cost pass ${[...impls].join('+')}: creating ${impls.size} x ${total} namespaces + veths...`);
  const tA = performance.now();
  const useExec = impls.has('exec');
  const useRef = impls.has('ref');
  const useUnshaped = impls.has('unshaped');
  const ours = await makeTopology(total, { addresses: false });
  const oursU = await makeTopology(useUnshaped ? total : 0, { addresses: false });
  const oursExec = await makeTopology(useExec ? total : 0, { addresses: false });
  const ref = await makeTopology(useRef ? total : 0, { addresses: false });
  console.error(`  done in ${((performance.now() - tA) / 1000).toFixed(1)} s`);
  const shaper = new Shaper({ ifbName: `kshbc${ours.tag}`, ...treeOpts });
  const shaperExec = new Shaper({ ifbName: `kshbe${oursExec.tag}`, tcMode: 'exec' });
  // The same shaper with UNSHAPED_CIDRS destinations not shaped (its ifb's filters; the mangle
  // rules for traffic to the pods are per node and not made here: the bench runs in the host's netns).
  const unshaped = parseUnshaped(Array.from({ length: unshapedCount }, (_, i) => `10.${i}.0.0/16`));
  const shaperU = new Shaper({ ifbName: `kshbu${oursU.tag}`, unshaped: { subnets: unshaped } });
  const rate = 10e6;
  const burstBits = burstBytes(rate) * 8;
  const limits = { ingress: rate, egress: rate };
  const spec = (p: TopoPod) => ({ id: p.id, hostVeth: p.hostVeth, ips: [p.ip4, p.ip6], limits });
  const rows: string[][] = [];
  const unshapedTotals: Array<[number, number, number]> = [];
  let shaped = 0;
  let shapedRef = 0;
  const timed = async (fn: () => Promise<unknown>, into: number[]) => {
    const t = performance.now();
    await fn();
    into.push(performance.now() - t);
  };
  try {
    await shaper.init();
    if (useExec) await shaperExec.init();
    if (useUnshaped) await shaperU.init();
    for (const n of [...sizes].sort((x, y) => x - y)) {
      // Bring all three to n shaped pods (untimed).
      for (; shaped < n; shaped++) {
        await shaper.ensure(spec(ours.pods[shaped]!));
        if (useExec) await shaperExec.ensure(spec(oursExec.pods[shaped]!));
        if (useUnshaped) await shaperU.ensure(spec(oursU.pods[shaped]!));
      }
      for (; useRef && shapedRef < n; shapedRef++) await refExec('ADD', ref.pods[shapedRef]!, rate, burstBits);
      const s = { add: [] as number[], del: [] as number[] };
      const e = { add: [] as number[], del: [] as number[] };
      const r = { add: [] as number[], del: [] as number[] };
      const u = { add: [] as number[], del: [] as number[] };
      // Interleaved probe pods: the three see the same machine load.
      for (let k = 0; k < probes; k++) {
        const ps = ours.pods[maxN + k]!;
        const pe = oursExec.pods[maxN + k];
        const pr = ref.pods[maxN + k];
        const pu = oursU.pods[maxN + k];
        // ours and ours-with-unshaped take turns at going first: whichever follows the reference's
        // exec'd DEL pays for its CPU burst (seen: 0.69-0.85x in favour of the one going second).
        const addU = async () => (pu ? timed(() => shaperU.ensure(spec(pu)), u.add) : undefined);
        if (k % 2 === 1) await addU();
        await timed(() => shaper.ensure(spec(ps)), s.add);
        if (k % 2 === 0) await addU();
        if (pe) await timed(() => shaperExec.ensure(spec(pe)), e.add);
        if (pr) await timed(() => refExec('ADD', pr, rate, burstBits), r.add);
        await timed(() => shaper.remove(ps.id), s.del);
        if (pu) await timed(() => shaperU.remove(pu.id), u.del);
        if (pe) await timed(() => shaperExec.remove(pe.id), e.del);
        if (pr) await timed(() => refExec('DEL', pr, rate, burstBits), r.del);
        if (pr) await refScrub(pr);
      }
      const m = (x: { add: number[]; del: number[] }) => [median(x.add), median(x.del)] as const;
      const [sa, sd] = m(s);
      const [ea, ed] = m(e);
      const [ra, rd] = m(r);
      const [ua, ud] = m(u);
      if (useUnshaped) unshapedTotals.push([n, sa + sd, ua + ud]);
      const f = (x: number) => (Number.isNaN(x) ? '-' : x.toFixed(2));
      const ratio = (a: number, b: number) => (Number.isNaN(a) || Number.isNaN(b) ? '-' : `${(a / b).toFixed(1)}x`);
      rows.push([
        String(n),
        f(sa),
        f(sd),
        f(sa + sd),
        f(ea),
        f(ed),
        f(ea + ed),
        f(ra),
        f(rd),
        f(ra + rd),
        ratio(ra + rd, sa + sd),
        ratio(ra + rd, ea + ed),
      ]);
      console.error(
        `  n=${n}: session ${sa.toFixed(2)}+${sd.toFixed(2)} ms, exec ${ea.toFixed(2)}+${ed.toFixed(2)} ms, ref ${ra.toFixed(2)}+${rd.toFixed(2)} ms`,
      );
    }
    printTable(
      `(2) per-pod cost in ms (median of ${probes} probe pods added then removed with n pods already shaped; both directions, 10M), pass ${[...impls].join(' + ')}${benchCapacity ? `, ours in the node's trees at capacity ${formatBandwidth(benchCapacity)} both ways` : ''}. ` +
        `ours = Shaper with its long-lived tc session (default), ours-exec = one tc spawn per operation, ref = CNI bandwidth plugin exec`,
      [
        'n shaped',
        'ours setup',
        'teardown',
        'total',
        'ours-exec setup',
        'teardown',
        'total',
        'ref setup',
        'teardown',
        'total',
        'ref/ours',
        'ref/ours-exec',
      ],
      rows,
    );
    const first = rows[0];
    const last = rows[rows.length - 1];
    if (first && last && first !== last) {
      const growth = (col: number) => {
        const v = Number(last[col]) / Number(first[col]);
        return Number.isNaN(v) ? '-' : `${v.toFixed(2)}x`;
      };
      console.log(`total at n=${last[0]} / at n=${first[0]}: ours ${growth(3)}, ours-exec ${growth(6)}, ref ${growth(9)}`);
      const g = Number(last[3]) / Number(first[3]);
      // Judged with our pods and the reference's alone on the node (see implPasses).
      if (!useExec && !useUnshaped)
        console.log(
          `goal per-pod cost flat (issue 22: ours total at n=${last[0]} <= 2x n=${first[0]}): ${g <= 2 ? 'PASS' : 'MISS'} ${g.toFixed(2)}x`,
        );
    }
    for (const [n, plain, withU] of unshapedTotals) {
      const g = withU / plain;
      console.log(
        `goal per-pod cost with ${unshapedCount} unshaped CIDRs within 10 % of none (issue 24: <= 1.1x) at n=${n}: ${g <= 1.1 ? 'PASS' : 'MISS'} ${withU.toFixed(2)} / ${plain.toFixed(2)} ms (${g.toFixed(2)}x)`,
      );
    }
    const cheap = rows.map((r) => Number(r[9]) / Number(r[3]));
    if (cheap.every((x) => !Number.isNaN(x)) && !useExec && !useUnshaped) {
      console.log(
        `goal ours >= 10x cheaper than ref at every n: ${cheap.every((x) => x >= 10) ? 'PASS' : 'MISS'} ${cheap.map((x) => `${x.toFixed(1)}x`).join(' ')}`,
      );
    }
  } finally {
    const t = performance.now();
    await shaper.reset().catch((err: unknown) => console.error(String(err)));
    if (useExec) await shaperExec.reset().catch((err: unknown) => console.error(String(err)));
    if (useUnshaped) await shaperU.reset().catch((err: unknown) => console.error(String(err)));
    for (let i = 0; i < shapedRef; i++) await refExec('DEL', ref.pods[i]!, rate, burstBits).catch(() => undefined);
    await ours.destroy();
    await oursExec.destroy();
    await oursU.destroy();
    await ref.destroy();
    console.error(`cleanup ${((performance.now() - t) / 1000).toFixed(1)} s`);
  }
}

// ---------- (3) live re-shaping through the agent, and the metrics scrape ----------

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const EG = 'kubernetes.io/egress-bandwidth';
const IN = 'kubernetes.io/ingress-bandwidth';

/**
 * The CPU time a process has had so far, ms with ns precision: se.sum_exec_runtime of every thread
 * of it (its worker threads too), user and kernel time alike. /proc/PID/stat counts 10 ms ticks,
 * too coarse for one scrape. A thread's figure is brought up to date when it stops running, so read
 * it while the process is idle.
 */
async function cpuMs(pid: number): Promise<number> {
  let total = 0;
  for (const tid of await readdir(`/proc/${pid}/task`)) {
    const text = await readFile(`/proc/${pid}/task/${tid}/sched`, 'utf8').catch(() => '');
    total += Number(/se\.sum_exec_runtime\s+:\s+([\d.]+)/.exec(text)?.[1] ?? 0);
  }
  return total;
}

/** One datagram from the host to each pod (port 9, nothing listens): through its veth's classes, and its ICMP answer through its ifb classes. */
async function touchPods(ips: string[]): Promise<void> {
  const sock = createSocket('udp4');
  try {
    await Promise.all(ips.map((ip) => new Promise<void>((resolve) => sock.send(Buffer.alloc(64), 9, ip, () => resolve()))));
  } finally {
    sock.close();
  }
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * Scrapes, each timed alone: 5 to warm up, then `scrapes`, each between two idle moments of the
 * agent (50 ms), with its CPU time read before and after. `before` runs ahead of each (traffic, or
 * a wait for the agent's last read to age out).
 */
async function measureScrapes(
  h: AgentHarness,
  pid: number,
  before?: () => Promise<void>,
): Promise<{ wallMs: number[]; cpuMs: number[]; body: string }> {
  const wallMs: number[] = [];
  const cpu: number[] = [];
  let body = '';
  for (let i = 0; i < 5 + scrapes; i++) {
    await before?.();
    await sleep(50);
    const c0 = await cpuMs(pid);
    const s0 = performance.now();
    body = (await h.get('/metrics')).body;
    const wall = performance.now() - s0;
    await sleep(50);
    const c1 = await cpuMs(pid);
    if (i < 5) continue;
    wallMs.push(wall);
    cpu.push(c1 - c0);
  }
  return { wallMs, cpuMs: cpu, body };
}

/**
 * The agent's CPU over windows as long as a scrape's (50 ms, `windowMs`, 50 ms) with no scrape in
 * them: what the agent spends anyway (its watches, ticks and timers), to read the scrape rows against.
 */
async function measureQuiet(pid: number, windowMs: number): Promise<{ wallMs: number[]; cpuMs: number[]; body: string }> {
  const cpu: number[] = [];
  for (let i = 0; i < 5 + scrapes; i++) {
    await sleep(50);
    const c0 = await cpuMs(pid);
    await sleep(100 + windowMs);
    const c1 = await cpuMs(pid);
    if (i >= 5) cpu.push(c1 - c0);
  }
  return { wallMs: [windowMs], cpuMs: cpu, body: '' };
}

async function liveBench(): Promise<void> {
  const tag = uniq(6);
  const api = await FakeApiServer.start();
  const nodeName = `klb-${tag}`;
  const h = await new AgentHarness().setup('10.92.0.0/22', { bridgeName: `klbb${tag}`, ifbName: `klbi${tag}`, logLevel: 'warn' });
  const netns: string[] = [];
  let agent: ResultPromise | undefined;
  const latencyRows: string[][] = [];
  const scrapeRows: string[][] = [];
  let scrapeGoal: { storm: number[]; idle: number[]; busy: number[] } | undefined;
  try {
    api.setNode(nodeObject(nodeName, { podCIDRs: ['10.92.0.0/22'] }));
    const kubeconfig = join(h.root, 'kubeconfig.yaml');
    await writeFile(kubeconfig, fakeKubeConfig(api, 'bench').exportConfig());
    // The agent as it runs in a cluster: its own process, the Node's pod CIDR, pods' annotations.
    const { podCIDR: _cidr, ...rest } = h.config;
    const flags = configFlags({ ...rest, kubeconfig, nodeName });
    agent = execa(process.execPath, ['--import=tsx', join(ROOT, 'src/cli/main.ts'), 'daemon', ...flags], {
      cwd: ROOT,
      stdio: ['ignore', 'inherit', 'inherit'],
      reject: false,
    });
    for (const deadline = Date.now() + 30_000; (await h.get('/healthz').catch(() => ({ status: 0 }))).status !== 200; ) {
      if (Date.now() > deadline) throw new Error('the agent did not become ready');
      await new Promise((r) => setTimeout(r, 100));
    }
    const conf = JSON.stringify({ cniVersion: '1.0.0', name: 'kubenet', type: 'kubenet', socket: h.config.socket });
    const pods: TestPod[] = [];
    const addPods = async (n: number) => {
      const fresh: TestPod[] = [];
      for (let i = pods.length; i < n; i++) {
        const name = `p${i}`;
        fresh.push({
          namespace: 'bench',
          name,
          id: `${tag}-${name}-`.padEnd(64, '0'),
          uid: `uid-${i}`,
          netns: `klb-${tag}-${i}`,
          netnsPath: `/var/run/netns/klb-${tag}-${i}`,
          ifName: 'eth0',
        });
      }
      await ipBatch(fresh.map((p) => `netns add ${p.netns}`));
      netns.push(...fresh.map((p) => p.netns));
      for (const p of fresh) api.setPod(podObject('bench', p.name, nodeName, { [IN]: '10M', [EG]: '10M' }));
      let next = 0;
      const worker = async () => {
        for (let p = fresh[next++]; p; p = fresh[next++]) {
          const r = await h.execCni('ADD', p, conf);
          if (r.exitCode !== 0) throw new Error(`ADD ${p.name}: ${r.stdout} ${r.stderr}`);
        }
      };
      await Promise.all([worker(), worker(), worker(), worker()]);
      pods.push(...fresh);
    };
    const pid = agent.pid ?? 0;
    for (const n of [...liveSizes].sort((a, b) => a - b)) {
      const t0 = performance.now();
      await addPods(n);
      console.error(`  ${n} shaped pods on the node (${((performance.now() - t0) / 1000).toFixed(1)} s to add ${n} - previous)`);
      // The pod whose limits change: its veth (ingress: 2:1) and its ifb class (egress: 1:<id>).
      const target = pods[0]!;
      const record = JSON.parse(await readFile(join(h.config.stateDir, 'pods', `${target.id}@eth0.json`), 'utf8')) as {
        hostVethIndex: number;
        shaping: { classId: number };
      };
      const ifbClass = ((1 << 16) | record.shaping.classId) >>> 0;
      // The veth's class is polled (a dump of 3 classes); the ifb's (a dump of 3 classes per shaped pod,
      // ~1500 at 500 pods, several ms each) only checked once the Event is in: polling it every ms would
      // take a core from the agent on this 2-core machine.
      const vethRate = () => classList(record.hostVethIndex).find((c) => c.handle === 0x20001)?.rate;
      const ifbRate = () => classList(h.config.ifbName).find((c) => c.handle === ifbClass)?.rate;
      const kernelMs: number[] = [];
      const eventMs: number[] = [];
      for (let i = 0; i < changes; i++) {
        const rate = i % 2 === 0 ? 20e6 : 10e6;
        const q = formatBandwidth(rate);
        const before = api.events.length;
        const wall = Date.now();
        const start = performance.now();
        api.annotatePod('bench', target.name, { [IN]: q, [EG]: q });
        for (;;) {
          await new Promise((r) => setTimeout(r, 1));
          if (vethRate() === rate) break;
          if (performance.now() - start > 10_000) throw new Error(`change ${i}: ${q} not on the veth after 10 s`);
        }
        kernelMs.push(performance.now() - start);
        for (const deadline = Date.now() + 10_000; api.events.length === before && Date.now() < deadline; )
          await new Promise((r) => setTimeout(r, 1));
        const ev = api.events[before];
        if (!ev) throw new Error(`change ${i}: no Event within 10 s`);
        eventMs.push(ev.receivedAt - wall);
        if (ifbRate() !== rate) throw new Error(`change ${i}: the ifb class is not at ${q} once the Event is in`);
        await new Promise((r) => setTimeout(r, 20));
      }
      latencyRows.push([
        String(n),
        String(changes),
        percentile(kernelMs, 50).toFixed(1),
        percentile(kernelMs, 99).toFixed(1),
        Math.max(...kernelMs).toFixed(1),
        percentile(eventMs, 50).toFixed(0),
        percentile(eventMs, 99).toFixed(0),
      ]);
      // A storm of scrapes (each 150 ms after the last: within metricsMaxAge, they share the agent's
      // reads); then scrapes each after the last read aged out, of idle pods, and with every pod's
      // counters moved since the last one.
      const storm = await measureScrapes(h, pid);
      const aged = async () => {
        await sleep(h.config.metricsMaxAge * 1000 + 300);
      };
      const idle = await measureScrapes(h, pid, aged);
      const ips = await Promise.all(
        pods.map(
          async (p) =>
            (JSON.parse(await readFile(join(h.config.stateDir, 'pods', `${p.id}@eth0.json`), 'utf8')) as { ips: string[] }).ips[0]?.split(
              '/',
            )[0] ?? '',
        ),
      );
      const busy = await measureScrapes(h, pid, async () => {
        await aged();
        await touchPods(ips.filter((ip) => ip !== ''));
        await sleep(20);
      });
      const quiet = await measureQuiet(pid, percentile(storm.wallMs, 50));
      for (const [what, m] of [
        ['no scrape', quiet],
        ['storm', storm],
        ['read, idle', idle],
        ['read, busy', busy],
      ] as const) {
        const series = m.body.split('\n').filter((l) => l.startsWith('kubenet_pod_')).length;
        scrapeRows.push([
          String(n),
          what,
          String(scrapes),
          percentile(m.wallMs, 50).toFixed(1),
          percentile(m.wallMs, 99).toFixed(1),
          percentile(m.cpuMs, 50).toFixed(2),
          percentile(m.cpuMs, 99).toFixed(2),
          (m.body.length / 1024).toFixed(0),
          String(series),
        ]);
        console.error(
          `  n=${n} ${what}: scrape p50 ${percentile(m.wallMs, 50).toFixed(1)} ms, agent CPU p50 ${percentile(m.cpuMs, 50).toFixed(2)} ms p99 ${percentile(m.cpuMs, 99).toFixed(2)} ms, ${series} series`,
        );
      }
      if (n === 500) scrapeGoal = { storm: storm.cpuMs, idle: idle.cpuMs, busy: busy.cpuMs };
      console.error(`  n=${n}: re-shape p50 ${percentile(kernelMs, 50).toFixed(1)} ms p99 ${percentile(kernelMs, 99).toFixed(1)} ms`);
    }
    printTable(
      `(3a) re-shape latency: a pod's two bandwidth annotations changed in the (fake) API server (agent in its own process, cluster mode), ${changes} changes 10M <-> 20M at each n: -> its veth class (ingress) at the new rate in the kernel (polled over netlink every 1 ms); -> the BandwidthApplied Event the agent posts once its tc batch (both directions) is done, the ifb class (egress) then checked at the new rate`,
      ['n shaped pods', 'changes', 'veth class p50 ms', 'p99 ms', 'max ms', 'both + Event p50 ms', 'p99 ms'],
      latencyRows,
    );
    printTable(
      `(3b) GET /metrics through the agent socket (both directions of every pod shaped), ${scrapes} scrapes after 5 to warm up, each alone (50 ms of quiet before and after): wall time; the agent's CPU time per scrape (se.sum_exec_runtime of all its threads, /proc/PID/task/*/sched, kernel time included); body size; per-pod series (6 per shaped direction). storm: back to back, within metricsMaxAge (${h.config.metricsMaxAge} s) of each other, so they share the agent's reads of the counters; read: each after the last read aged out, so each reads the kernel's counters (idle: no traffic; busy: one datagram from the host to every pod before each, its veth classes and its ICMP answer through the ifb move); no scrape: the agent's CPU over a window as long as a storm scrape's with none in it (what it spends anyway)`,
      ['n shaped pods', 'pods', 'scrapes', 'wall p50 ms', 'p99 ms', 'agent CPU p50 ms', 'p99 ms', 'body KiB', 'kubenet_pod_* series'],
      scrapeRows,
    );
    if (scrapeGoal) {
      const p50 = percentile(scrapeGoal.storm, 50);
      const f = (xs: number[]) => `p50 ${percentile(xs, 50).toFixed(2)} ms p99 ${percentile(xs, 99).toFixed(2)} ms`;
      console.log(
        `goal /metrics scrape at 500 shaped pods (<= 2 ms agent CPU, p50 of ${scrapes} back to back): ${p50 <= 2 ? 'PASS' : 'MISS'} ${f(scrapeGoal.storm)}; ` +
          `a scrape that reads the counters (after metricsMaxAge): idle pods ${f(scrapeGoal.idle)}, every pod's counters moved ${f(scrapeGoal.busy)}`,
      );
    }
  } finally {
    if (agent) {
      agent.kill('SIGTERM');
      await agent;
    }
    await ipBatch([...netns.map((n) => `netns del ${n}`), `link del ${h.config.bridgeName}`], true);
    await delIfbs(h.config.ifbName);
    await api.stop();
    await h.cleanup.run().catch((err: unknown) => console.error(String(err)));
  }
}

// ---------- (4) accuracy after a re-shape ----------

async function reshapeAccuracyBench(): Promise<void> {
  const topo = await makeTopology(2);
  const [a, b] = topo.pods as [TopoPod, TopoPod];
  const ifb = `klbi${topo.tag}`;
  const shaper = new Shaper({ ifbName: ifb });
  const S = Math.max(seconds, 10);
  const CHANGE_S = 2;
  const SETTLE_S = 2;
  const rows: string[][] = [];
  let misses = 0;
  try {
    await shaper.init();
    for (const q of reshapeRates) {
      const rate = parseBandwidth(q, 'rate');
      for (const dir of dirs) {
        for (const from of [2 * rate, rate / 2]) {
          const spec = (r: number) => ({ id: a.id, hostVeth: a.hostVeth, ips: [a.ip4, a.ip6], limits: { ingress: r, egress: r } });
          await shaper.ensure(spec(from));
          const counter =
            dir === 'ingress'
              ? () => tcBytes(['class', 'show', 'dev', a.hostVeth, 'classid', '2:1'])
              : () => tcBytes(['class', 'show', 'dev', ifb, 'classid', `1:${(shaper.classIdOf(a.id) ?? 0).toString(16)}`]);
          const samples: Array<[number, number]> = [];
          const timers: NodeJS.Timeout[] = [];
          const r = await iperf(b, a, {
            seconds: S,
            reverse: dir === 'ingress',
            ...(congestion ? { congestion } : {}),
            onRetry: (err, n) => console.error(`  iperf3 run ${n} failed (${err.message}); running it again`),
            onStart: () => {
              samples.length = 0;
              timers.push(setTimeout(() => void shaper.ensure(spec(rate)), CHANGE_S * 1000));
              for (const ms of [(CHANGE_S + SETTLE_S) * 1000, (S - 0.5) * 1000]) {
                timers.push(
                  setTimeout(() => {
                    const at = performance.now();
                    void counter().then((bytes) => samples.push([at, bytes]));
                  }, ms),
                );
              }
            },
          }).finally(() => timers.forEach(clearTimeout));
          await new Promise((res) => setTimeout(res, 200));
          const [s0, s1] = samples.sort((x, y) => x[0] - y[0]);
          const l2 = s0 && s1 ? ((s1[1] - s0[1]) * 8) / ((s1[0] - s0[0]) / 1000) : NaN;
          // Receiver intervals from SETTLE_S after the change (iperf3's clock starts a little after ours: rounded up).
          const after = r.intervals.slice(CHANGE_S + SETTLE_S + 1);
          const goodput = after.reduce((x, y) => x + y, 0) / after.length;
          const gpOk = Math.abs(goodput / rate - 1) <= 0.05;
          const l2Ok = Math.abs(l2 / rate - 1) <= 0.02;
          misses += (gpOk ? 0 : 1) + (l2Ok ? 0 : 1);
          rows.push([
            mbit(rate),
            dir,
            `${mbit(from)} -> ${mbit(rate)}`,
            mbit(goodput),
            `${gpOk ? 'PASS' : 'MISS'} ${pct(goodput, rate)}`,
            mbit(l2),
            `${l2Ok ? 'PASS' : 'MISS'} ${pct(l2, rate)}`,
            `${(Math.max(...after) / rate).toFixed(2)}x`,
            r.intervals.map((x) => mbit(x)).join(' '),
          ]);
          console.error(
            `  ${dir} ${mbit(from)} -> ${mbit(rate)}: goodput ${mbit(goodput)} L2 ${mbit(l2)}; intervals ${r.intervals.map((x) => mbit(x)).join(' ')}`,
          );
        }
      }
    }
    const cc = congestion ?? (await readFile('/proc/sys/net/ipv4/tcp_congestion_control', 'utf8')).trim();
    printTable(
      `(4) accuracy after a re-shape: one ${S} s iperf3 flow (TCP ${cc}), the pod's limit changed ${CHANGE_S} s in; goodput = mean of the receiver's 1 s intervals from ${CHANGE_S + SETTLE_S + 1} s, L2 = bytes the pod's class sent from ${CHANGE_S + SETTLE_S} s to ${S - 0.5} s; goals of (1b): goodput ±5 %, wire ±2 %`,
      ['asked', 'dir', 'change', 'goodput', 'goodput±5%', 'L2', 'wire±2%', 'worst 1s', 'intervals (Mbit/s)'],
      rows,
    );
    console.log(`re-shape accuracy goals: ${rows.length * 2 - misses} PASS, ${misses} MISS`);
  } finally {
    await shaper.reset().catch(() => undefined);
    shaper.close();
    await topo.destroy();
  }
}

if (process.getuid?.() !== 0) {
  console.error('bench/shaping.ts needs root');
  process.exit(1);
}
// Its reader gone (`... | head`): without a listener the EPIPE killed the bench before its cleanup
// (its `finally` blocks), leaving namespaces, veths and tc objects. It now runs on to its cleanup;
// what it prints is dropped.
for (const stream of [process.stdout, process.stderr]) stream.on('error', () => undefined);
console.log(
  `kubenet-ts shaping bench ${new Date().toISOString()} kernel ${(await execa('uname', ['-r'])).stdout} (${quick ? 'quick' : 'full'}); reference plugins ${await refPluginsVersion()} (${REF_PLUGINS_DIR})`,
);
if (runs('rates')) await withTrafficLock(() => rateBench());
// One flow at 1G, 5G and 10G against the pod's unshaped flow of the same run (issue 32).
if (runs('highrate')) await withTrafficLock(() => rateBench(args.list('high-rates', '1G,5G,10G'), true));
if (runs('cost')) for (const pass of implPasses) await costBench(pass);
if (runs('live')) await liveBench();
if (runs('reshape')) await withTrafficLock(() => reshapeAccuracyBench());
if (runs('aggregate')) {
  const list = <T extends string>(flag: string, dflt: string) => args.list(flag, dflt) as T[];
  await aggregateBench({
    sizes: args.nums('agg-sizes', quick ? '2,8' : '2,8,32'),
    seconds: args.num('agg-seconds', quick ? 5 : 10),
    rounds: args.num('agg-rounds', quick ? 1 : 3),
    dests: list('agg-dests', 'lan,pods'),
    protos: list('agg-protos', 'tcp,udp,udp200'),
    cases: list('agg-cases', 'above,binding,tax'),
    aboveLimit: parseBandwidth(args.str('agg-limit') ?? '100G', 'limit'),
    bindingLimit: {
      tcp: parseBandwidth(args.str('agg-binding') ?? '200M', 'limit'),
      udp: parseBandwidth(args.str('agg-binding-udp') ?? '20M', 'limit'),
    },
    udpOffered: parseBandwidth(args.str('agg-udp') ?? '2G', 'offered'),
    perf: args.has('agg-perf'),
    ...(args.str('agg-shards') ? { shards: args.num('agg-shards', 1) } : {}),
    ...(args.str('agg-capacity') ? { capacity: args.str('agg-capacity') } : {}),
    taxCapacity: args.str('agg-tax-capacity') ?? '100G',
  });
}
if (runs('guarantees')) {
  await guaranteesBench({
    capacity: parseBandwidth(args.str('guarantee-capacity') ?? '100M', 'capacity'),
    capacities: (args.str('guarantee-capacities') ?? (quick ? '' : '1G,10G'))
      .split(',')
      .filter(Boolean)
      .map((q) => parseBandwidth(q, 'capacity')),
    seconds: args.num('guarantee-seconds', quick ? 5 : 10),
    ...(args.str('guarantee-shards') ? { shards: args.num('guarantee-shards', 1) } : {}),
    dirs: args.list('dirs', 'egress,ingress') as Array<'egress' | 'ingress'>,
    ...(args.str('cc') ? { cc: args.str('cc') } : {}),
  });
}
