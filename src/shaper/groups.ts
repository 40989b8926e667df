/**
 * Namespace classes in the node's trees: a namespace whose annotation gives a total for a direction
 * (`kubenet.io/max-egress-bandwidth-total`, ...; src/bandwidth/namespace-policy.ts) has a class
 * between the node class and its pods' classes that way, on every shard where it has pods (its pods
 * spread over the shards as any others: no lock is shared by a whole namespace). Each such class is
 * guaranteed what its pods there are together and its ceil is the namespace's *share* on that shard:
 * the shares add up to the total (GroupSplit). They are split anew when the namespace's shards, its
 * total or its guarantees there change (each shard its pods' guarantees, the rest evenly), and the
 * steering tick moves them by demand as it moves the node's shares (shares.ts, the same
 * water-filling). Its id (tc-layout.ts GROUP_CLASS_BASE + n) is the same on every shard, both ways.
 * Its pods' classes are not pooled (ClassIds `fresh`): a namespace's class on a shard goes with its
 * last pod there, and htb deletes no class that has children. The Shaper (tc.ts) runs the lines.
 */
import { KubenetError } from '../errors.js';
import { DEFAULT_BAND } from '../bandwidth/guarantees.js';
import { kbitShares, type ShardPod, waterFill } from './shares.js';
import type { TreeParams } from './sizing.js';
import { SIDE } from './tc-plan.js';
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

/** A pod under a namespace's class one way: its shard's ifb, its guarantee, its veth in the tree (absent: out of it) and band. */
export interface GroupMember {
  ifb: string;
  guarantee: number;
  veth?: string;
  band: number;
}

/** The ifb of a state's shard one way; undefined when it has no class that way. */
export type ShardIfbOf = (r: ShapingState, dir: Direction) => string | undefined;

/**
 * Namespace class `gid`'s pods one way among `states` (`inTree`: whether a pod's traffic that way
 * passes its tree now), and its total (the annotation as the last of them was shaped with).
 */
export function groupMembers(
  states: Iterable<ShapingState>,
  dir: Direction,
  gid: number,
  ifbOf: ShardIfbOf,
  inTree: (r: ShapingState) => boolean,
): { members: GroupMember[]; total: number | undefined } {
  const members: GroupMember[] = [];
  let total: number | undefined;
  for (const r of states) {
    const ifb = SIDE[dir].parent(r) === gid ? ifbOf(r, dir) : undefined;
    if (ifb === undefined) continue;
    total = SIDE[dir].total(r) ?? total;
    members.push({
      ifb,
      guarantee: SIDE[dir].guarantee(r),
      band: r.limits.priority ?? DEFAULT_BAND,
      ...(r.hostVeth && inTree(r) ? { veth: r.hostVeth } : {}),
    });
  }
  return { members, total };
}

/** A namespace's classes one way as the share mover sees them (steering.ts): by shard, its floor, share and pods' veths. */
export interface GroupView {
  gid: number;
  total: number;
  shards: Array<{ ifb: string; floor: number; share: number; veths: ShardPod[] }>;
}

/** What a change of pods asks of their namespaces' classes: lines before its own, deletes after, and which classes. */
export interface GroupSync {
  replace: string[];
  del: string[];
  keys: Array<[Direction, number]>;
}

interface Split {
  /** The total the shares were split from; NaN after a batch that may have failed: split anew. */
  total: number;
  /** By shard ifb: the namespace class's ceil there. */
  shares: Map<string, number>;
}

/** Per shard ifb: what the members there are guaranteed together, and their veths. */
function byShard(members: readonly GroupMember[]): Map<string, { floor: number; veths: ShardPod[] }> {
  const out = new Map<string, { floor: number; veths: ShardPod[] }>();
  for (const m of [...members].sort((a, b) => (a.ifb < b.ifb ? -1 : a.ifb > b.ifb ? 1 : 0))) {
    const o = out.get(m.ifb) ?? { floor: 0, veths: [] };
    o.floor += m.guarantee;
    if (m.veth) o.veths.push({ veth: m.veth, band: m.band, guarantee: m.guarantee });
    out.set(m.ifb, o);
  }
  return out;
}

/** The namespaces' shares of their totals by shard, one way and the other (see the module doc). */
export class GroupSplit {
  private readonly splits = new Map<string, Split>();

  /** `tree(dir)`: the tree that way (its capacity caps a class's ceil). */
  constructor(private readonly tree: (dir: Direction) => TreeParams | undefined) {}

  private key(dir: Direction, gid: number): string {
    return `${dir} ${gid}`;
  }

  /**
   * The lines that make namespace `gid`'s classes one way match `members` (its pods under it that
   * way, each on its shard's ifb): `replace`, its class on each shard with members, at its share
   * (kept while its shards, total and floors allow; else split anew), the shrinking ones first;
   * `del`, its classes on shards without members now, to run once their pods' classes are gone.
   */
  sync(dir: Direction, gid: number, total: number | undefined, members: readonly GroupMember[]): { replace: string[]; del: string[] } {
    const key = this.key(dir, gid);
    const was = this.splits.get(key);
    const tree = this.tree(dir);
    const shards = byShard(members);
    const del = [...(was?.shares.keys() ?? [])]
      .filter((ifb) => !shards.has(ifb))
      .map((ifb) => `class del dev ${ifb} classid 1:${hex(gid)}`);
    if (total === undefined || shards.size === 0 || !tree) {
      this.splits.delete(key);
      return { replace: [], del };
    }
    const ifbs = [...shards.keys()];
    const floors = ifbs.map((ifb) => shards.get(ifb)?.floor ?? 0);
    const kept =
      was !== undefined &&
      was.total === total &&
      was.shares.size === ifbs.length &&
      ifbs.every((ifb, k) => was.shares.has(ifb) && (was.shares.get(ifb) ?? 0) >= Math.min(floors[k] ?? 0, total));
    const shares = kept
      ? ifbs.map((ifb) => was.shares.get(ifb) ?? 0)
      : kbitShares(
          waterFill(
            total,
            floors.map((floor) => ({ floor, rate: 0, share: 0, weight: 1 })),
          ),
        );
    return { replace: this.set(dir, gid, total, ifbs, shares, floors, was), del };
  }

  /**
   * `sync` for every namespace class the `touched` states hang under (before and after a change),
   * its members among `states`; `rec`'s total wins (the newest annotation).
   */
  syncAll(
    touched: readonly ShapingState[],
    states: readonly ShapingState[],
    ifbOf: ShardIfbOf,
    inTree: (r: ShapingState, dir: Direction) => boolean,
    rec?: ShapingState,
  ): GroupSync {
    const keys = new Map<string, [Direction, number]>();
    for (const r of touched)
      for (const dir of ['egress', 'ingress'] as const) {
        const gid = SIDE[dir].parent(r);
        if (gid) keys.set(this.key(dir, gid), [dir, gid]);
      }
    const out: GroupSync = { replace: [], del: [], keys: [...keys.values()] };
    for (const [dir, gid] of keys.values()) {
      const { members, total } = groupMembers(states, dir, gid, ifbOf, (r) => inTree(r, dir));
      const l = this.sync(dir, gid, (rec && SIDE[dir].parent(rec) === gid ? SIDE[dir].total(rec) : undefined) ?? total, members);
      out.replace.push(...l.replace);
      out.del.push(...l.del);
    }
    return out;
  }

  /** Forgets what the kernel has of `gid` one way after a batch that may have failed: the next sync splits anew. */
  invalidate(dir: Direction, gid: number): void {
    const s = this.splits.get(this.key(dir, gid));
    if (s) s.total = Number.NaN;
  }

  /** The namespaces on several shards one way, for the share mover (`membersOf`: a namespace's pods now). */
  views(dir: Direction, membersOf: (gid: number) => readonly GroupMember[]): GroupView[] {
    const out: GroupView[] = [];
    for (const [key, s] of this.splits) {
      const gid = Number(key.slice(key.indexOf(' ') + 1));
      if (!key.startsWith(`${dir} `) || s.shares.size < 2 || Number.isNaN(s.total)) continue;
      const shards = byShard(membersOf(gid));
      if (shards.size !== s.shares.size) continue;
      out.push({
        gid,
        total: s.total,
        shards: [...shards].map(([ifb, v]) => ({ ifb, floor: v.floor, share: s.shares.get(ifb) ?? 0, veths: v.veths })),
      });
    }
    return out;
  }

  /** Moves `view`'s shares to `next` (by its shards' order): the lines, the shrinking ones first. */
  change(dir: Direction, view: GroupView, next: readonly number[]): string[] {
    const was = this.splits.get(this.key(dir, view.gid));
    return this.set(
      dir,
      view.gid,
      view.total,
      view.shards.map((s) => s.ifb),
      next,
      view.shards.map((s) => s.floor),
      was,
    );
  }

  /** Its class on shard `ifb` for a rebuilt ifb (tc.ts initIfb): at its share there, or the whole total before any split. */
  linesOn(ifb: string, dir: Direction, states: readonly ShapingState[]): string[] {
    const tree = this.tree(dir);
    const groups = new Map<number, { floor: number; total: number }>();
    for (const r of states) {
      const gid = SIDE[dir].parent(r);
      const total = SIDE[dir].total(r);
      if (!gid || total === undefined) continue;
      const g = groups.get(gid) ?? { floor: 0, total };
      g.floor += SIDE[dir].guarantee(r);
      groups.set(gid, g);
    }
    if (!tree) return [];
    return [...groups].map(([gid, g]) =>
      groupLine(ifb, gid, g.floor, this.splits.get(this.key(dir, gid))?.shares.get(ifb) ?? g.total, tree),
    );
  }

  clear(): void {
    this.splits.clear();
  }

  private set(
    dir: Direction,
    gid: number,
    total: number,
    ifbs: readonly string[],
    shares: readonly number[],
    floors: readonly number[],
    was: Split | undefined,
  ): string[] {
    const tree = this.tree(dir);
    if (!tree) return [];
    this.splits.set(this.key(dir, gid), { total, shares: new Map(ifbs.map((ifb, k) => [ifb, shares[k] ?? 0])) });
    const grows = (k: number) => (shares[k] ?? 0) - (was?.shares.get(ifbs[k] ?? '') ?? 0);
    return ifbs
      .map((_, k) => k)
      .sort((a, b) => grows(a) - grows(b))
      .map((k) => groupLine(ifbs[k] ?? '', gid, floors[k] ?? 0, shares[k] ?? 0, tree));
  }
}
