/**
 * What a pod's veth counted while the pod was outside its trees (steering.ts keeps best-effort pods
 * out while the node is far from its capacity): the spells outside, carried into its figures in
 * `kubenet status`, `top` and `/metrics` (counters.ts) since their trees did not count them.
 */
import * as nl from '../netlink/index.js';
import { vethCount } from './counters.js';
import type { Direction, OutsideCount, ShapingState } from './tc-layout.js';

export const ZERO = { bytes: 0, packets: 0 } as const;

/** A veth's counter of a pod's direction now (one netlink get); undefined when the veth is gone. */
export function vethCountNow(veth: string, dir: Direction): { bytes: number; packets: number } | undefined {
  try {
    return vethCount(nl.linkStats(veth), dir);
  } catch {
    return undefined;
  }
}

/**
 * A direction's count outside its tree after a spell outside begins (`from`: the veth's counter
 * now) or ends (`from` undefined: what the veth counted since the spell began is carried).
 */
export function spell(o: OutsideCount | undefined, from: OutsideCount['from'], now: OutsideCount['from']): OutsideCount {
  const carried = { ...(o?.carried ?? ZERO) };
  if (o?.from && now) {
    carried.bytes += Math.max(0, now.bytes - o.from.bytes);
    carried.packets += Math.max(0, now.packets - o.from.packets);
  }
  return from ? { carried, from } : { carried };
}

/**
 * A pod's counts outside its trees after an ensure (`prev`: its state on the same veth, if any):
 * a spell under way goes on, one that ends is carried, a new veth out of a tree starts at zero.
 */
export function outsideAfterEnsure(prev: ShapingState | undefined, bypass: readonly Direction[]): ShapingState['outside'] {
  const out: Partial<Record<Direction, OutsideCount>> = {};
  for (const d of ['egress', 'ingress'] as const) {
    const was = prev?.outside?.[d];
    const isOut = bypass.includes(d);
    if (was?.from && !isOut) out[d] = spell(was, undefined, prev ? vethCountNow(prev.hostVeth, d) : undefined);
    else if (was) out[d] = was;
    else if (isOut) out[d] = { carried: { ...ZERO }, from: prev ? (vethCountNow(prev.hostVeth, d) ?? { ...ZERO }) : { ...ZERO } };
  }
  return Object.keys(out).length > 0 ? out : undefined;
}
