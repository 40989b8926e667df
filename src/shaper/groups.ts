/**
 * Namespace classes in the node's trees (issue 33): a namespace whose annotation gives a total for
 * a direction (`kubenet.io/max-egress-bandwidth-total`, ...; src/bandwidth/namespace-policy.ts)
 * has one class between the node class and its pods' classes there, ceil its total, guaranteed
 * what its pods are together. Its id (tc-layout.ts GROUP_CLASS_BASE + n) is the same both ways.
 * Its pods' classes are not pooled (ClassIds `fresh`): the namespace's class goes with its last
 * pod, and htb deletes no class that has children. Pure: the Shaper (tc.ts) runs the lines.
 */
import { KubenetError } from '../errors.js';
import type { TreeParams } from './sizing.js';
import { GROUP_CLASS_BASE, groupLine, hex, isGroupClass, MAX_GROUPS, type Direction, type ShapingState } from './tc-layout.js';

/**
 * The namespaces' class ids in the trees (tc-layout.ts GROUP_CLASS_BASE + 1..MAX_GROUPS), by
 * namespace: one id for both directions.
 */
export class GroupIds {
  private readonly ids = new Map<string, number>();

  /** The namespace's id, a new one (the lowest free) if it has none. @throws KubenetError when all are taken. */
  idOf(name: string): number {
    const known = this.ids.get(name);
    if (known !== undefined) return known;
    const taken = new Set(this.ids.values());
    for (let n = 1; n <= MAX_GROUPS; n++) {
      if (!taken.has(GROUP_CLASS_BASE + n)) {
        this.ids.set(name, GROUP_CLASS_BASE + n);
        return GROUP_CLASS_BASE + n;
      }
    }
    throw new KubenetError(`shaper: all ${MAX_GROUPS} namespace classes are in use`);
  }

  /** A kept id (adopt); false when out of range or another namespace's. */
  claim(name: string, id: number): boolean {
    if (!isGroupClass(id)) return false;
    const mine = this.ids.get(name);
    if (mine !== undefined) return mine === id;
    if ([...this.ids.values()].includes(id)) return false;
    this.ids.set(name, id);
    return true;
  }

  forget(name: string): void {
    this.ids.delete(name);
  }

  clear(): void {
    this.ids.clear();
  }
}

/**
 * The namespace classes `members` hang under one way (each state's parent that way), as replace
 * lines: guaranteed what their pods are together, ceil the total the members carry (the namespace's
 * annotation as the last of them was shaped with).
 */
export function groupLines(ifb: string, dir: Direction, tree: TreeParams, members: ShapingState[]): string[] {
  const groups = new Map<number, { guaranteed: number; total: number }>();
  for (const r of members) {
    const gid = dir === 'egress' ? r.egressParent : r.ingressParent;
    const total = dir === 'egress' ? r.limits.egressTotal : r.limits.ingressTotal;
    if (!gid || total === undefined) continue;
    const g = groups.get(gid) ?? { guaranteed: 0, total };
    g.guaranteed += (dir === 'egress' ? r.limits.egressGuarantee : r.limits.ingressGuarantee) ?? 0;
    g.total = total;
    groups.set(gid, g);
  }
  return [...groups].map(([gid, g]) => groupLine(ifb, gid, g.guaranteed, g.total, tree));
}

/** Where a direction's classes of the pods of namespaces live: the ifb and its tree (absent: no tree that way). */
export type GroupSides = Partial<Record<Direction, { ifb: string; tree: TreeParams }>>;

const parentOf = (r: ShapingState, dir: Direction) => (dir === 'egress' ? r.egressParent : r.ingressParent);

/** The lines of the namespace classes `rec` hangs under, sized with `rec` in place of its record among `records`. */
export function groupLinesWith(rec: ShapingState, records: Iterable<ShapingState>, sides: GroupSides): string[] {
  if (rec.group === undefined) return [];
  const members = [...records].filter((r) => r.group === rec.group && r.id !== rec.id);
  members.push(rec);
  return (['egress', 'ingress'] as const).flatMap((dir) => {
    const side = sides[dir];
    return side && parentOf(rec, dir) ? groupLines(side.ifb, dir, side.tree, members) : [];
  });
}

/**
 * The namespace classes `was` hung under, now that it is shaped otherwise or gone (`records`
 * without it): re-sized for the pods still under them, or deleted (after their pods' classes) when
 * none is. `empty`: no pod of the namespace hangs under any of its classes any more.
 */
export function groupLinesAfter(
  was: ShapingState,
  records: Iterable<ShapingState>,
  sides: GroupSides,
): { lines: string[]; empty: boolean } {
  const rest = [...records].filter((r) => r.group === was.group);
  const lines = (['egress', 'ingress'] as const).flatMap((dir) => {
    const gid = parentOf(was, dir);
    const side = sides[dir];
    if (!gid || !side) return [];
    const under = rest.filter((r) => parentOf(r, dir) === gid);
    return under.length > 0 ? groupLines(side.ifb, dir, side.tree, under) : [`class del dev ${side.ifb} classid 1:${hex(gid)}`];
  });
  return { lines, empty: !rest.some((r) => r.egressParent || r.ingressParent) };
}
