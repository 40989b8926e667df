/**
 * What a pod's shaping really did, from the kernel's own tc counters: per shaped direction, the
 * pod's htb class (at the pod's limit) and its two leaves (interactive, bulk) summed into one set of
 * figures.
 *
 * - bytes, packets: what the pod's class sent (dequeued), so what got through the limit. L2 frames
 *   as the device carries them (Ethernet header included, no FCS): a TCP flow's payload is ~95.6 %
 *   of this at MTU 1500 (1448 of 1514 bytes per full segment with timestamps).
 * - drops: packets the pod's queues dropped (htb counts them on the leaf that refused them).
 * - overlimits: times the pod's class hit its limit and had to wait (htb's count on that class).
 * - backlog: bytes queued in the pod's leaves now.
 * - limit: the class's rate as the kernel holds it, bits/s (htb keeps bytes/s).
 *
 * `CounterReader` reads them for every shaped pod at once, over a netlink socket of its own
 * (src/netlink StatsSocket, asynchronous), and reads again only what can have changed since its
 * last read. It starts with ONE dump of every link's counters (the host veths' and the ifb's):
 * - TO the pod (the veth's htb): a packet leaves the veth's classes only by the veth's transmit,
 *   which the veth counts. A veth whose counters are those of the last read, whose leaves held
 *   nothing then, and whose limit is the same, has the same class counters: they are not read
 *   again. The others' three classes are asked by handle, all pods' requests in one datagram.
 * - FROM the pod (the htb of the pod's egress shard's ifb): a packet leaves any class of an ifb only
 *   through the ifb's transmit, which the ifb counts. While an ifb's counters stay those of the last
 *   read and none of its pods' leaves held anything, no class of it changed; once they move, ONE
 *   dump of that ifb's classes reads them all (a pod's counters cannot be told from its veth alone:
 *   the ifb classifies by source address, so a pod sending with another's address moves the
 *   other's). Pods not read before (new, re-shaped) are asked by handle while their ifb is still.
 * Exact at each read, as far as a read of many devices one after the other can be: a packet between
 * a link's counter and its class (microseconds) is seen by the next read. Measured:
 * docs/shaping.md, "What a /metrics scrape costs".
 */
import { NetlinkError } from '../errors.js';
import * as nl from '../netlink/index.js';
import type { ClassAnswer, LinkStats, TcClassStats } from '../netlink/index.js';
import { ifbClassIds, VETH, type CounterBase, type OutsideCount, type ShapingState } from './tc-layout.js';

export interface DirectionCounters {
  limit: number;
  bytes: number;
  packets: number;
  drops: number;
  overlimits: number;
  backlog: number;
}

/** One shaped pod's counters; a direction is absent when it is not shaped (or its device is gone). */
export interface ShapingCounters {
  id: string;
  hostVeth: string;
  ingress?: DirectionCounters;
  egress?: DirectionCounters;
}

/** One read: every shaped pod's counters, and every link's own counters by ifindex (the same dump). */
export interface CounterSnapshot {
  pods: ShapingCounters[];
  links: Map<number, LinkStats>;
}

/** What the last read asked the kernel, beyond its link dump (tests, benches). */
export interface ReadWork {
  /** Classes asked by handle. */
  classGets: number;
  /** How many ifbs' classes were dumped. */
  ifbDumps: number;
}

/** tc handle "major:minor" as the kernel's 32-bit number. */
export function tcHandle(major: number, minor: number): number {
  return ((major << 16) | minor) >>> 0;
}

export function byHandle(classes: TcClassStats[]): Map<number, TcClassStats> {
  return new Map(classes.map((c) => [c.handle >>> 0, c]));
}

/** One direction from its pod class and leaf classes; undefined without the pod class. */
export function directionCounters(pod: TcClassStats | undefined, leaves: Array<TcClassStats | undefined>): DirectionCounters | undefined {
  if (!pod) return undefined;
  let drops = pod.drops;
  let backlog = pod.backlog;
  for (const l of leaves) {
    if (!l) continue;
    drops += l.drops;
    backlog += l.backlog;
  }
  return { limit: pod.ceil ?? pod.rate ?? 0, bytes: pod.bytes, packets: pod.packets, drops, overlimits: pod.overlimits, backlog };
}

/** A direction's counters since `base` (classes taken over from an earlier pod); never below zero. */
export function sinceBase(d: DirectionCounters, base: CounterBase): DirectionCounters {
  const since = (now: number, then: number) => Math.max(0, now - then);
  return {
    ...d,
    bytes: since(d.bytes, base.bytes),
    packets: since(d.packets, base.packets),
    drops: since(d.drops, base.drops),
    overlimits: since(d.overlimits, base.overlimits),
  };
}

/** Whether a link's transmit counters (and with `rx`, its receive counters too) are the same in both. */
function sameLink(a: LinkStats | undefined, b: LinkStats | undefined, rx: boolean): boolean {
  if (!a || !b || a.txPackets !== b.txPackets || a.txBytes !== b.txBytes || a.txDropped !== b.txDropped) return false;
  return !rx || (a.rxPackets === b.rxPackets && a.rxBytes === b.rxBytes && a.rxDropped === b.rxDropped);
}

/** The pod class and its two leaves on the veth (2:1, 2:2, 2:3: ingress without its tree) or on an ifb (1:<id>, ...). */
function classHandles(dir: 'ingress' | 'egress', classId: number): [number, number, number] {
  if (dir === 'ingress' && !classId) return [tcHandle(2, 1), tcHandle(2, 2), tcHandle(2, VETH.bulkMinor)];
  const ids = ifbClassIds(classId);
  return [tcHandle(1, ids.pod), tcHandle(1, ids.interactive), tcHandle(1, ids.bulk)];
}

/** A direction as last read: what it was read under (its device or class id, limit, burst), and its counters (undefined: no pod class). */
interface Read {
  /** Ingress: the veth's ifindex (minus the class id in the ingress tree); egress: the class id. */
  where: number;
  limit: number | undefined;
  burst: number | undefined;
  counters: DirectionCounters | undefined;
  /** The veth's counters the read was made after (ingress only). */
  link?: LinkStats;
  /** The read (CounterReader.generation) that last saw the pod. */
  seen: number;
}

/** Whether `r` was read under what the pod has now. */
const readUnder = (r: Read | undefined, where: number, limit: number | undefined, burst: number | undefined): r is Read =>
  r !== undefined && r.where === where && r.limit === limit && r.burst === burst;

/** When more pods than this share of the ifb's are to be asked by handle, one dump is cheaper. */
const IFB_DUMP_SHARE = 1 / 3;

export class CounterReader {
  private sock: nl.StatsSocket | undefined;
  private tail: Promise<unknown> = Promise.resolve();
  private readonly reads = { ingress: new Map<string, Read>(), egress: new Map<string, Read>() };
  /** Each egress shard's ifb as last read, by name. */
  private ifbSeen = new Map<string, { ifindex: number; stats: LinkStats }>();
  private work: ReadWork = { classGets: 0, ifbDumps: 0 };
  private generation = 0;

  /** What the last read asked the kernel beyond the link dump. */
  lastWork(): ReadWork {
    return { ...this.work };
  }

  /**
   * The counters of the given pods' shaping (`ifbOf` names a state's egress ifb; `ifindex(pod)` names
   * a pod's veth by index when known, else its name is resolved), and every link's counters. A
   * device that is gone gives no figures for its direction. Reads run one at a time.
   */
  read(
    states: ShapingState[],
    ifbOf: (s: ShapingState) => string,
    ifindex?: (podId: string) => number | undefined,
    inIfbOf?: (s: ShapingState) => string | undefined,
  ): Promise<CounterSnapshot> {
    const run = this.tail.then(() => this.readNow(states, ifbOf, ifindex, inIfbOf));
    this.tail = run.catch(() => undefined);
    return run;
  }

  private async readNow(
    states: ShapingState[],
    ifbOf: (s: ShapingState) => string,
    ifindex?: (podId: string) => number | undefined,
    inIfbOf?: (s: ShapingState) => string | undefined,
  ): Promise<CounterSnapshot> {
    this.sock ??= nl.StatsSocket.open();
    try {
      return await this.readWith(this.sock, states, ifbOf, ifindex, inIfbOf);
    } catch (err) {
      // The socket's state is unknown, and so is what was read before: start again.
      this.close();
      throw err;
    }
  }

  private async readWith(
    sock: nl.StatsSocket,
    states: ShapingState[],
    ifbOf: (s: ShapingState) => string,
    ifindex?: (podId: string) => number | undefined,
    inIfbOf?: (s: ShapingState) => string | undefined,
  ): Promise<CounterSnapshot> {
    const links = await sock.linkStats();
    const work: ReadWork = { classGets: 0, ifbDumps: 0 };
    // What was read before is updated in place (a pod's entry replaced when read again), and what
    // no pod claims any more dropped at the end: nothing is allocated for idle pods.
    const gen = ++this.generation;
    const reads = this.reads;
    const gets: Array<{
      dir: 'ingress' | 'egress';
      id: string;
      where: number;
      limit: number | undefined;
      burst: number | undefined;
      link?: LinkStats;
      at: number;
    }> = [];
    const refs: nl.ClassRef[] = [];
    const ask = (
      dir: 'ingress' | 'egress',
      id: string,
      where: number,
      limit: number | undefined,
      burst: number | undefined,
      dev: number,
      classId: number,
      link?: LinkStats,
    ) => {
      gets.push({ dir, id, where, limit, burst, at: refs.length, ...(link ? { link } : {}) });
      for (const handle of classHandles(dir, classId)) refs.push({ ifindex: dev, handle });
    };

    // The pod's ingress shard's ifb, when it is in a tree; the veth's counters still tell whether a pod's moved.
    const inIndex = new Map<string, number | undefined>();
    const inIfbIndex = (name: string | undefined): number | undefined => {
      if (name === undefined) return undefined;
      if (!inIndex.has(name)) inIndex.set(name, nl.linkIndexByName(name));
      return inIndex.get(name);
    };
    for (const s of states) {
      if (!s.ingressInstalled) continue;
      const dev = ifindex?.(s.id) ?? (s.hostVeth ? nl.linkIndexByName(s.hostVeth) : undefined);
      const link = dev ? links.get(dev) : undefined;
      if (!dev || !link) continue; // gone
      const inTree = s.ingressClassId ?? 0;
      const inIfb = inTree ? inIfbIndex(inIfbOf?.(s)) : undefined;
      if (inTree && !inIfb) continue;
      const where = inTree ? -inTree : dev;
      const last = reads.ingress.get(s.id);
      if (readUnder(last, where, s.limits.ingress, s.limits.ingressBurst) && !last.counters?.backlog && sameLink(last.link, link, false))
        last.seen = gen;
      else ask('ingress', s.id, where, s.limits.ingress, s.limits.ingressBurst, inTree ? (inIfb ?? 0) : dev, inTree, link);
    }

    // Each egress shard on its own: its pods, its ifb's counters, one dump of it when they moved.
    const shards = new Map<string, ShapingState[]>();
    for (const s of states) {
      if (!s.egressInstalled || !s.classId) continue;
      const name = ifbOf(s);
      const list = shards.get(name);
      if (list) list.push(s);
      else shards.set(name, [s]);
    }
    const seen = new Map<string, { ifindex: number; stats: LinkStats }>();
    const known = (s: ShapingState) => readUnder(reads.egress.get(s.id), s.classId, s.limits.egress, s.limits.egressBurst);
    for (const [ifbName, egress] of shards) {
      const ifb = nl.linkIndexByName(ifbName);
      const ifbStats = ifb ? links.get(ifb) : undefined;
      if (!ifb || !ifbStats) continue; // gone
      const last = this.ifbSeen.get(ifbName);
      const still =
        last?.ifindex === ifb && sameLink(last.stats, ifbStats, true) && !egress.some((s) => reads.egress.get(s.id)?.counters?.backlog);
      const unknown = still ? egress.filter((s) => !known(s)).length : egress.length;
      if (unknown > 0 && (!still || unknown > egress.length * IFB_DUMP_SHARE)) {
        const all = byHandle(await sock.classDump(ifb));
        work.ifbDumps++;
        for (const s of egress) {
          const [pod, int, bulk] = classHandles('egress', s.classId);
          reads.egress.set(s.id, {
            where: s.classId,
            limit: s.limits.egress,
            burst: s.limits.egressBurst,
            counters: directionCounters(all.get(pod), [all.get(int), all.get(bulk)]),
            seen: gen,
          });
        }
      } else {
        for (const s of egress) {
          const read = reads.egress.get(s.id);
          if (readUnder(read, s.classId, s.limits.egress, s.limits.egressBurst)) read.seen = gen;
          else ask('egress', s.id, s.classId, s.limits.egress, s.limits.egressBurst, ifb, s.classId);
        }
      }
      seen.set(ifbName, { ifindex: ifb, stats: ifbStats });
    }
    this.ifbSeen = seen;

    if (refs.length > 0) {
      const answers = await sock.classGet(refs);
      work.classGets = refs.length;
      const cls = (a: ClassAnswer | undefined) => (a === undefined || a instanceof NetlinkError ? undefined : a);
      for (const g of gets) {
        const [pod, int, bulk] = [answers[g.at], answers[g.at + 1], answers[g.at + 2]];
        if (pod instanceof NetlinkError && pod.errno === nl.E.ENODEV) continue; // the device went meanwhile
        reads[g.dir].set(g.id, {
          where: g.where,
          limit: g.limit,
          burst: g.burst,
          counters: directionCounters(cls(pod), [cls(int), cls(bulk)]),
          ...(g.link ? { link: g.link } : {}),
          seen: gen,
        });
      }
    }
    for (const m of [reads.ingress, reads.egress]) for (const [id, r] of m) if (r.seen !== gen) m.delete(id);
    this.work = work;

    const pods: ShapingCounters[] = [];
    for (const s of states) {
      const c: ShapingCounters = { id: s.id, hostVeth: s.hostVeth };
      // A pod that spent time outside its trees (steering.ts): what its veth carried then, added.
      const link = s.outside ? links.get(ifindex?.(s.id) ?? nl.linkIndexByName(s.hostVeth) ?? 0) : undefined;
      const ingress = s.ingressInstalled ? reads.ingress.get(s.id)?.counters : undefined;
      if (ingress)
        c.ingress = withOutside(
          s.ingressClassId && s.ingressBase ? sinceBase(ingress, s.ingressBase) : ingress,
          s.outside?.ingress,
          link,
          'ingress',
        );
      const egress = s.egressInstalled && s.classId ? reads.egress.get(s.id)?.counters : undefined;
      if (egress) c.egress = withOutside(s.egressBase ? sinceBase(egress, s.egressBase) : egress, s.outside?.egress, link, 'egress');
      pods.push(c);
    }
    return { pods, links };
  }

  /** Closes the socket (the next read opens another) and forgets what was read. */
  close(): void {
    this.sock?.close();
    this.sock = undefined;
    this.reads.ingress = new Map();
    this.reads.egress = new Map();
    this.ifbSeen = new Map();
  }
}

/** A veth's counter of a pod's direction: what it received from the pod (egress) or sent to it (ingress). */
export function vethCount(link: LinkStats, dir: 'ingress' | 'egress'): { bytes: number; packets: number } {
  return dir === 'egress' ? { bytes: link.rxBytes, packets: link.rxPackets } : { bytes: link.txBytes, packets: link.txPackets };
}

/**
 * A direction's figures with what the pod sent or received outside its tree (ShapingState.outside):
 * the earlier spells, and the one under way as far as its veth counted it (`link`: its counters now).
 */
export function withOutside(
  d: DirectionCounters,
  o: OutsideCount | undefined,
  link: LinkStats | undefined,
  dir: 'ingress' | 'egress',
): DirectionCounters {
  if (!o) return d;
  let { bytes, packets } = o.carried;
  if (o.from && link) {
    const now = vethCount(link, dir);
    bytes += Math.max(0, now.bytes - o.from.bytes);
    packets += Math.max(0, now.packets - o.from.packets);
  }
  return { ...d, bytes: d.bytes + bytes, packets: d.packets + packets };
}

/** What the pod classes of `classId` on `ifb` have counted so far (one netlink get per class): the base of a pod taking them over. */
export function classBaseline(ifb: string, classId: number): CounterBase | undefined {
  const ifindex = nl.linkIndexByName(ifb);
  if (ifindex === undefined) return undefined;
  const ids = ifbClassIds(classId);
  const pod = nl.classGet(ifindex, tcHandle(1, ids.pod));
  const d = directionCounters(pod, [nl.classGet(ifindex, tcHandle(1, ids.interactive)), nl.classGet(ifindex, tcHandle(1, ids.bulk))]);
  return d && { bytes: d.bytes, packets: d.packets, drops: d.drops, overlimits: d.overlimits };
}
