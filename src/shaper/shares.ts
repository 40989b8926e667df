/**
 * The node's egress capacity split over the egress shards' trees (tc.ts): each shard's ifb has its
 * own htb tree, so no lock or tasklet is shared by all pods, and its node class's rate and ceil is
 * the shard's *share* of the capacity. The shares always add up to the capacity; the steering loop
 * (steering.ts, every TICK_MS) moves them by demand, by water-filling (pure, here):
 * - every shard first gets its *floor*: the guarantees of its pods that moved traffic in the tick
 *   (so each guarantee holds in its shard's tree, as in one tree, from the tick after its pod
 *   sends; an idle pod's guarantee is lent to the others, as htb lends it in one tree), and at
 *   least LEAST_SHARE of an even split (an idle shard can start at once);
 * - a shard whose class of the split (its node class, or its namespace's class) went over its
 *   ceil in the tick (htb counts it in the class's `overlimits`: a backlog waits for the share),
 *   or that sent at least SATURATED of its share, wants more (unbounded); one below it that is still GROWING (its flows ramping up into a share that just grew: TCP needs
 *   round trips to fill it), or that wanted more within HOLD_MS (its flows waiting out a
 *   retransmission timeout: a share taken away in the pause sends them back into it), keeps its
 *   share; any other wants HEADROOM times what it sent (it can grow that much before the next tick);
 * - what is left after the floors goes to the shards that want more, in proportion to their
 *   weights, none past what it wants; what nobody wants is split evenly (headroom). A shard's
 *   weight is its pods that moved traffic in the tick, each counted by its band (bandWeight): htb
 *   in one tree shares per pod and serves band 0 before 1 before 2, and shards follow that by
 *   weight (band 0 against band 2 on two shards: 16 to 1).
 * Within a shard htb's own sharing holds (guarantees, bands, ceilings); a namespace's total is
 * split over the shards its pods are on the same way (groups.ts). Between shards the split follows within a
 * tick or two; what it trades against one tree is measured and said in docs/shaping.md, "Egress
 * shards under a capacity".
 */
import type { TreeParams } from './sizing.js';
import { treeLines } from './tc-layout.js';

/** A shard sending at this share of its share (or more) wants more. */
export const SATURATED = 0.85;
/** A shard below SATURATED wants what it sent times this. */
export const HEADROOM = 1.5;
/** The least share of a shard, as a part of an even split of the capacity. */
export const LEAST_SHARE = 0.02;
/** A shard below SATURATED that sent at least this many times what it sent the tick before keeps its share. */
export const GROWING = 1.1;
/**
 * A shard that wanted more keeps its share this long (ms) after, sending or not: TCP's retransmission
 * timeout is at least 200 ms, and a shard whose flow waits it out at a tiny share would otherwise lose
 * each share it gets before its flow can use it (CI: a namespace's second pod held at ~1 Mbit/s of a 40M
 * total for 5 s). What it costs: an idle shard lends its share that much later (docs/shaping.md).
 */
export const HOLD_MS = 300;
/** A share is changed only when it moves by at least this part of an even split (no churn of tc lines when idle). */
export const CHANGE = 0.05;

/** An active pod's weight in its shard's want by its band (0, 1, 2; others as 2): 16, 4, 1. */
export function bandWeight(band: number): number {
  return band <= 0 ? 16 : band === 1 ? 4 : 1;
}

/** A pod in a shard's tree as the share mover sees it: its veth, band and guarantee that way (bits/s). */
export interface ShardPod {
  veth: string;
  band: number;
  guarantee: number;
}

/** One shard as the split sees it: its floor, what it sent (bits/s) in this tick and the one before, its share now and its weight (active pods). */
export interface ShardLoad {
  floor: number;
  rate: number;
  share: number;
  weight: number;
  /** What it sent in the tick before (absent: unknown, not growing). */
  last?: number;
  /** Its class went over its ceil in the tick (htb's overlimits grew): it waits for more share. */
  limited?: boolean;
  /** It wanted more within HOLD_MS: it keeps its share. */
  held?: boolean;
}

/** What a shard wants (bits/s) from its load, before floors (see the module doc). */
export function wantOf(s: ShardLoad): number {
  if (s.limited || s.rate >= SATURATED * s.share) return Number.POSITIVE_INFINITY;
  const grows = s.last !== undefined && s.rate > 0 && s.rate >= s.last * GROWING;
  return grows || s.held ? Math.max(s.share, s.rate * HEADROOM) : s.rate * HEADROOM;
}

/** Each shard's next share, bits/s, adding up to `capacity` (see the module doc). Pure. */
export function waterFill(capacity: number, shards: readonly ShardLoad[]): number[] {
  const n = shards.length;
  if (n === 0) return [];
  const least = (capacity / n) * LEAST_SHARE;
  const base = shards.map((s) => Math.max(s.floor, least));
  const sumBase = base.reduce((a, b) => a + b, 0);
  // Floors past the capacity (guarantees the scheduler should not have admitted): in proportion.
  if (sumBase >= capacity) return base.map((b) => (b * capacity) / sumBase);
  const want = shards.map((s, k) => Math.max(base[k] ?? 0, wantOf(s)));
  const alloc = [...base];
  let left = capacity - sumBase;
  const tiny = capacity * 1e-9;
  let open = shards.map((_, k) => k).filter((k) => (alloc[k] ?? 0) < (want[k] ?? 0) - tiny);
  while (left > tiny && open.length > 0) {
    const w = open.reduce((a, k) => a + Math.max(1, shards[k]?.weight ?? 1), 0);
    let used = 0;
    for (const k of open) {
      const give = Math.min((left * Math.max(1, shards[k]?.weight ?? 1)) / w, (want[k] ?? 0) - (alloc[k] ?? 0));
      alloc[k] = (alloc[k] ?? 0) + give;
      used += give;
    }
    left -= used;
    open = open.filter((k) => (alloc[k] ?? 0) < (want[k] ?? 0) - tiny);
    if (used <= tiny) break;
  }
  return left > tiny ? alloc.map((a) => a + left / n) : alloc;
}

/**
 * The shares to set: `next` rounded down to whole kbit/s (their sum stays at most the capacity), or
 * undefined when none moved by CHANGE of an even split and every share is at least its floor.
 */
export function sharesToSet(
  capacity: number,
  now: readonly number[],
  next: readonly number[],
  floors: readonly number[],
): number[] | undefined {
  const n = next.length;
  if (n === 0) return undefined;
  const step = (capacity / n) * CHANGE;
  const moved = next.some((v, k) => Math.abs(v - (now[k] ?? 0)) >= step || (now[k] ?? 0) < (floors[k] ?? 0));
  return moved ? kbitShares(next) : undefined;
}

/** Shares rounded down to whole kbit/s (their sum stays at most what they split), at least 1 kbit/s each. */
export function kbitShares(shares: readonly number[]): number[] {
  return shares.map((v) => Math.max(1000, Math.floor(v / 1000) * 1000));
}

/** The shares of a direction's shards now (what their node classes are at): even at first. */
export class ShardShares {
  private now: number[];

  constructor(
    readonly capacity: number,
    readonly ifbs: readonly string[],
  ) {
    this.now = ifbs.map(() => Math.floor(capacity / ifbs.length / 1000) * 1000);
  }

  all(): readonly number[] {
    return this.now;
  }

  /** Shard k's tree: the node's capacity, its share. */
  tree(k: number): TreeParams {
    return { capacity: this.capacity, share: this.now[k] ?? 0 };
  }

  /**
   * After a restart: the shares the node classes have (`found`, by shard) are kept when each is set
   * and they add up to at most the capacity (a restart then changes nothing); false: they stay even,
   * for the caller to set (`lines`).
   */
  adopt(found: ReadonlyArray<number | undefined>): boolean {
    const ok = found.length === this.now.length && found.every((v) => v !== undefined && v > 0);
    if (!ok || found.reduce<number>((a, v) => a + (v ?? 0), 0) > this.capacity * 1.0001) return false;
    this.now = found.map((v) => v ?? 0);
    return true;
  }

  set(next: readonly number[]): void {
    this.now = [...next];
  }

  /** The node class of each shard at its share (one line each). */
  lines(): string[] {
    return this.ifbs.map((ifb, k) => treeLines(ifb, this.tree(k))[0] ?? '');
  }

  /** Takes `next` and returns its lines, the shares that drop first (the sum never passes the capacity between two lines). */
  change(next: readonly number[]): string[] {
    const was = this.now;
    this.now = [...next];
    const lines = this.lines();
    const order = lines.map((_, k) => k).sort((a, b) => (next[a] ?? 0) - (was[a] ?? 0) - ((next[b] ?? 0) - (was[b] ?? 0)));
    return order.map((k) => lines[k] ?? '');
  }
}
