/**
 * Probe of issue 42's second candidate: the off-node egress tree on the uplink's own qdisc (`mq`
 * with one htb per transmit queue) against the shards the agent builds (each pod's veth redirecting
 * to one of K ifbs, each with an htb), and the bare path (no qdisc, no redirect), in the same run:
 *
 *   npx tsx bench/probe-uplink-mq.ts [--pods 8] [--queues 4] [--seconds 8] [--rounds 2] [--protos udp200,udp,tcp]
 *
 * A node netns with a bridge, N pod netns on it, and an uplink veth with Q transmit queues to a LAN
 * netns where one iperf3 server per pod receives (its own namespaces and names, all removed after).
 * Each pod sends as fast as it can; the htb classes are at 100 Gbit/s (never binding: the path's
 * cost alone). Printed per case: what the receivers got (packets/s, Gbit/s) and CPU per million
 * packets received (all CPUs' busy time from /proc/stat), each as a ratio to the bare path.
 * Root; traffic only between the namespaces made here.
 */
import { execa } from 'execa';
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';

const { values: o } = parseArgs({
  options: {
    pods: { type: 'string', default: '8' },
    queues: { type: 'string', default: '4' },
    seconds: { type: 'string', default: '8' },
    rounds: { type: 'string', default: '2' },
    protos: { type: 'string', default: 'udp200,udp,tcp' },
  },
});
const N = Number(o.pods);
const Q = Number(o.queues);
const SECONDS = Number(o.seconds);
const ROUNDS = Number(o.rounds);
const PROTOS = (o.protos ?? '').split(',') as Proto[];
type Proto = 'udp200' | 'udp' | 'tcp';
type Layout = 'bare' | 'shards' | 'mq';
const LAYOUTS: Layout[] = ['bare', 'shards', 'mq'];

const p = `pq${randomBytes(2).toString('hex')}`;
const NODE = `${p}n`;
const LAN = `${p}l`;
const pod = (i: number) => `${p}p${i}`;
const UP = `${p}u`;
const ifb = (k: number) => `${p}i${k}`;

const sh = (args: string[], reject = true) => execa(args[0] ?? '', args.slice(1), { reject });
const inNs = (ns: string, args: string[], reject = true) => sh(['ip', 'netns', 'exec', ns, ...args], reject);
const ipb = (ns: string, lines: string[]) => execa('ip', ['-n', ns, '-batch', '-'], { input: `${lines.join('\n')}\n` });
const tcb = (ns: string, lines: string[]) => execa('ip', ['netns', 'exec', ns, 'tc', '-batch', '-'], { input: `${lines.join('\n')}\n` });

async function setUp(): Promise<void> {
  for (const ns of [NODE, LAN, ...Array.from({ length: N }, (_, i) => pod(i))]) await sh(['ip', 'netns', 'add', ns]);
  await inNs(NODE, ['sysctl', '-qw', 'net.ipv4.ip_forward=1']);
  await ipb(NODE, [
    'link set lo up',
    `link add ${p}br type bridge`,
    `link set ${p}br up`,
    `addr add 10.123.0.1/24 dev ${p}br`,
    `link add ${UP} numtxqueues ${Q} numrxqueues ${Q} type veth peer name eth0 numtxqueues ${Q} numrxqueues ${Q} netns ${LAN}`,
    `link set ${UP} up`,
    `addr add 10.124.0.1/24 dev ${UP}`,
    ...Array.from({ length: N }, (_, i) => [
      `link add ${p}v${i} type veth peer name eth0 netns ${pod(i)}`,
      `link set ${p}v${i} master ${p}br up`,
    ]).flat(),
    ...Array.from({ length: Q }, (_, k) => [`link add ${ifb(k)} type ifb`, `link set ${ifb(k)} up`]).flat(),
  ]);
  await ipb(LAN, ['link set lo up', 'link set eth0 up', 'addr add 10.124.0.2/24 dev eth0', 'route add 10.123.0.0/24 via 10.124.0.1']);
  for (let i = 0; i < N; i++)
    await ipb(pod(i), [
      'link set lo up',
      'link set eth0 up',
      `addr add 10.123.0.${10 + i}/24 dev eth0`,
      'route add default via 10.123.0.1',
    ]);
  // Each shard's tree: an htb with one class that never binds.
  await tcb(
    NODE,
    Array.from({ length: Q }, (_, k) => [
      `qdisc add dev ${ifb(k)} root handle 1: htb default 1`,
      `class add dev ${ifb(k)} parent 1: classid 1:1 htb rate 100gbit ceil 100gbit`,
    ]).flat(),
  );
}

async function tearDown(): Promise<void> {
  for (const ns of [NODE, LAN, ...Array.from({ length: N }, (_, i) => pod(i))]) await sh(['ip', 'netns', 'del', ns], false);
}

/** Puts the layout's objects in place (and removes the other layouts'). */
async function layout(l: Layout): Promise<void> {
  const lines: string[] = [];
  for (let i = 0; i < N; i++) lines.push(`qdisc del dev ${p}v${i} ingress`);
  lines.push(`qdisc del dev ${UP} root`);
  await execa('ip', ['netns', 'exec', NODE, 'tc', '-force', '-batch', '-'], { input: `${lines.join('\n')}\n`, reject: false });
  if (l === 'shards')
    await tcb(
      NODE,
      Array.from({ length: N }, (_, i) => [
        `qdisc add dev ${p}v${i} ingress`,
        `filter add dev ${p}v${i} parent ffff: protocol all u32 match u32 0 0 action mirred egress redirect dev ${ifb(i % Q)}`,
      ]).flat(),
    );
  if (l === 'mq')
    await tcb(NODE, [
      `qdisc add dev ${UP} root handle 1: mq`,
      ...Array.from({ length: Q }, (_, k) => [
        `qdisc add dev ${UP} parent 1:${(k + 1).toString(16)} handle ${(16 + k).toString(16)}: htb default 1`,
        `class add dev ${UP} parent ${(16 + k).toString(16)}: classid ${(16 + k).toString(16)}:1 htb rate 100gbit ceil 100gbit`,
      ]).flat(),
    ]);
}

/** Packets each of the layout's htbs has sent so far (the shards' ifbs, or the uplink's per-queue htbs). */
async function carried(l: Layout): Promise<number[]> {
  const devs = l === 'shards' ? Array.from({ length: Q }, (_, k) => ifb(k)) : [UP];
  const out: number[] = [];
  for (const dev of devs) {
    const qs = JSON.parse((await inNs(NODE, ['tc', '-s', '-j', 'qdisc', 'show', 'dev', dev])).stdout) as Array<{
      kind: string;
      packets: number;
    }>;
    out.push(...qs.filter((q) => q.kind === 'htb').map((q) => q.packets));
  }
  return out;
}

/** All CPUs' busy jiffies (user, nice, system, irq, softirq) and the USER_HZ. */
function busyJiffies(): number {
  const f = (readFileSync('/proc/stat', 'utf8').split('\n')[0] ?? '').split(/\s+/).slice(1).map(Number);
  return (f[0] ?? 0) + (f[1] ?? 0) + (f[2] ?? 0) + (f[5] ?? 0) + (f[6] ?? 0);
}

interface Run {
  pps: number;
  gbps: number;
  /** CPU time per packet sent (the qdiscs see every sent packet; UDP loses some at the receivers' sockets after them) */
  cpuUsPerPkt: number;
  /** busy cores over the run */
  cores: number;
}

async function traffic(proto: Proto): Promise<Run> {
  const servers = Array.from({ length: N }, (_, i) =>
    execa('ip', ['netns', 'exec', LAN, 'iperf3', '-s', '-1', '-p', String(5201 + i)], { reject: false }),
  );
  await new Promise((r) => setTimeout(r, 700));
  const udp = proto !== 'tcp' ? ['-u', '-b', '0', '-l', proto === 'udp200' ? '200' : '1400'] : [];
  const j0 = busyJiffies();
  const t0 = performance.now();
  const clients = await Promise.all(
    Array.from({ length: N }, (_, i) =>
      execa('ip', ['netns', 'exec', pod(i), 'iperf3', '-c', '10.124.0.2', '-p', String(5201 + i), '-t', String(SECONDS), '-J', ...udp], {
        reject: false,
        timeout: (SECONDS + 20) * 1000,
      }),
    ),
  );
  const wall = (performance.now() - t0) / 1000;
  const cpuS = (busyJiffies() - j0) / 100;
  await Promise.all(servers.map((s) => s.catch(() => undefined)));
  let pkts = 0;
  let sent = 0;
  let bytes = 0;
  for (const c of clients) {
    const r = JSON.parse(c.stdout || '{}') as {
      error?: string;
      end?: {
        sum?: { packets?: number; lost_packets?: number; bytes?: number; lost_percent?: number };
        sum_received?: { bytes: number };
        sum_sent?: { bytes: number };
      };
    };
    if (r.error || !r.end) throw new Error(`iperf3 failed: ${r.error ?? c.stderr}`);
    if (proto === 'tcp') {
      const b = r.end.sum_received?.bytes ?? 0;
      bytes += b;
      pkts += b / 1448;
      sent += b / 1448;
    } else {
      const got = (r.end.sum?.packets ?? 0) - (r.end.sum?.lost_packets ?? 0);
      sent += r.end.sum?.packets ?? 0;
      pkts += got;
      bytes += got * (proto === 'udp200' ? 200 : 1400);
    }
  }
  return { pps: pkts / SECONDS, gbps: (bytes * 8) / SECONDS / 1e9, cpuUsPerPkt: (cpuS / sent) * 1e6, cores: cpuS / wall };
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? (s[m] ?? 0) : ((s[m - 1] ?? 0) + (s[m] ?? 0)) / 2;
};

async function main(): Promise<void> {
  await setUp();
  try {
    console.log(`probe: ${N} pods, uplink with ${Q} tx queues, ${Q} shard ifbs, ${SECONDS} s a run, ${ROUNDS} rounds (medians)`);
    console.log('| proto | layout | pkt/s | Gbit/s | busy cores | CPU µs per packet sent | pkt/s vs bare | CPU/pkt vs bare |');
    console.log('|---|---|---|---|---|---|---|---|');
    const spread: string[] = [];
    for (const proto of PROTOS) {
      const runs = new Map<Layout, Run[]>(LAYOUTS.map((l) => [l, []]));
      for (let r = 0; r < ROUNDS; r++) {
        // Alternate the order, so no layout always runs first.
        for (const l of r % 2 ? [...LAYOUTS].reverse() : LAYOUTS) {
          await layout(l);
          runs.get(l)?.push(await traffic(proto));
          if (r === 0 && l !== 'bare') spread.push(`${proto} ${l}: ${(await carried(l)).join(' / ')} packets`);
        }
      }
      const med = (l: Layout, k: keyof Run) => median((runs.get(l) ?? []).map((x) => x[k]));
      for (const l of LAYOUTS)
        console.log(
          `| ${proto} | ${l} | ${med(l, 'pps').toFixed(0)} | ${med(l, 'gbps').toFixed(2)} | ${med(l, 'cores').toFixed(2)} | ${med(l, 'cpuUsPerPkt').toFixed(2)} | ${(med(l, 'pps') / med('bare', 'pps')).toFixed(3)}x | ${(med(l, 'cpuUsPerPkt') / med('bare', 'cpuUsPerPkt')).toFixed(3)}x |`,
        );
    }
    console.log(`How the first round spread over the ${Q} htbs (cumulative):\n${spread.join('\n')}`);
  } finally {
    await tearDown();
  }
}

await main();
