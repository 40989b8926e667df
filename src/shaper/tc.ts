/**
 * Pod bandwidth shaping with tc, both directions, a fixed set of kernel objects per pod (nothing
 * listed or searched per pod).
 *
 * Each shaped direction is an htb class at the pod's limit with two leaves, `interactive` (the pod's
 * small packets, ICMP, DNS answers) served before `bulk` (tc-layout.ts says which, sizing.ts why).
 *
 * The layout and its lines: tc-layout.ts; what a change deletes and installs, and the pool of idle
 * ifb classes: tc-plan.ts; what it costs and buys, measured: docs/shaping.md.
 *
 * The pods' egress goes to `shards` ifbs (egress shards), each with the same structure, its own htb
 * tree and its own class ids: a new shaped pod goes to the shard with the fewest and keeps it for
 * as long as its egress is shaped. An htb qdisc is one lock and an ifb one tasklet, which every
 * packet through it takes in turn: shards let pods on different CPUs shape in parallel
 * (docs/shaping.md, "Egress shards"). With a capacity (ShaperOptions.capacity) every pod's traffic
 * passes a tree that way (node class, namespace classes, pod classes with guarantees and bands;
 * docs/shaping.md, "The node's trees"): one per egress shard, and as many ingress shards (`<ifb>.in`,
 * `<ifb>.i1`, ...) for traffic to the pods; with more than one shard that way each shard's node
 * class is at its share of the capacity, and a namespace's class on each shard at its share of the
 * namespace's total, both moved by demand (shares.ts, groups.ts, steering.ts).
 *
 * Every operation is one batch of tc lines, written to one long-lived `tc -batch -` process (or,
 * with tcMode 'exec', one spawn per operation). What is installed per pod (class id, filter handles,
 * limits: a `ShapingState`) lives in memory; the shaper writes nothing to disk. `ensure` returns the
 * pod's state and the caller keeps it with the pod (the agent: in the pod record, src/pod/records/record.ts,
 * written once per change), and hands every kept state to `init` after a restart, so the process
 * knows its objects without parsing; `init` does ONE listing of each shard's ifb to find the shared
 * structure and to delete classes and filters no known state claims. An ifb without the interactive
 * tables (an earlier version's layout) is rebuilt there, restoring every known pod in the new
 * layout; veths get theirs on the pod's next ensure (reconcile). The ifbs are kept when the last
 * pod goes (creating them is the expensive part and they cost nothing idle); `reset()` removes them.
 */
import { performance } from 'node:perf_hooks';
import { AggregateKubenetError, ConfigError } from '../errors.js';
import * as nl from '../netlink/index.js';
import { silentLogger, type Logger } from '../log.js';
import { moduleLogger } from '../util/module-logger.js';
import { KeyedMutex } from '../util/keyed-mutex.js';
import { runAll } from '../util/pool.js';
import { checkIfName } from '../net/ifname.js';
import { ipFamily } from '../net/ip.js';
import { checkLimits, isBestEffort, isUnshaped, type BandwidthLimits } from '../bandwidth/limits.js';
import type { TreeParams } from './sizing.js';
import { batch, TcSession, type BatchOptions, type BatchResult } from './tc-exec.js';
import { classBaseline, CounterReader, type CounterSnapshot } from './counters.js';
import {
  bulkLeafLines,
  DEFAULT_CLASS,
  DEFAULT_IFB,
  ifbLines,
  ifbLinkLines,
  ingressIfb,
  ingressShardOf,
  MAX_INGRESS_SHARDS,
  NODE_CLASS,
  redirectLines,
  shardOf,
  STATE_VERSION,
  structureLines,
  TABLES,
  treeLines,
  vethToIfbLines,
  type Direction,
} from './tc-layout.js';
import type { ShapingState } from './tc-layout.js';
import { parseIfbListing, type IfbListing } from './tc-listing.js';
import { bypasses, type ClassIds, ifbSideDelLines, orphanLines, planEnsure, Shards, type Trees } from './tc-plan.js';
import { GroupIds, groupMembers, GroupSplit, type GroupSync, type GroupView, type ShardIfbOf } from './groups.js';
import { ensureUnshaped, type Unshaped } from './unshaped.js';
import { outsideAfterEnsure } from './outside.js';
import { Steering, type ShardView } from './steering.js';
import { ShardShares } from './shares.js';
import { adoptSteering, bestEffortPods, steerPods, type SteerContext } from './steer-ops.js';

export { DEFAULT_IFB, MAX_CLASS, MAX_SHARDS, shardIfb, type ShapingState } from './tc-layout.js';
export { parseIfbListing } from './tc-listing.js';

export interface PodShaping {
  /** Stable pod key, e.g. the sandbox container id. */
  id: string;
  /** Host side of the pod's veth, a port of the bridge; '' installs only the ifb side of its egress (the veth to come). */
  hostVeth: string;
  /** Pod IPs without prefix, IPv4 and/or IPv6. */
  ips: string[];
  limits: BandwidthLimits;
  /** The pod's namespace: in a tree, a direction whose limits carry a total puts the pod under the namespace's class. */
  group?: string;
}

export interface ShaperOptions {
  /** The ifb carrying the pods' egress (shard 0); default 'kubenet-ifb0'. */
  ifbName?: string;
  /**
   * How many ifbs (shards, each its own htb tree: `ifbName`, `ifbName.1`, ...) carry the pods' egress;
   * a new shaped pod goes to the one with the fewest and stays. Default 1. Why: docs/shaping.md.
   */
  shards?: number;
  logger?: Logger;
  /**
   * 'session' (default): one long-lived `tc -batch -` process fed per operation (a line through it
   * costs far less than a spawn); 'exec': one `tc -batch -` spawn per operation. Kept for comparison
   * and fallback. Measured: docs/shaping.md, "Spawns and the tc session".
   */
  tcMode?: 'session' | 'exec';
  /** Destinations not shaped (unshaped.ts), made at init and changed by setUnshaped; unset: untouched, empty: removed. */
  unshaped?: Unshaped;
  /**
   * The node's capacity per direction, bits/s (src/bandwidth/capacity.ts). With an egress capacity
   * the pods' egress passes a tree (sizing.ts TreeParams) on each egress shard, the capacity split
   * over them (shares.ts); pods without a ceiling at the capacity, so guarantees hold against every
   * pod. Unset: the flat layout (ceilings only). With an ingress capacity, traffic to every pod is
   * redirected from its veth's root to its ingress shard (`<ifbName>.in`, `<ifbName>.i1`, ...),
   * each holding an ingress tree, classified by destination.
   */
  capacity?: { egress?: number; ingress?: number };
}

/** Whether the link exists (one ioctl); '' never does. */
function linkExists(name: string): boolean {
  return name !== '' && nl.linkIndexByName(name) !== undefined;
}

export class Shaper {
  readonly ifbName: string;
  private readonly log: Logger;
  private readonly records = new Map<string, ShapingState>();
  private readonly shards: Shards;
  private readonly mutex = new KeyedMutex();
  private readonly counterReader = new CounterReader();
  private ready: Promise<void> | undefined;
  private readonly session: TcSession | undefined;
  private unshaped: Unshaped | undefined;
  /** The node's egress tree; undefined: the flat layout. */
  readonly tree: TreeParams | undefined;
  /** The node's ingress tree and its (first) ifb; undefined: per-veth htb (the flat layout). */
  readonly ingressTree: { ifb: string; tree: TreeParams } | undefined;
  /** With an ingress tree: its shards (as many as the egress ones, at most MAX_INGRESS_SHARDS) and their class ids. */
  private readonly inShards: Shards | undefined;
  /** With an ingress tree on several shards: the ingress capacity's split over them. */
  private readonly inShares: ShardShares | undefined;
  /** The namespaces' class ids in the trees. */
  private readonly groupIds = new GroupIds();
  /** Pods to move to another shard at their next ensure, by direction (an upgrade from fewer shards: Shards.crowded). */
  private readonly rehome = { egress: new Set<string>(), ingress: new Set<string>() };
  /** The namespaces' shares of their totals over the shards their pods are on (groups.ts). */
  private readonly groupSplit = new GroupSplit((d) => (d === 'egress' ? this.tree : this.ingressTree?.tree));
  /** With a tree on several egress shards: the capacity's split over them (shares.ts). */
  private readonly shares: ShardShares | undefined;
  /** With a tree: best-effort pods kept out of it while the node is far from its capacity (steering.ts). */
  private readonly steering: Steering | undefined;

  constructor(opts: ShaperOptions = {}) {
    this.unshaped = opts.unshaped;
    const cap = opts.capacity?.egress;
    if (cap !== undefined) checkLimits({ egress: cap }, 'egress capacity');
    this.tree = cap === undefined ? undefined : { capacity: cap };
    const capIn = opts.capacity?.ingress;
    if (capIn !== undefined) checkLimits({ ingress: capIn }, 'ingress capacity');
    this.session = (opts.tcMode ?? 'session') === 'session' ? new TcSession() : undefined;
    this.ifbName = opts.ifbName ?? DEFAULT_IFB;
    checkIfName(this.ifbName, 'ifbName');
    const inIfb = ingressIfb(this.ifbName);
    if (capIn !== undefined) checkIfName(inIfb, "ifbName with an ingress capacity (its ingress tree's ifb, <ifbName>.in)");
    this.ingressTree = capIn === undefined ? undefined : { ifb: inIfb, tree: { capacity: capIn } };
    this.shards = new Shards(this.ifbName, opts.shards ?? 1);
    const inCount = Math.min(opts.shards ?? 1, MAX_INGRESS_SHARDS);
    this.inShards = capIn === undefined ? undefined : new Shards(this.ifbName, inCount, 'ingress');
    // Several trees under a capacity: each shard's node class at its share (shares.ts).
    this.shares = cap !== undefined && this.shards.ifbs.length > 1 ? new ShardShares(cap, this.shards.ifbs) : undefined;
    this.inShares = capIn !== undefined && this.inShards && inCount > 1 ? new ShardShares(capIn, this.inShards.ifbs) : undefined;
    this.log = moduleLogger(opts.logger ?? silentLogger(), 'shaper');
    this.steering =
      this.tree || this.ingressTree
        ? new Steering(
            {
              capacity: (d) => (d === 'egress' ? this.tree?.capacity : this.ingressTree?.tree.capacity),
              ifbs: (d) => (d === 'egress' ? this.ifbs : (this.inShards?.ifbs ?? [])),
              bestEffort: (d) => bestEffortPods(this.records.values(), d),
              steer: (d, ids, into) => steerPods(this.steerCtx, d, ids, into),
              shards: (d) => this.shardLoads(d),
              setShares: (d, next) => this.setShares(d, next),
              groups: (d) => this.groupViews(d),
              setGroupShares: (d, view, next) => this.setGroupShares(d, view, next),
            },
            this.log,
          )
        : undefined;
  }

  /** Whether a pod with these limits has anything installed: a ceiling or guarantee, or (with the node's tree) any pod at all. */
  wants(limits: BandwidthLimits): boolean {
    return this.tree !== undefined || this.ingressTree !== undefined || !isUnshaped(limits);
  }

  /** The trees tc-plan.ts plans a pod's change in (its ingress shard's ifb). */
  private treesOf(rec: ShapingState): Trees {
    const inTree = this.inTreeOf(rec);
    return { ...(this.tree ? { egress: this.tree } : {}), ...(inTree ? { ingress: inTree } : {}) };
  }

  /** The pod's ingress tree: its ingress shard's ifb and the tree; undefined without one. */
  private inTreeOf(rec: ShapingState): { ifb: string; tree: TreeParams } | undefined {
    return this.ingressTree && this.inShards ? { ifb: this.inShards.ifbOf(rec), tree: this.ingressTree.tree } : undefined;
  }

  /** Every ifb the shaper needs: the egress shards', and the ingress shards'. */
  private get allIfbs(): string[] {
    return [...this.ifbs, ...(this.inShards?.ifbs ?? [])];
  }

  /** Whether a pod with these limits has its egress on an ifb. */
  shapesEgress(limits: BandwidthLimits): boolean {
    return this.tree !== undefined || limits.egress !== undefined;
  }

  /** The egress shards' ifbs, by shard. */
  get ifbs(): readonly string[] {
    return this.shards.ifbs;
  }

  private ifbOf = (rec: ShapingState): string => this.shards.ifbOf(rec);

  /**
   * Ensures the shared ifb and its htb/u32 structure, adopts `known` (the states an earlier process
   * installed, as its caller kept them), and removes classes and filters none of them claims (one
   * listing). Only the first call adopts: later ones return the same readiness.
   */
  init(known: ShapingState[] = []): Promise<void> {
    this.ready ??= this.doInit(known).catch((err: unknown) => {
      this.ready = undefined;
      throw err;
    });
    return this.ready;
  }

  private async doInit(known: ShapingState[]): Promise<void> {
    const t0 = performance.now();
    if (this.records.size === 0) {
      this.adopt(known);
      if (this.steering) await adoptSteering(this.steerCtx);
      // Pods an earlier process put on fewer shards spread over today's at their next ensure (the reconcile after a start).
      for (const id of this.shards.crowded(this.records.values())) this.rehome.egress.add(id);
      for (const id of this.inShards?.crowded(this.records.values()) ?? []) this.rehome.ingress.add(id);
      if (this.rehome.egress.size + this.rehome.ingress.size > 0)
        this.log.info({ egress: this.rehome.egress.size, ingress: this.rehome.ingress.size }, 'pods to spread over more shards');
    }
    // The namespaces' classes split anew over their shards (a restart does not keep what demand moved).
    const split = this.groupSync([...this.records.values()], this.records.values());
    const links = new Map((await nl.linkList()).map((l) => [l.name, l]));
    await batch('ip', ifbLinkLines(this.allIfbs, links));
    for (const [k, ifb] of this.ifbs.entries())
      await this.initIfb(
        ifb,
        'egress',
        [...this.records.values()].filter((r) => (r.shard ?? 0) === k),
        this.shards.classIds(k),
        this.shares?.tree(k) ?? this.tree,
      );
    if (this.inShards && this.ingressTree)
      for (const [k, ifb] of this.inShards.ifbs.entries())
        await this.initIfb(
          ifb,
          'ingress',
          [...this.records.values()].filter((r) => (r.ingressShard ?? 0) === k),
          this.inShards.classIds(k),
          this.inShares?.tree(k) ?? this.ingressTree.tree,
        );
    // The shares the last process left (a restart changes nothing), or an even split.
    for (const sh of [this.shares, this.inShares])
      if (sh && !sh.adopt(sh.ifbs.map((ifb) => nl.classGet(nl.linkIndexByName(ifb) ?? 0, 0x10000 + NODE_CLASS)?.rate)))
        await this.tc(sh.lines(), { force: true });
    if (split.replace.length > 0) await this.tc(split.replace, { force: true });
    await this.removeExtraShards();
    // Today's sizing for the pods an earlier process shaped (an upgrade's reaches them without a re-shape).
    const leaves = [...this.records.values()].flatMap((r) => bulkLeafLines(this.ifbOf(r), r, this.tree, this.inTreeOf(r)));
    if (leaves.length > 0) await this.tc(leaves, { force: true });
    if (this.unshaped) await ensureUnshaped((lines, o) => this.tc(lines, o), this.ifbs, this.unshaped, this.log);
    this.steering?.start();
    this.log.info(
      { ifb: this.ifbName, ms: +(performance.now() - t0).toFixed(1), pods: this.records.size, shards: this.ifbs.length },
      'shaper ready',
    );
  }

  /**
   * One ifb's htb/u32 structure (an egress shard's, or the ingress tree's), its pods' classes restored
   * or its orphans removed (one listing).
   */
  private async initIfb(
    ifb: string,
    dir: Direction,
    states: ShapingState[],
    ids: ClassIds | undefined,
    tree: TreeParams | undefined,
  ): Promise<void> {
    const listing = parseIfbListing(
      (await batch('tc', [`qdisc show dev ${ifb}`, `class show dev ${ifb}`, `filter show dev ${ifb} parent 1:`])).stdout,
    );
    // An ifb without the interactive tables is an earlier version's layout: rebuilt like a broken one.
    // So is one of the other layout (flat or tree: the root's default class tells, and cannot change).
    const healthy =
      listing.htbRoot &&
      TABLES.every((t) => listing.tables.has(t) && listing.links.has(t)) &&
      (listing.defaultClass !== 0) === (tree !== undefined);
    // This ifb's view of each pod: its class id and filters here.
    const mine = dir === 'egress' ? states.filter((r) => r.egressInstalled) : states.filter((r) => r.ingressInstalled && r.ingressClassId);
    const here = (r: ShapingState): ShapingState => {
      if (dir === 'egress') return r;
      const v: ShapingState = { ...r, classId: r.ingressClassId ?? 0, filters: r.ingressFilters ?? [] };
      if (r.ingressParent) v.egressParent = r.ingressParent;
      else delete v.egressParent;
      return v;
    };
    const podLines = (r: ShapingState) => ifbLines(ifb, r, tree, dir);
    if (!healthy) {
      const lines = [...(listing.htbRoot ? [`qdisc del dev ${ifb} root`] : []), ...structureLines(ifb, tree, dir)];
      ids?.forgetIdle();
      await this.tc(lines);
      // Every class went with the old root: put back the ifb side of the pods we know.
      // The veth redirects point at the old ifb's index (mirred drops while its device is gone): refresh them, but
      // not those of pods out of the trees (adoptSteering saw none: one added here stays while steering counts them out).
      const redirect = (r: ShapingState) => (dir === 'egress' ? redirectLines(r.hostVeth, ifb) : vethToIfbLines(r.hostVeth, ifb).slice(1));
      const veth = (r: ShapingState) => (!linkExists(r.hostVeth) || bypasses(r, dir) ? [] : redirect(r));
      const restore = [...this.groupSplit.linesOn(ifb, dir, mine), ...mine.flatMap((r) => [...podLines(r), ...veth(r)])];
      const res = await this.tc(restore, { force: true });
      if (res.failed.length > 0)
        this.log.warn({ ifb, failed: res.failed.length, stderr: res.stderr }, 'restoring pod classes after rebuilding the ifb structure');
      this.log.info({ ifb, rebuilt: true, restored: restore.length }, 'ifb structure created');
    } else {
      await this.removeOrphans(ifb, listing, mine.map(here));
      if (tree && !sameRate(nl.classGet(nl.linkIndexByName(ifb) ?? 0, 0x10000 + DEFAULT_CLASS)?.ceil, tree.capacity)) {
        // Another capacity than the last process's: the node class and every pod's ceiling follow it.
        const res = await this.tc([...treeLines(ifb, tree), ...mine.flatMap(podLines)], { force: true });
        this.log.info({ ifb, dir, capacity: tree.capacity, failed: res.failed.length }, 'capacity changed: the tree follows');
      }
    }
  }

  /**
   * Shards of an earlier configuration with more of them (`ifbName.k`, k >= shards) are deleted; their
   * pods lost their ifb side in adopt() and get it back on a shard of now at their next ensure (the
   * agent's reconcile after a start).
   */
  private async removeExtraShards(): Promise<void> {
    const inCount = this.inShards?.ifbs.length ?? 0;
    const extra = (await nl.linkList())
      .filter(
        (l) =>
          l.type === 'ifb' &&
          ((shardOf(this.ifbName, l.name) ?? 0) >= this.ifbs.length || (ingressShardOf(this.ifbName, l.name) ?? -1) >= inCount),
      )
      .map((l) => l.name);
    if (extra.length === 0) return;
    const res = await batch(
      'ip',
      extra.map((n) => `link del dev ${n}`),
      { force: true },
    );
    this.log.info(
      { removed: extra.length - res.failed.length, ifbs: extra },
      'removed egress shards beyond the configured count, or an ingress tree no capacity asks for',
    );
  }

  /** Per-operation tc lines: through the session, or one exec. */
  private tc = (lines: string[], opts: BatchOptions = {}): Promise<BatchResult> =>
    this.session ? this.session.run(lines, opts) : batch('tc', lines, opts);

  private async removeOrphans(ifb: string, listing: IfbListing, owners: ShapingState[]): Promise<void> {
    const lines = orphanLines(ifb, listing, owners);
    if (lines.length === 0) return;
    const res = await this.tc(lines, { force: true });
    this.log.info({ ifb, removed: lines.length - res.failed.length, failed: res.failed.length }, 'removed orphaned classes and filters');
  }

  /** Takes over the states a caller kept; a class claimed twice, out of range or on a shard that is no more loses its ifb side (the next ensure re-creates it). */
  private adopt(known: ShapingState[]): void {
    this.records.clear();
    this.shards.clear();
    this.inShards?.clear();
    this.groupIds.clear();
    this.groupSplit.clear();
    for (const k of known) {
      if (k?.version !== STATE_VERSION || typeof k.id !== 'string') continue;
      const rec: ShapingState = { ...k, ips: [...k.ips], limits: { ...k.limits }, filters: [...k.filters] };
      // A shard beyond today's count (an earlier configuration had more) is gone with its ifb.
      if (rec.classId && !this.shards.classIds(rec.shard)?.claim(rec.classId)) {
        rec.classId = 0;
        rec.egressInstalled = false;
        rec.filters = [];
        delete rec.shard;
      }
      // Its ingress class: kept while there is an ingress tree (else the ifb goes, and its next
      // ensure, seeing the id, replaces the veth's redirect root by today's layout).
      if (rec.ingressClassId && this.inShards && !this.inShards.classIds(rec.ingressShard)?.claim(rec.ingressClassId)) {
        delete rec.ingressClassId;
        delete rec.ingressFilters;
        delete rec.ingressShard;
        rec.ingressInstalled = false;
      }
      // Its namespace's class: a pod whose class cannot be claimed is re-made under it on its next ensure.
      for (const p of ['egressParent', 'ingressParent'] as const) {
        const gid = rec[p];
        if (gid !== undefined && !(rec.group !== undefined && this.groupIds.claim(rec.group, gid))) delete rec[p];
      }
      this.records.set(rec.id, rec);
    }
  }

  /**
   * Idempotent: installs or updates the pod's shaping and returns what is now installed (for the
   * caller to keep); limits with neither direction remove it (and return undefined).
   */
  async ensure(pod: PodShaping): Promise<ShapingState | undefined> {
    if (pod.hostVeth !== '' || !this.shapesEgress(pod.limits)) checkIfName(pod.hostVeth, 'hostVeth');
    if (typeof pod.id !== 'string' || pod.id === '') throw new ConfigError('pod id must be a non-empty string');
    checkLimits(pod.limits, `pod ${pod.id}`);
    const perFamily = { 4: 0, 6: 0 };
    for (const ip of pod.ips) perFamily[ipFamily(ip)]++;
    if (perFamily[4] > 2 || perFamily[6] > 2)
      throw new ConfigError(`pod ${pod.id}: the shaper classifies at most two addresses per family`);
    if (!this.wants(pod.limits)) {
      await this.remove(pod.id);
      return undefined;
    }
    await this.init();
    if ((this.shapesEgress(pod.limits) || this.ingressTree) && this.allIfbs.some((ifb) => !linkExists(ifb))) {
      // Someone deleted a shard's ifb under us: rebuild it (and restore the known pods) once.
      this.log.warn('an egress ifb is gone; re-initializing');
      this.session?.close();
      this.ready = undefined;
      await this.init();
    }
    // Pods of namespaces with a total one at a time (each sizes its namespace's class from the others); the rest in parallel.
    const hasTotal = pod.limits.egressTotal !== undefined || pod.limits.ingressTotal !== undefined;
    const grouped = (pod.group !== undefined && hasTotal) || this.records.get(pod.id)?.group !== undefined;
    return this.mutex.run(pod.id, () => (grouped ? this.mutex.run(GROUPS_KEY, () => this.doEnsure(pod)) : this.doEnsure(pod)));
  }

  private async doEnsure(pod: PodShaping): Promise<ShapingState> {
    const t0 = performance.now();
    const log = this.log.child({ pod: pod.id });
    const prev = this.records.get(pod.id);
    const veth = pod.hostVeth;
    if (veth === '' && prev?.hostVeth) return { ...prev }; // the ifb side first is for a new pod only; a shaped one keeps its veth
    const limits: BandwidthLimits = { ...pod.limits };
    const egress = this.shapesEgress(limits);
    const rec: ShapingState = {
      version: STATE_VERSION,
      id: pod.id,
      hostVeth: veth,
      ips: [...pod.ips],
      limits,
      classId: prev?.classId ?? 0,
      ...(prev?.classId ? { shard: prev.shard ?? 0 } : {}),
      ingressInstalled: (limits.ingress !== undefined || this.ingressTree !== undefined) && veth !== '',
      egressInstalled: egress,
      filters: [],
      ...(egress && prev?.classId && prev.egressBase ? { egressBase: prev.egressBase } : {}),
    };
    // Under its namespace's class the way the namespace has a total (in a tree).
    const inGroup = {
      egress: !!this.tree && rec.egressInstalled && limits.egressTotal !== undefined,
      ingress: !!this.ingressTree && rec.ingressInstalled && limits.ingressTotal !== undefined,
    };
    if (pod.group !== undefined && (inGroup.egress || inGroup.ingress)) {
      const gid = this.groupIds.idOf(pod.group);
      rec.group = pod.group;
      if (inGroup.egress) rec.egressParent = gid;
      if (inGroup.ingress) rec.ingressParent = gid;
    }
    // A best-effort pod out of the tree that way keeps being out; a new one (or on a new veth) starts out while the node is far from its capacity.
    const inTreeWay = { egress: !!this.tree && rec.egressInstalled, ingress: !!this.ingressTree && (rec.ingressInstalled || veth === '') };
    const bypass = (['egress', 'ingress'] as const).filter(
      (d) =>
        this.steering !== undefined &&
        inTreeWay[d] &&
        isBestEffort(limits, d) &&
        (prev && prev.hostVeth === veth ? bypasses(prev, d) : !this.steering.hot(d)),
    );
    if (bypass.length > 0) rec.bypass = bypass;
    const outside = outsideAfterEnsure(prev && prev.hostVeth === veth ? prev : undefined, bypass);
    if (outside) rec.outside = outside;
    let allocated = false;
    let allocatedIn = false;
    // A pod to spread (rehome) leaves its shard: its ifb side there goes (its classes idle), and it is made anew on the emptiest.
    const moves = !!prev?.classId && rec.egressInstalled && this.rehome.egress.delete(pod.id);
    const movesIn = !!prev?.ingressClassId && rec.ingressInstalled && this.rehome.ingress.delete(pod.id);
    if (prev && (moves || movesIn)) {
      const was = { ...(moves ? { egress: this.ifbOf(prev) } : {}), ...(movesIn ? { ingress: this.inTreeOf(prev)?.ifb } : {}) };
      await this.tc(ifbSideDelLines(prev, was), { force: true });
      if (moves) giveBack(this.shards.mustClassIds(prev.shard), prev.classId, prev.egressParent);
      if (movesIn && prev.ingressClassId) giveBack(this.inShards?.mustClassIds(prev.ingressShard), prev.ingressClassId, prev.ingressParent);
      if (moves) {
        rec.classId = 0;
        delete rec.shard;
        delete rec.egressBase;
      }
      log.info({ egress: moves, ingress: movesIn }, 'pod spread to another shard');
    }
    const moved = {
      ...(moves ? { classId: 0, filters: [], egressInstalled: false } : {}),
      ...(movesIn ? { ingressClassId: 0, ingressFilters: [] } : {}),
    };
    const planPrev = prev && (moves || movesIn) ? { ...prev, ...moved } : prev;
    if (this.ingressTree && this.inShards && rec.ingressInstalled) {
      if (prev?.ingressClassId && !movesIn) {
        rec.ingressClassId = prev.ingressClassId;
        if (prev.ingressShard) rec.ingressShard = prev.ingressShard;
        if (prev.ingressBase) rec.ingressBase = prev.ingressBase;
      } else {
        const shard = this.inShards.emptiest(this.records.values());
        const { id, reused } = this.inShards.mustClassIds(shard).allocate(rec.ingressParent !== undefined);
        rec.ingressClassId = id;
        if (shard) rec.ingressShard = shard;
        allocatedIn = true;
        const base = reused ? classBaseline(this.inShards.ifbOf(rec), id) : undefined;
        if (base) rec.ingressBase = base;
      }
    }
    if (rec.egressInstalled && !rec.classId) {
      const shard = this.shards.emptiest(this.records.values());
      const { id, reused } = this.shards.mustClassIds(shard).allocate(rec.egressParent !== undefined);
      rec.classId = id;
      rec.shard = shard;
      allocated = true;
      // Classes of an earlier pod, taken from the pool: what they counted so far is not this pod's.
      const base = reused ? classBaseline(this.ifbOf(rec), id) : undefined;
      if (base) rec.egressBase = base;
    }
    const ifb = this.ifbOf(rec);
    const plan = planEnsure(
      ifb,
      planPrev,
      rec,
      prev !== undefined && prev.hostVeth !== veth && linkExists(prev.hostVeth),
      this.treesOf(rec),
    );
    const pre = plan.pre;
    // Its namespace's classes first (a pod class needs its parent), split with the pod as it is now.
    const groups = this.groupSync(prev ? [prev, rec] : [rec], new Map(this.records).set(pod.id, rec).values(), rec);
    const lines = [...groups.replace, ...plan.lines];
    const optional = new Set([...plan.optional].map((n) => n + groups.replace.length));
    try {
      // Deletes of what the pod no longer has: absent is fine.
      if (pre.length > 0) {
        const r = await this.tc(pre, { force: true });
        if (r.failed.length > 0) log.debug({ stderr: r.stderr }, 'some stale shaping objects were already gone');
      }
      await this.tc(lines, { optional });
    } catch (err) {
      if (!prev) {
        // Roll back a half-done new setup.
        await this.kernelRemove(rec, log).catch(() => undefined);
      } else {
        // An update that took a new class id (e.g. the ingress tree's, once the veth of a pod whose
        // ifb side came first is known) made its filters and leaves before failing: undone, or its
        // filters would outlive the id's next pod (the churn e2e saw them).
        const undo = ifbSideDelLines(rec, {
          ...(allocated ? { egress: this.ifbOf(rec) } : {}),
          ...(allocatedIn && this.inShards ? { ingress: this.inShards.ifbOf(rec) } : {}),
        });
        if (undo.length > 0) await this.tc(undo, { force: true }).catch(() => undefined);
      }
      if (allocated) giveBack(this.shards.mustClassIds(rec.shard), rec.classId, rec.egressParent);
      if (allocatedIn && rec.ingressClassId) giveBack(this.inShards?.mustClassIds(rec.ingressShard), rec.ingressClassId, rec.ingressParent);
      for (const [d, gid] of groups.keys) this.groupSplit.invalidate(d, gid);
      // A move's old side is gone: the pod keeps none that way, and its next ensure makes it anew.
      if (planPrev && planPrev !== prev) this.records.set(pod.id, planPrev);
      throw err;
    }
    if (!rec.ingressClassId && prev?.ingressClassId && !movesIn)
      giveBack(this.inShards?.mustClassIds(prev.ingressShard), prev.ingressClassId, prev.ingressParent);
    if (!rec.egressInstalled && prev?.classId && !moves) {
      giveBack(this.shards.mustClassIds(prev.shard), prev.classId, prev.egressParent);
      rec.classId = 0;
      delete rec.shard;
    }
    this.records.set(pod.id, rec);
    if (prev?.group !== undefined || groups.del.length > 0) await this.dropEmptyGroups(prev ?? rec, groups.del, log);
    log.debug({ ms: +(performance.now() - t0).toFixed(2), limits, classId: rec.classId, ...(rec.classId ? { ifb } : {}) }, 'pod shaped');
    return { ...rec, ips: [...rec.ips], limits: { ...rec.limits }, filters: [...rec.filters] };
  }

  /** What steer-ops.ts works on: the pods' states, their locks, the tc runner and their ifbs. */
  private get steerCtx(): SteerContext {
    return {
      records: this.records,
      mutex: this.mutex,
      tc: this.tc,
      ifbOf: this.ifbOf,
      inIfbOf: (r) => this.inTreeOf(r)?.ifb,
      trees: { egress: this.tree !== undefined, ingress: this.ingressTree !== undefined },
    };
  }

  /** A direction's shards as the share mover sees them (steering.ts; empty without several trees that way). */
  private shardLoads(dir: Direction): ShardView[] {
    const [shards, shares] = dir === 'egress' ? [this.shards, this.shares] : [this.inShards, this.inShares];
    const now = shares?.all();
    if (!now || !shards) return [];
    return shards.loads(this.records.values()).map((l, k) => ({ ifb: shards.ifbs[k] ?? '', share: now[k] ?? 0, ...l }));
  }

  private async setShares(dir: Direction, next: number[]): Promise<void> {
    const sh = dir === 'egress' ? this.shares : this.inShares;
    const was = sh ? [...sh.all()] : [];
    if (!sh) return;
    await this.tc(sh.change(next)).catch((err: unknown) => {
      sh.set(was);
      throw err;
    });
  }

  /** Each shard's share of its direction's capacity now (its node class), with several trees that way. */
  shareView(): Array<{ direction: Direction; ifb: string; share: number }> {
    return (['egress', 'ingress'] as const).flatMap((direction) => {
      const sh = direction === 'egress' ? this.shares : this.inShares;
      return sh ? sh.ifbs.map((ifb, k) => ({ direction, ifb, share: sh.all()[k] ?? 0 })) : [];
    });
  }

  /** A direction's shards' shares of its capacity now, bits/s (undefined with one tree or none). */
  shareOf = (dir: Direction = 'egress'): readonly number[] | undefined => (dir === 'egress' ? this.shares : this.inShares)?.all();

  /** The ifb carrying a pod's traffic to it (its ingress shard's), with an ingress tree. */
  inIfbOfPod(podId: string): string | undefined {
    const r = this.records.get(podId);
    return r?.ingressClassId ? this.inTreeOf(r)?.ifb : undefined;
  }

  /** Whether each direction's best-effort pods are in its tree now (hot), by direction with a tree. */
  steered(): { egress?: boolean; ingress?: boolean } {
    const s = this.steering;
    if (!s) return {};
    return { ...(this.tree ? { egress: s.hot('egress') } : {}), ...(this.ingressTree ? { ingress: s.hot('ingress') } : {}) };
  }

  /** Runs one steering decision now (tests; the shaper runs them every TICK_MS on its own). */
  steerNow(): Promise<void> {
    return this.steering?.tick() ?? Promise.resolve();
  }

  /** Idle egress classes on the ifbs, kept for the next pods (logged with each removal). */
  idleClasses = (): number => this.shards.pooled;

  /**
   * Removes every filter and qdisc of the pod, and its classes on the veth; its classes on the ifb
   * go idle, for the next pod (ClassIds). An unknown pod is a success. With
   * `vethDeleted` (the caller deletes the pod's veth meanwhile) the veth's own qdiscs are left to go
   * with it, and only the ifb side is removed.
   */
  async remove(podId: string, opts: { vethDeleted?: boolean } = {}): Promise<void> {
    await this.init();
    const grouped = this.records.get(podId)?.group !== undefined;
    return this.mutex.run(podId, () =>
      grouped ? this.mutex.run(GROUPS_KEY, () => this.doRemove(podId, opts)) : this.doRemove(podId, opts),
    );
  }

  /** The ifb of a state's shard one way, when it has a class that way. */
  private shardIfbOf: ShardIfbOf = (r, dir) =>
    dir === 'egress' ? (r.egressInstalled && r.classId ? this.ifbOf(r) : undefined) : r.ingressClassId ? this.inTreeOf(r)?.ifb : undefined;

  /** GroupSplit.sync for the namespace classes `touched` (before and after a change) hang under, among `states`. */
  private groupSync(touched: readonly ShapingState[], states: Iterable<ShapingState>, rec?: ShapingState): GroupSync {
    return this.groupSplit.syncAll(touched, [...states], this.shardIfbOf, (r, d) => !bypasses(r, d), rec);
  }

  /** The namespaces on several shards one way, as the share mover sees them. */
  private groupViews(dir: Direction): GroupView[] {
    return this.groupSplit.views(
      dir,
      (gid) => groupMembers(this.records.values(), dir, gid, this.shardIfbOf, (r) => !bypasses(r, dir)).members,
    );
  }

  /** A namespace's shares moved (steering.ts), unless its shards changed since the tick saw them (the next tick sees them). */
  private setGroupShares(dir: Direction, view: GroupView, next: number[]): Promise<void> {
    return this.mutex.run(GROUPS_KEY, async () => {
      const now = this.groupViews(dir).find((g) => g.gid === view.gid);
      if (now?.shards.map((s) => s.ifb).join() !== view.shards.map((s) => s.ifb).join()) return;
      await this.tc(this.groupSplit.change(dir, now, next)).catch((err: unknown) => {
        this.groupSplit.invalidate(dir, view.gid);
        throw err;
      });
    });
  }

  /**
   * After `was` changed or went: the namespace classes it hung under re-split (`lines`: the classes
   * of shards without its pods now deleted), its namespace's id forgotten with its last pod.
   */
  private async dropEmptyGroups(was: ShapingState, del: string[], log: Logger): Promise<void> {
    if (was.group !== undefined && ![...this.records.values()].some((r) => r.group === was.group && (r.egressParent || r.ingressParent)))
      this.groupIds.forget(was.group);
    if (del.length === 0) return;
    const res = await this.tc(del, { force: true });
    if (res.failed.length > 0)
      log.warn({ failed: res.failed.map((n) => del[n - 1]), stderr: res.stderr }, 'a namespace class could not be deleted');
  }

  private async doRemove(podId: string, opts: { vethDeleted?: boolean }): Promise<void> {
    {
      const rec = this.records.get(podId);
      if (!rec) return;
      const log = this.log.child({ pod: podId });
      const t0 = performance.now();
      await this.kernelRemove(rec, log, opts.vethDeleted === true);
      this.records.delete(podId);
      if (rec.classId) giveBack(this.shards.mustClassIds(rec.shard), rec.classId, rec.egressParent);
      if (rec.ingressClassId && this.inShards)
        giveBack(this.inShards.mustClassIds(rec.ingressShard), rec.ingressClassId, rec.ingressParent);
      if (rec.group !== undefined) {
        const after = this.groupSync([rec], this.records.values());
        if (after.replace.length > 0) await this.tc(after.replace, { force: true });
        await this.dropEmptyGroups(rec, after.del, log);
      }
      log.debug({ ms: +(performance.now() - t0).toFixed(2), idleClasses: this.idleClasses() }, 'pod shaping removed');
    }
  }

  /**
   * One forced batch: every step runs. A delete that fails is logged, not thrown: the object is
   * already gone (veth deleted with the pod, kernel state lost) or, if not, init's orphan sweep
   * removes it on the next start.
   */
  private async kernelRemove(rec: ShapingState, log: Logger, vethDeleted = false): Promise<void> {
    const lines: string[] = [];
    if (!vethDeleted && linkExists(rec.hostVeth)) {
      if (rec.egressInstalled && !bypasses(rec, 'egress')) lines.push(`qdisc del dev ${rec.hostVeth} ingress`);
      if (rec.ingressInstalled && !bypasses(rec, 'ingress')) lines.push(`qdisc del dev ${rec.hostVeth} root`);
    }
    const inTree = this.inTreeOf(rec);
    lines.push(...ifbSideDelLines(rec, { egress: this.ifbOf(rec), ...(inTree ? { ingress: inTree.ifb } : {}) }));
    const r = await this.tc(lines, { force: true });
    if (r.failed.length > 0)
      log.warn({ failed: r.failed.map((n) => lines[n - 1]), stderr: r.stderr }, 'some shaping objects were already gone');
  }

  /**
   * After a restart: removes the shaping of pods not in `live` and ensures every live pod (its tc
   * objects put back as its limits say, whatever happened to them meanwhile). `states()` has the
   * result.
   */
  async reconcile(live: PodShaping[]): Promise<void> {
    await this.init();
    const liveIds = new Set(live.map((p) => p.id));
    const work: Array<() => Promise<unknown>> = [];
    for (const id of [...this.records.keys()]) if (!liveIds.has(id)) work.push(() => this.remove(id));
    for (const p of live) work.push(() => this.ensure(p));
    const errors = await runAll(work, 4);
    if (errors.length > 0) throw new AggregateKubenetError('shaper reconcile', errors);
  }

  list(): Array<{ id: string; hostVeth: string; ips: string[]; limits: BandwidthLimits }> {
    return [...this.records.values()].map((r) => ({ id: r.id, hostVeth: r.hostVeth, ips: [...r.ips], limits: { ...r.limits } }));
  }

  /** Every installed state (what a caller keeps to hand to the next process's init). */
  states(): ShapingState[] {
    return [...this.records.values()].map((r) => ({ ...r, ips: [...r.ips], limits: { ...r.limits }, filters: [...r.filters] }));
  }

  /** The htb class id of a pod's egress (for diagnostics and tests); undefined when unshaped. */
  classIdOf = (podId: string): number | undefined => this.records.get(podId)?.classId || undefined;

  /** The ifb carrying a pod's egress (its shard's); undefined when its egress is not shaped. */
  ifbOfPod(podId: string): string | undefined {
    const r = this.records.get(podId);
    return r?.classId ? this.ifbOf(r) : undefined;
  }

  /**
   * The kernel's counters of every shaped pod and every link's own (./counters.ts CounterReader: a
   * netlink socket of its own, off the event loop, re-reading only what can have changed, each
   * shard on its own). `ifindex` may name a pod's veth by index (the pod record has it), which saves
   * a lookup by name per pod. A device that is gone (a pod being deleted) leaves that direction out.
   */
  counters(ifindex?: (podId: string) => number | undefined): Promise<CounterSnapshot> {
    return this.counterReader.read(
      [...this.records.values()],
      (r) => this.ifbOf(r),
      ifindex,
      (r) => this.inTreeOf(r)?.ifb,
    );
  }

  /** Removes the shaping of every pod this shaper knows, and the shards' ifbs. */
  async reset(): Promise<void> {
    const errors: unknown[] = [];
    if (this.records.size > 0) {
      for (const id of [...this.records.keys()]) await this.remove(id).catch((err: unknown) => errors.push(err));
    }
    const present = this.allIfbs.filter(linkExists);
    if (present.length > 0)
      await batch(
        'ip',
        present.map((ifb) => `link del dev ${ifb}`),
      ).catch((err: unknown) => errors.push(err));
    await this.steering?.stop();
    this.records.clear();
    this.shards.clear();
    this.inShards?.clear();
    this.ready = undefined;
    this.session?.close();
    if (errors.length > 0) throw new AggregateKubenetError('shaper reset', errors);
  }

  /** Stops the tc session and closes the counters' socket (the next operation would start new ones). */
  close(): void {
    void this.steering?.stop();
    this.session?.close();
    this.counterReader.close();
  }

  /** Replaces the unshaped destinations live (unshaped.ts: every shard's ifb, the bridge's chain): after init, one change at a time. */
  setUnshaped(u: Unshaped): Promise<void> {
    this.unshaped = u;
    return this.mutex.run('', () => this.init().then(() => ensureUnshaped(this.tc, this.ifbs, u, this.log)));
  }
}

/** An htb rate read back (bytes/s × 8) is the one asked for, within a byte. */
function sameRate(got: number | undefined, want: number): boolean {
  return got !== undefined && Math.abs(got - want) < 8;
}

/** The mutex key the pods of namespaces with a total share (KeyedMutex keys are pod ids otherwise). */
const GROUPS_KEY = '\0groups';

/** A pod's class id back: to the pool of idle classes, or, under a namespace's class (deleted), freed. */
function giveBack(ids: ClassIds | undefined, id: number, parent: number | undefined): void {
  if (!ids) return;
  if (parent) ids.free(id);
  else ids.release(id);
}
