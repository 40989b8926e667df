/**
 * What a pod's shaping really did, from the kernel's own tc counters (read over netlink by
 * `readCounters`, src/netlink `classList`): per shaped direction, the pod's htb class (at the
 * pod's limit) and its two leaves (interactive, bulk) summed into one set of figures.
 *
 * - bytes, packets: what the pod's class sent (dequeued), so what got through the limit. L2 frames
 *   as the device carries them (Ethernet header included, no FCS): a TCP flow's payload is ~95.6 %
 *   of this at MTU 1500 (1448 of 1514 bytes per full segment with timestamps).
 * - drops: packets the pod's queues dropped (htb counts them on the leaf that refused them).
 * - overlimits: times the pod's class hit its limit and had to wait (htb's count on that class).
 * - backlog: bytes queued in the pod's leaves now.
 * - limit: the class's rate as the kernel holds it, bits/s (htb keeps bytes/s).
 */
import * as nl from '../netlink/index.js';
import type { TcClassStats } from '../netlink/index.js';
import { ifbClassIds, type CounterBase, type ShapingState } from './tc-layout.js';

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

/**
 * The counters of the given pods' shaping, read over netlink: one listing of each egress shard's
 * ifb's classes (`ifbOf` names a state's), one of each shaped veth's (by `ifindex(pod)` when known, else by name); a device
 * that is gone gives no figures.
 */
export function readCounters(states: ShapingState[], ifbOf: (s: ShapingState) => string, ifindex?: (podId: string) => number | undefined): ShapingCounters[] {
  // One class listing per egress shard that has a shaped pod.
  const ifbs = new Map<string, Map<number, nl.TcClassStats>>();
  for (const s of states) {
    const name = ifbOf(s);
    if (s.egressInstalled && s.classId && !ifbs.has(name)) ifbs.set(name, byHandle(classesOf(name) ?? []));
  }
  const out: ShapingCounters[] = [];
  for (const s of states) {
    const c: ShapingCounters = { id: s.id, hostVeth: s.hostVeth };
    if (s.ingressInstalled) {
      const classes = classesOf(ifindex?.(s.id) ?? s.hostVeth);
      if (classes) {
        const m = byHandle(classes);
        const ingress = directionCounters(m.get(tcHandle(2, 1)), [m.get(tcHandle(2, 2)), m.get(tcHandle(2, 3))]); // VETH.pod, .interactive, .bulk
        if (ingress) c.ingress = ingress;
      }
    }
    const ifb = ifbs.get(ifbOf(s));
    if (s.egressInstalled && s.classId && ifb) {
      const ids = ifbClassIds(s.classId);
      const egress = directionCounters(ifb.get(tcHandle(1, ids.pod)), [ifb.get(tcHandle(1, ids.interactive)), ifb.get(tcHandle(1, ids.bulk))]);
      if (egress) c.egress = s.egressBase ? sinceBase(egress, s.egressBase) : egress;
    }
    out.push(c);
  }
  return out;
}

/** The classes of a device over netlink; undefined when the device is gone. */
function classesOf(dev: string | number): nl.TcClassStats[] | undefined {
  return nl.ifPresent(() => nl.classList(dev));
}

/** A direction's counters since `base` (classes taken over from an earlier pod); never below zero. */
export function sinceBase(d: DirectionCounters, base: CounterBase): DirectionCounters {
  const since = (now: number, then: number) => Math.max(0, now - then);
  return { ...d, bytes: since(d.bytes, base.bytes), packets: since(d.packets, base.packets), drops: since(d.drops, base.drops), overlimits: since(d.overlimits, base.overlimits) };
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
