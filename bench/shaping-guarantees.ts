/**
 * bench/shaping.ts (6), `--only guarantees`: bandwidth as a resource of the node (issue 33). The
 * Shaper with a node capacity (its tree: sizing.ts TreeParams), pods of a throwaway topology
 * (test/kit/topo.ts) sending TCP at once to a receiver pod outside the tree (it stands for the
 * LAN: its own traffic never enters the node's tree), each pod's rate on the wire read from its htb
 * class's byte counters (netlink, every 100 ms), the figures the tree enforces.
 *
 * - guarantees: capacity C, three saturating pods with guarantees 0.6C / 0.2C / none, ceilings C:
 *   each pod's rate over 10 s >= its guarantee -2 %, the sum C ±2 %.
 * - borrow: the same pods, the 0.6C pod stops after 5 s: the time until the other two carry
 *   >= 0.98 C (500 ms windows) is <= 2 s.
 * - priority: two pods without guarantees, bands 0 (Guaranteed QoS) and 2 (BestEffort), ceilings
 *   C: the band 0 pod gets >= 75 % of the sum.
 * - namespace: three pods of one namespace whose total is C/2, saturating, without guarantees or
 *   ceilings of their own: the sum C/2 ±2 %, the pods' shares within 10 % of each other.
 * - the same three at 1G and 10G capacity (`--guarantee-capacities`): how close to the capacity the
 *   tree runs on this machine, and the node's system CPU per Gbit/s.
 * The Shaper has the agent's default shards (2 per CPU, `--guarantee-shards N` for another count):
 * the pods are on different shards, so every goal holds across shards through the shares
 * (shares.ts, groups.ts), as on a node.
 * Usage: npx tsx bench/shaping.ts --only guarantees [--guarantee-capacity 100M] [--guarantee-capacities 1G,10G] [--guarantee-seconds 10] [--guarantee-shards N]
 */
import { formatBandwidth } from '../src/bandwidth/limits.js';
import type { BandwidthLimits } from '../src/bandwidth/limits.js';
import { classList } from '../src/netlink/index.js';
import { Shaper } from '../src/shaper/tc.js';
import { shardsFor } from '../src/shaper/shard-names.js';
import { availableParallelism } from 'node:os';
import { delIfbs } from '../test/kit/kernel.js';
import { iperf, makeTopology, type TopoPod } from '../test/kit/topo.js';
import { withTrafficLock } from '../test/kit/traffic-lock.js';
import { printTable } from '../test/kit/bench-kit.js';
import { readFile } from 'node:fs/promises';

export interface GuaranteesOptions {
  capacity: number;
  /** More capacities for the "how close to it" table. */
  capacities: number[];
  seconds: number;
  dirs: Dir[];
  /** The flows' TCP congestion control (iperf3 -C); default: the node's. */
  cc?: string;
  /** Run only these parts. */
  parts?: string[];
  /** Shards each way (the agent's default on this machine when unset: 2 per CPU), each pod on its own while there are enough. */
  shards?: number;
}

type Dir = 'egress' | 'ingress';

/** A pod's ask one way: ceiling, guarantee, band. */
function ask(dir: Dir, ceil: number, guarantee: number | undefined, band: number): BandwidthLimits {
  return dir === 'egress'
    ? { egress: ceil, ...(guarantee ? { egressGuarantee: guarantee } : {}), priority: band }
    : { ingress: ceil, ...(guarantee ? { ingressGuarantee: guarantee } : {}), priority: band };
}

interface Flow {
  pod: TopoPod;
  limits: BandwidthLimits;
  /** Seconds the pod sends. */
  seconds: number;
  /** Its namespace (a total in its limits puts it under the namespace's class). */
  group?: string;
}

/** Counter samples of each pod's class: [ms since start, bytes]. */
type Samples = Map<string, Array<[number, number]>>;

const mbit = (bps: number) => (bps / 1e6).toFixed(1);

/** Busy CPU (all but idle and iowait) in jiffies, and the wall clock. */
async function cpuBusy(): Promise<{ busy: number; at: number }> {
  const f = (await readFile('/proc/stat', 'utf8')).split('\n')[0]?.trim().split(/\s+/).slice(1).map(Number) ?? [];
  const total = f.reduce((a, b) => a + b, 0);
  return { busy: total - (f[3] ?? 0) - (f[4] ?? 0), at: performance.now() };
}

/** Rate over [from, to) ms from a pod's samples (the samples nearest the window's ends). */
function rateBetween(s: Array<[number, number]>, from: number, to: number): number {
  const near = (t: number) => s.reduce((best, x) => (Math.abs(x[0] - t) < Math.abs(best[0] - t) ? x : best), s[0] ?? [0, 0]);
  const [a, b] = [near(from), near(to)];
  return b[0] > a[0] ? ((b[1] - a[1]) * 8) / ((b[0] - a[0]) / 1000) : NaN;
}

class World {
  readonly shaper: Shaper;
  constructor(
    readonly ifb: string,
    readonly senders: TopoPod[],
    readonly receiver: TopoPod,
    capacity: number,
    readonly cc?: string,
    shards = 1,
  ) {
    this.shaper = new Shaper({ ifbName: ifb, capacity: { egress: capacity, ingress: capacity }, shards });
  }

  /**
   * The flows at once (each pod shaped as asked, the others removed first), sampling every pod's
   * class bytes every 100 ms; returns the samples and the node's busy CPU cores over the run.
   */
  async run(dir: Dir, flows: Flow[]): Promise<{ samples: Samples; cores: number }> {
    for (const f of flows)
      await this.shaper.ensure({
        id: f.pod.id,
        hostVeth: f.pod.hostVeth,
        ips: [f.pod.ip4, f.pod.ip6],
        limits: f.limits,
        ...(f.group ? { group: f.group } : {}),
      });
    const states = new Map(this.shaper.states().map((st) => [st.id, st]));
    const ids = new Map(
      flows.map((f) => [
        f.pod.id,
        0x10000 + ((dir === 'egress' ? states.get(f.pod.id)?.classId : states.get(f.pod.id)?.ingressClassId) ?? 0),
      ]),
    );
    // Each pod's class is on its own shard's ifb.
    const devOf = (id: string) => (dir === 'egress' ? this.shaper.ifbOfPod(id) : this.shaper.inIfbOfPod(id)) ?? '';
    const devs = new Set(flows.map((f) => devOf(f.pod.id)));
    console.log(`  ${dir}: ${flows.map((f) => `${f.pod.id} on ${devOf(f.pod.id)}`).join(', ')}`);
    const samples: Samples = new Map(flows.map((f) => [f.pod.id, []]));
    // Everything from the moment the lock is ours (another suite's measurement may hold it first).
    return withTrafficLock(async () => {
      const t0 = performance.now();
      const sample = () => {
        const at = performance.now() - t0;
        const byDev = new Map([...devs].map((dev) => [dev, new Map(classList(dev).map((c) => [c.handle, c.bytes]))]));
        for (const [id, h] of ids) samples.get(id)?.push([at, byDev.get(devOf(id))?.get(h) ?? 0]);
      };
      sample();
      const timer = setInterval(sample, 100);
      const c0 = await cpuBusy();
      try {
        await Promise.all(
          flows.map((f) =>
            iperf(this.receiver, f.pod, { seconds: f.seconds, reverse: dir !== 'egress', ...(this.cc ? { congestion: this.cc } : {}) }),
          ),
        );
      } finally {
        clearInterval(timer);
      }
      const c1 = await cpuBusy();
      sample();
      // USER_HZ is 100 on Linux: jiffies / 100 = CPU seconds.
      return { samples, cores: (c1.busy - c0.busy) / 100 / ((c1.at - c0.at) / 1000) };
    });
  }

  async close(): Promise<void> {
    await this.shaper.reset().catch(() => undefined);
    this.shaper.close();
  }
}

/** (6) See the module doc. Returns the number of goals missed. */
export async function guaranteesBench(o: GuaranteesOptions): Promise<number> {
  const topo = await makeTopology(4);
  const [a, b, c, r] = topo.pods as [TopoPod, TopoPod, TopoPod, TopoPod];
  let misses = 0;
  const goal = (what: string, ok: boolean, figures: string) => {
    if (!ok) misses++;
    console.log(`goal ${what}: ${ok ? 'PASS' : 'MISS'} ${figures}`);
  };
  const rows: string[][] = [];
  try {
    for (const cap of [o.capacity, ...o.capacities]) {
      const ifb = `kgb${topo.tag}`;
      const w = new World(ifb, [a, b, c], r, cap, o.cc, o.shards ?? shardsFor(0, availableParallelism()));
      try {
        await w.shaper.init();
        for (const dir of o.dirs) {
          const C = formatBandwidth(cap);
          // Guarantees 0.6C / 0.2C / none, ceilings C, all saturating.
          const asks: Array<[TopoPod, number | undefined]> = [
            [a, 0.6 * cap],
            [b, 0.2 * cap],
            [c, undefined],
          ];
          const seconds = o.seconds + 2;
          const { samples, cores } = await w.run(
            dir,
            asks.map(([pod, g]) => ({ pod, limits: ask(dir, cap, g, 1), seconds })),
          );
          const rates = asks.map(([pod]) => rateBetween(samples.get(pod.id) ?? [], 1500, 1500 + o.seconds * 1000));
          const sum = rates.reduce((x, y) => x + y, 0);
          rows.push([
            C,
            dir,
            ...rates.map(mbit),
            mbit(sum),
            `${((sum / cap) * 100).toFixed(1)}%`,
            cores.toFixed(2),
            (cores / (sum / 1e9)).toFixed(2),
          ]);
          // Every pod shaped only the way measured next.
          for (const p of [a, b, c]) await w.shaper.remove(p.id);
          if (cap !== o.capacity) continue;
          const within = asks.every(([, g], i) => g === undefined || (rates[i] ?? 0) >= 0.98 * g);
          goal(
            `${dir} guarantees at capacity ${C} (each pod >= its guarantee -2 %)`,
            within,
            asks.map(([, g], i) => `${g ? formatBandwidth(g) : 'none'}: ${mbit(rates[i] ?? NaN)}`).join(', ') + ' Mbit/s',
          );
          goal(
            `${dir} sum at capacity ${C} (within ±2 %)`,
            Math.abs(sum / cap - 1) <= 0.02,
            `${mbit(sum)} Mbit/s = ${(sum / cap).toFixed(3)}x`,
          );

          // Borrow: the 0.6C pod stops after 5 s; the others take its share.
          const stopAt = 5;
          const borrow = await w.run(dir, [
            { pod: a, limits: ask(dir, cap, 0.6 * cap, 1), seconds: stopAt },
            { pod: b, limits: ask(dir, cap, 0.2 * cap, 1), seconds: stopAt + 5 },
            { pod: c, limits: ask(dir, cap, undefined, 1), seconds: stopAt + 5 },
          ]);
          const sa = borrow.samples.get(a.id) ?? [];
          // A's end: its last sample that still moved.
          let end = 0;
          for (let i = 1; i < sa.length; i++) if ((sa[i]?.[1] ?? 0) > (sa[i - 1]?.[1] ?? 0)) end = sa[i]?.[0] ?? end;
          const sb = borrow.samples.get(b.id) ?? [];
          const sc = borrow.samples.get(c.id) ?? [];
          let took = NaN;
          for (let t = end; t + 500 <= (sb.at(-1)?.[0] ?? 0); t += 100) {
            if (rateBetween(sb, t, t + 500) + rateBetween(sc, t, t + 500) >= 0.98 * cap) {
              took = (t + 500 - end) / 1000;
              break;
            }
          }
          goal(
            `${dir} borrow at capacity ${C} (the others carry >= 0.98x within 2 s of the 0.6C pod going idle)`,
            took <= 2,
            `${Number.isNaN(took) ? 'never' : `${took.toFixed(1)} s`}`,
          );

          // Priority: bands 0 and 2, no guarantees.
          const prio = await w.run(dir, [
            { pod: a, limits: ask(dir, cap, undefined, 0), seconds },
            { pod: b, limits: ask(dir, cap, undefined, 2), seconds },
          ]);
          const hi = rateBetween(prio.samples.get(a.id) ?? [], 1500, 1500 + o.seconds * 1000);
          const lo = rateBetween(prio.samples.get(b.id) ?? [], 1500, 1500 + o.seconds * 1000);
          goal(
            `${dir} priority at capacity ${C} (band 0 >= 75 % of what two pods without guarantees get)`,
            hi / (hi + lo) >= 0.75,
            `band 0 ${mbit(hi)}, band 2 ${mbit(lo)} Mbit/s: ${((hi / (hi + lo)) * 100).toFixed(1)} %`,
          );
          for (const p of [a, b, c]) await w.shaper.remove(p.id);

          // A namespace capped at C/2, its three pods saturating, no guarantees or ceilings of their own.
          const total = cap / 2;
          const ns = await w.run(
            dir,
            [a, b, c].map((pod) => ({
              pod,
              limits: dir === 'egress' ? { egressTotal: total, priority: 1 } : { ingressTotal: total, priority: 1 },
              seconds,
              group: 'bench-ns',
            })),
          );
          const shares = [a, b, c].map((p) => rateBetween(ns.samples.get(p.id) ?? [], 1500, 1500 + o.seconds * 1000));
          const nsSum = shares.reduce((x, y) => x + y, 0);
          goal(
            `${dir} namespace total ${formatBandwidth(total)} at capacity ${C} (sum within ±2 %)`,
            Math.abs(nsSum / total - 1) <= 0.02,
            `${mbit(nsSum)} Mbit/s = ${(nsSum / total).toFixed(3)}x`,
          );
          const spread = Math.max(...shares) / Math.min(...shares) - 1;
          goal(
            `${dir} namespace total ${formatBandwidth(total)}: pods' shares within 10 % of each other`,
            spread <= 0.1,
            `${shares.map(mbit).join(' / ')} Mbit/s (largest/smallest - 1 = ${(spread * 100).toFixed(1)} %)`,
          );
          for (const p of [a, b, c]) await w.shaper.remove(p.id);
        }
      } finally {
        await w.close();
        await delIfbs(ifb);
      }
    }
    printTable(
      `(6) guarantees 0.6C / 0.2C / none, ceilings C, three saturating TCP flows, wire rates from the pods' class counters over ${o.seconds} s; CPU = the node's busy cores over the run`,
      ['capacity C', 'dir', '0.6C pod', '0.2C pod', 'no-guarantee pod', 'sum Mbit/s', 'sum/C', 'busy cores', 'cores per Gbit/s'],
      rows,
    );
  } finally {
    await topo.destroy();
  }
  return misses;
}
