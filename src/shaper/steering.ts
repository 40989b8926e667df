/**
 * Pods that asked for nothing, out of the node's trees while the node is far from its capacity.
 *
 * With a capacity every pod's traffic could pass the node's tree that way (tc.ts), and a pod that
 * asked for nothing (limits.ts isBestEffort: no ceiling, guarantee, namespace total or band) would
 * then pay the ifb hop, the tree's lock and its tasklet for nothing while the node's traffic stays
 * far below the capacity: no class of the tree throttles anything then. So such a pod is in the tree
 * only while its direction is *hot*:
 * - each tick (TICK_MS) one RTM_GETSTATS dump gives the direction's demand: what its tree's ifbs sent
 *   (every pod in the tree) plus what each best-effort pod kept out of it moved on its veth (its
 *   traffic to the cluster's own ranges included: the demand is over-, never under-counted);
 * - the direction turns hot when the demand reaches IN_SHARE of the capacity, and cools when it has
 *   stayed under OUT_SHARE for OUT_HOLD_MS (the gap keeps a flow near a threshold from flapping);
 * - while hot, every best-effort pod that moved at least ACTIVE_BITS per second out of the tree is
 *   steered in (its veth's redirect added: its classes and filters on the ifb are always there), so
 *   a tick after the demand rises the tree holds everyone again; an idle pod stays out until it
 *   sends. When the direction cools, every best-effort pod is steered out (the redirect deleted).
 * A change is one or two tc lines per pod, under the pod's lock; a pod the shaper adopts after a
 * restart is in the tree until the first cool decision, and a pod added while its direction is hot
 * starts in it. What this costs and buys: docs/shaping.md, "Pods that asked for nothing".
 *
 * The same tick moves the shares of a direction's shards (several trees that way: shares.ts) from
 * the same dump: each shard's ifb and its pods' veths; and a namespace's shares of its total over
 * the shards its pods are on (groups.ts), from its pods' veths.
 *
 * The promise it trades: while a direction is cool a best-effort pod's traffic is not counted
 * against the node class, so the node's sum can pass the capacity by what such pods start sending
 * within one tick and one tc batch of rising past IN_SHARE (a guarantee is at risk only where the
 * capacity is the real link's, for that long).
 */
import { performance } from 'node:perf_hooks';
import * as nl from '../netlink/index.js';
import type { LinkStats } from '../netlink/index.js';
import type { Logger } from '../log.js';
import { NODE_CLASS, type Direction } from './tc-layout.js';
import type { GroupView } from './groups.js';
import { bandWeight, HOLD_MS, sharesToSet, waterFill, wantOf, type ShardLoad, type ShardPod } from './shares.js';

export const TICK_MS = 100;
/** A direction turns hot at this share of its capacity... */
export const IN_SHARE = 0.5;
/** ...and cools after its demand stayed below this share for OUT_HOLD_MS. */
export const OUT_SHARE = 0.3;
export const OUT_HOLD_MS = 2000;
/** While hot, a best-effort pod out of the tree moving at least this (bits/s) is steered in. */
export const ACTIVE_BITS = 1e6;

export interface Phase {
  hot: boolean;
  /** Since when (ms) a hot direction's demand stayed under OUT_SHARE. */
  coolSince?: number;
}

/** The next phase of a direction from its demand (bits/s) against its capacity at time `now` (ms). Pure. */
export function nextPhase(p: Phase, demand: number, capacity: number, now: number): Phase {
  if (demand >= IN_SHARE * capacity) return { hot: true };
  if (!p.hot) return { hot: false };
  if (demand >= OUT_SHARE * capacity) return { hot: true };
  const since = p.coolSince ?? now;
  return now - since >= OUT_HOLD_MS ? { hot: false } : { hot: true, coolSince: since };
}

/** A best-effort pod as a decision sees it: out of the tree or not, and its rate on its veth while out (bits/s). */
export interface SteerPod {
  id: string;
  out: boolean;
  rate: number;
}

/** Which pods go into the tree and which out of it, in a phase. Pure. */
export function steerPlan(hot: boolean, pods: readonly SteerPod[]): { into: string[]; out: string[] } {
  return hot
    ? { into: pods.filter((p) => p.out && p.rate >= ACTIVE_BITS).map((p) => p.id), out: [] }
    : { into: [], out: pods.filter((p) => !p.out).map((p) => p.id) };
}

/** What the steering needs of the shaper (tc.ts). */
export interface SteeringHost {
  /** The capacity of the direction's tree, bits/s; undefined without one. */
  capacity(dir: Direction): number | undefined;
  /** The ifbs of the direction's tree. */
  ifbs(dir: Direction): readonly string[];
  /** The best-effort pods in that direction's tree (with a veth), and whether each is out of it. */
  bestEffort(dir: Direction): Array<{ id: string; hostVeth: string; out: boolean }>;
  /** Steers the pods into the tree or out of it; a pod that changed meanwhile is left as it is. */
  steer(dir: Direction, ids: string[], into: boolean): Promise<void>;
  /**
   * With more than one shard that way under a capacity (shares.ts): each shard's ifb, its share now
   * and its pods in the tree (veth, band, guarantee); else empty.
   */
  shards(dir: Direction): ShardView[];
  /** Sets a direction's shards' shares, bits/s, by shard. */
  setShares(dir: Direction, shares: number[]): Promise<void>;
  /** The namespaces with a total whose pods are on several shards that way (groups.ts). */
  groups(dir: Direction): GroupView[];
  /** Sets a namespace's shares of its total, bits/s, by its view's shards. */
  setGroupShares(dir: Direction, view: GroupView, shares: number[]): Promise<void>;
}

const DIRS: readonly Direction[] = ['egress', 'ingress'];

/** A shard as the share mover sees it: its ifb, its share now, and its pods in the tree (their guarantees give its floor). */
export interface ShardView {
  ifb: string;
  share: number;
  veths: ShardPod[];
}

/** The loop (see the module doc): one tick at a time, a failed change retried on the next. */
export class Steering {
  private readonly phase: Record<Direction, Phase> = { egress: { hot: true }, ingress: { hot: true } };
  private last: { at: number; links: Map<number, LinkStats> } | undefined;
  private sock: nl.StatsSocket | undefined;
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private readonly index = new Map<string, number>();
  /** What each shard sent in this tick and the one before, bits/s, by direction, namespace class (0: the node's) and ifb. */
  private rates = { now: new Map<string, number>(), before: new Map<string, number>() };
  /** When each split's shard last wanted more (ms, the tick's time), by "key ifb": its hold (shares.ts HOLD_MS). */
  private readonly wanted = new Map<string, number>();
  /** The time of the tick under way (ms). */
  private now = 0;
  /** Each split class's htb overlimits at the last tick, by `${ifb} ${class id}`. */
  private overs = new Map<string, number>();
  private lastError = 0;

  constructor(
    private readonly host: SteeringHost,
    private readonly log: Logger,
  ) {}

  /** Whether the direction is hot (a new best-effort pod then starts in its tree). */
  hot(dir: Direction): boolean {
    return this.phase[dir].hot;
  }

  start(): void {
    if (this.timer) return;
    this.timer = setInterval(() => {
      this.running ??= this.tick().finally(() => {
        this.running = undefined;
      });
    }, TICK_MS);
    this.timer.unref();
  }

  /** Stops the loop and waits for a tick under way. */
  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
    await this.running;
    this.sock?.close();
    this.sock = undefined;
    this.last = undefined;
  }

  /** One decision per direction with a tree (exported for tests: they call it instead of waiting for the timer). */
  async tick(now = performance.now()): Promise<void> {
    const dirs = DIRS.filter((d) => this.host.capacity(d) !== undefined);
    const pods = new Map(dirs.map((d) => [d, this.host.bestEffort(d)]));
    const shards = new Map(dirs.map((d) => [d, this.host.shards(d)]));
    const groups = new Map(dirs.map((d) => [d, this.host.groups(d)]));
    if (
      ![...pods.values()].some((p) => p.length > 0) &&
      ![...shards.values()].some((s) => s.length > 1) &&
      ![...groups.values()].some((g) => g.length > 0)
    ) {
      this.last = undefined;
      return;
    }
    try {
      this.sock ??= nl.StatsSocket.open();
      const links = await this.sock.linkStats();
      const overs = await this.overlimits(dirs, shards, groups, links);
      const last = this.last;
      this.last = { at: now, links };
      if (!last || now <= last.at) return;
      const secs = (now - last.at) / 1000;
      this.rates = { now: new Map(), before: this.rates.now };
      this.now = now;
      for (const [k, at] of this.wanted) if (now - at >= HOLD_MS) this.wanted.delete(k);
      for (const dir of dirs) await this.decide(dir, pods.get(dir) ?? [], links, last.links, secs, now);
      for (const dir of dirs) {
        const view = shards.get(dir) ?? [];
        if (view.length > 1) await this.reshare(dir, view, links, last.links, secs, overs);
        for (const g of groups.get(dir) ?? []) await this.reshareGroup(dir, g, links, last.links, secs, overs);
      }
    } catch (err) {
      this.sock?.close();
      this.sock = undefined;
      this.last = undefined;
      if (now - this.lastError > 10_000) this.log.warn({ err }, 'steering best-effort pods: a tick failed; trying again');
      this.lastError = now;
    }
  }

  private ifindex(name: string, links: Map<number, LinkStats>): number | undefined {
    const known = this.index.get(name);
    if (known !== undefined && links.has(known)) return known;
    const i = nl.linkIndexByName(name);
    if (i === undefined) this.index.delete(name);
    else this.index.set(name, i);
    return i;
  }

  /** Bytes a link sent (ifb, and a veth toward its pod) or received (`rx`: a veth from its pod) between two dumps. */
  private moved(name: string, rx: boolean, links: Map<number, LinkStats>, before: Map<number, LinkStats>): number {
    const i = this.ifindex(name, links);
    const a = i === undefined ? undefined : before.get(i);
    const b = i === undefined ? undefined : links.get(i);
    if (!a || !b) return 0;
    return Math.max(0, rx ? b.rxBytes - a.rxBytes : b.txBytes - a.txBytes);
  }

  /**
   * Whether each split's class (a shard's node class, a namespace's class on a shard) is over its
   * ceil now (negative ctokens) or went over it since the last tick (its htb `overlimits` grew), by
   * `${ifb} ${class id}`: one batched RTM_GETTCLASS for all of them.
   */
  private async overlimits(
    dirs: readonly Direction[],
    shards: Map<Direction, ShardView[]>,
    groups: Map<Direction, GroupView[]>,
    links: Map<number, LinkStats>,
  ): Promise<Set<string>> {
    const want: Array<{ key: string; ifindex: number; handle: number }> = [];
    const add = (ifb: string, id: number) => {
      const ifindex = this.ifindex(ifb, links);
      if (ifindex !== undefined) want.push({ key: `${ifb} ${id}`, ifindex, handle: 0x10000 + id });
    };
    for (const d of dirs) {
      const view = shards.get(d) ?? [];
      if (view.length > 1) for (const s of view) add(s.ifb, NODE_CLASS);
      for (const g of groups.get(d) ?? []) for (const s of g.shards) add(s.ifb, g.gid);
    }
    const over = new Set<string>();
    const seen = new Map<string, number>();
    if (want.length === 0 || !this.sock) {
      this.overs = seen;
      return over;
    }
    const answers = await this.sock.classGet(want.map(({ ifindex, handle }) => ({ ifindex, handle })));
    for (const [k, w] of want.entries()) {
      const a = answers[k];
      if (!a || a instanceof Error) continue;
      const was = this.overs.get(w.key);
      // Over its ceil now (in debt: a class whose ceil just shrank can wait there for seconds), or went over it since the last tick.
      if ((a.ctokens ?? 0) < 0 || (was !== undefined && a.overlimits > was)) over.add(w.key);
      seen.set(w.key, a.overlimits);
    }
    this.overs = seen;
    return over;
  }

  /** A direction's shards' shares moved by demand (shares.ts), when they moved enough to change. */
  private async reshare(
    dir: Direction,
    shards: ShardView[],
    links: Map<number, LinkStats>,
    before: Map<number, LinkStats>,
    secs: number,
    overs: Set<string>,
  ): Promise<void> {
    const capacity = this.host.capacity(dir);
    if (capacity === undefined) return;
    const sent = (s: ShardView) => this.moved(s.ifb, false, links, before);
    const { next, loads } = this.split(`${dir} 0`, capacity, shards, sent, (s) => overs.has(`${s.ifb} ${NODE_CLASS}`), links, before, secs);
    if (!next) return;
    await this.host.setShares(dir, next);
    this.log.debug({ direction: dir, shares: next, rates: loads.map((l) => Math.round(l.rate)) }, 'shards: shares moved');
  }

  /** A namespace's shares of its total moved by its pods' demand on each shard (their veths), as the node's are. */
  private async reshareGroup(
    dir: Direction,
    g: GroupView,
    links: Map<number, LinkStats>,
    before: Map<number, LinkStats>,
    secs: number,
    overs: Set<string>,
  ): Promise<void> {
    const rx = dir === 'egress';
    const sent = (s: ShardView) => s.veths.reduce((b, v) => b + this.moved(v.veth, rx, links, before), 0);
    const limited = (s: ShardView) => overs.has(`${s.ifb} ${g.gid}`);
    const { next, loads } = this.split(`${dir} ${g.gid}`, g.total, g.shards, sent, limited, links, before, secs);
    if (!next) return;
    await this.host.setGroupShares(dir, g, next);
    this.log.debug(
      { direction: dir, namespaceClass: g.gid, shares: next, rates: loads.map((l) => Math.round(l.rate)) },
      'namespace: shares of its total moved',
    );
  }

  /**
   * The next shares of `total` over `shards` (undefined: none moved enough), each shard's demand
   * `sent` bytes in the tick; `key` names the split (direction and namespace class) for the rates
   * of the tick before.
   */
  private split(
    key: string,
    total: number,
    shards: readonly ShardView[],
    sent: (s: ShardView) => number,
    limited: (s: ShardView) => boolean,
    links: Map<number, LinkStats>,
    before: Map<number, LinkStats>,
    secs: number,
  ): { next: number[] | undefined; loads: ShardLoad[] } {
    // A pod's traffic that way on its veth: received from it (egress), sent to it (ingress).
    const rx = key.startsWith('egress ');
    const bits = (bytes: number) => (bytes * 8) / secs;
    const loads: ShardLoad[] = shards.map((s) => {
      const active = s.veths.filter((v) => bits(this.moved(v.veth, rx, links, before)) >= ACTIVE_BITS);
      const rate = bits(sent(s));
      const last = this.rates.before.get(`${key} ${s.ifb}`);
      const since = this.wanted.get(`${key} ${s.ifb}`);
      const load: ShardLoad = {
        // A guarantee is a shard's floor while its pod sends: an idle pod's is lent to the others (as htb does in one tree).
        floor: active.reduce((g, v) => g + v.guarantee, 0),
        share: s.share,
        rate,
        weight: active.reduce((w, v) => w + bandWeight(v.band), 0),
        ...(last !== undefined ? { last } : {}),
        // A class in debt that no longer sends (its pods went idle) waits for nothing; "sends" is relative to
        // its share (a shard at the least share of a small total never sends ACTIVE_BITS).
        ...(limited(s) && rate >= Math.min(ACTIVE_BITS, s.share / 4) ? { limited: true } : {}),
        ...(since !== undefined && this.now - since < HOLD_MS ? { held: true } : {}),
      };
      if (wantOf(load) === Number.POSITIVE_INFINITY) this.wanted.set(`${key} ${s.ifb}`, this.now);
      return load;
    });
    for (const [k, s] of shards.entries()) this.rates.now.set(`${key} ${s.ifb}`, loads[k]?.rate ?? 0);
    const next = sharesToSet(
      total,
      shards.map((s) => s.share),
      waterFill(total, loads),
      loads.map((l) => l.floor),
    );
    return { next, loads };
  }

  private async decide(
    dir: Direction,
    pods: Array<{ id: string; hostVeth: string; out: boolean }>,
    links: Map<number, LinkStats>,
    before: Map<number, LinkStats>,
    secs: number,
    now: number,
  ): Promise<void> {
    const capacity = this.host.capacity(dir) ?? 0;
    const moved = (name: string, rx: boolean): number => this.moved(name, rx, links, before);
    let bytes = 0;
    for (const ifb of this.host.ifbs(dir)) bytes += moved(ifb, false);
    const seen: SteerPod[] = pods.map((p) => {
      const b = p.out ? moved(p.hostVeth, dir === 'egress') : 0;
      bytes += b;
      return { id: p.id, out: p.out, rate: (b * 8) / secs };
    });
    const demand = (bytes * 8) / secs;
    const was = this.phase[dir];
    const next = nextPhase(was, demand, capacity, now);
    this.phase[dir] = next;
    const plan = steerPlan(next.hot, seen);
    if (was.hot !== next.hot)
      this.log.info(
        { direction: dir, demand: Math.round(demand), capacity, hot: next.hot, steer: plan.into.length + plan.out.length },
        next.hot
          ? 'node near its capacity: best-effort pods go into the tree'
          : 'node far from its capacity: best-effort pods leave the tree',
      );
    const t0 = performance.now();
    if (plan.into.length > 0) await this.host.steer(dir, plan.into, true);
    if (plan.out.length > 0) await this.host.steer(dir, plan.out, false);
    if (plan.into.length + plan.out.length > 0)
      this.log.debug(
        { direction: dir, into: plan.into.length, out: plan.out.length, ms: +(performance.now() - t0).toFixed(1) },
        'best-effort pods steered',
      );
  }
}
