/**
 * What a change of one pod's shaping deletes and installs, decided without the kernel (pure):
 * the egress class ids on the shared ifb, and the tc lines of an ensure (delete-then-create where
 * tc cannot change in place). tc.ts runs the plan. Exact-output tests: test/shaper/tc-layout.test.ts.
 */
import { ConfigError, KubenetError } from '../errors.js';
import { checkIfName } from '../net/ifname.js';
import type { BandwidthLimits } from '../bandwidth/limits.js';
import { DEFAULT_BAND } from '../bandwidth/guarantees.js';
import { podLayout } from './sizing.js';
import type { PodLayout, TreeParams } from './sizing.js';
import type { ShardPod } from './shares.js';
import type { IfbListing } from './tc-listing.js';
import {
  classDelLines,
  egressLayout,
  isGroupClass,
  filterDelLine,
  idleLines,
  filtersFor,
  hex,
  ifbClassIds,
  ifbLines,
  ingressTreeLayout,
  MAX_CLASS,
  MAX_INGRESS_SHARDS,
  MAX_SHARDS,
  ingressShardIfb,
  redirectLines,
  shardIfb,
  TREE_CLASSES,
  VETH,
  vethLines,
  vethToIfbLines,
  type Direction,
  type FilterRef,
  type ShapingState,
} from './tc-layout.js';

/** The node's trees, when it has a capacity that way: egress on the egress ifb, ingress on its own. */
export interface Trees {
  egress?: TreeParams;
  ingress?: { ifb: string; tree: TreeParams };
}

const refOf = ({ prio, proto, handle }: FilterRef): FilterRef => ({ prio, proto, handle });

/**
 * The pods' egress class ids on one ifb, 1..MAX_CLASS, and the pool of idle ones: ids whose classes
 * still exist on the ifb after their pod went (released, not freed). A new pod takes the lowest
 * pooled id before making new classes: a change of an existing htb class costs what it costs with
 * 10 pods, a new one grows with every tcf block on the host (docs/shaping.md).
 */
export class ClassIds {
  private readonly used = new Uint8Array(MAX_CLASS + 1);
  private readonly idle = new Set<number>();

  constructor(private readonly ifbName: string) {}

  /**
   * An id for a pod: a pooled one (`reused`, its classes exist) or the lowest unused; `fresh`: never a
   * pooled one (a pod under a namespace's class: pooled classes are the node class's children).
   * @throws KubenetError when all MAX_CLASS are in use.
   */
  allocate(fresh = false): { id: number; reused: boolean } {
    if (this.idle.size > 0 && !fresh) {
      const id = Math.min(...this.idle);
      this.idle.delete(id);
      this.used[id] = 1;
      return { id, reused: true };
    }
    for (let i = 1; i <= MAX_CLASS; i++) {
      if (!this.used[i] && !this.idle.has(i)) {
        this.used[i] = 1;
        return { id: i, reused: false };
      }
    }
    throw new KubenetError(`shaper: all ${MAX_CLASS} egress classes on ${this.ifbName} are in use`);
  }

  /** Marks a kept id as used; false when it is out of range or already claimed. */
  claim(id: number): boolean {
    if (id < 1 || id > MAX_CLASS || this.used[id]) return false;
    this.idle.delete(id);
    this.used[id] = 1;
    return true;
  }

  /** The pod is gone, its classes stay on the ifb for the next pod. */
  release(id: number): void {
    if (id < 1 || id > MAX_CLASS) return;
    this.used[id] = 0;
    this.idle.add(id);
  }

  /** The id and its classes are gone. */
  free(id: number): void {
    if (id < 1 || id > MAX_CLASS) return;
    this.used[id] = 0;
    this.idle.delete(id);
  }

  /** Idle ids: classes on the ifb that no pod uses now. */
  get pooled(): number {
    return this.idle.size;
  }

  /** Forgets the idle ids (their classes went with the ifb's old root). */
  forgetIdle(): void {
    this.idle.clear();
  }

  /** Forgets everything (the ifb's classes are gone, or are about to be adopted anew). */
  clear(): void {
    this.used.fill(0);
    this.idle.clear();
  }
}

/** How a direction reads a pod's state: its shard, class id, namespace class, guarantee and namespace total that way. */
export const SIDE = {
  egress: {
    shard: (s: ShapingState) => s.shard,
    id: (s: ShapingState) => s.classId,
    parent: (s: ShapingState) => s.egressParent,
    guarantee: (s: ShapingState) => s.limits.egressGuarantee ?? 0,
    total: (s: ShapingState) => s.limits.egressTotal,
  },
  ingress: {
    shard: (s: ShapingState) => s.ingressShard,
    id: (s: ShapingState) => s.ingressClassId ?? 0,
    parent: (s: ShapingState) => s.ingressParent,
    guarantee: (s: ShapingState) => s.limits.ingressGuarantee ?? 0,
    total: (s: ShapingState) => s.limits.ingressTotal,
  },
} as const;

/**
 * A direction's shards (tc.ts): each an ifb (shardIfb, ingressShardIfb) with its own htb tree and
 * class ids. A new pod goes to the shard with the fewest pods (the first of those) and stays there.
 */
export class Shards {
  readonly ifbs: readonly string[];
  private readonly ids: ClassIds[];
  private readonly side: (typeof SIDE)[Direction];

  /** @throws ConfigError for a count outside 1..MAX_SHARDS (ingress: MAX_INGRESS_SHARDS) or a last shard's name over 15 bytes. */
  constructor(
    ifbName: string,
    count: number,
    readonly dir: Direction = 'egress',
  ) {
    const max = dir === 'egress' ? MAX_SHARDS : MAX_INGRESS_SHARDS;
    if (!Number.isInteger(count) || count < 1 || count > max)
      throw new ConfigError(`${dir} shards must be an integer 1..${max}, got ${count}`);
    this.ifbs = Array.from({ length: count }, (_, k) => (dir === 'egress' ? shardIfb(ifbName, k) : ingressShardIfb(ifbName, k)));
    checkIfName(this.ifbs[count - 1], `ifbName with ${count} ${dir} shards (the last shard's ifb)`);
    this.ids = this.ifbs.map((ifb) => new ClassIds(ifb));
    this.side = SIDE[dir];
  }

  /** The ifb of a state's shard (shard 0 for states without one). */
  ifbOf(s: ShapingState): string {
    return this.ifbs[this.side.shard(s) ?? 0] ?? this.ifbs[0] ?? '';
  }

  /** A shard's class ids; undefined for a shard that is not (an earlier configuration had more). */
  classIds(shard: number | undefined): ClassIds | undefined {
    return this.ids[shard ?? 0];
  }

  /** A shard's class ids. @throws KubenetError for a shard that is not. */
  mustClassIds(shard: number | undefined): ClassIds {
    const ids = this.classIds(shard);
    if (!ids) throw new KubenetError(`shaper: no ${this.dir} shard ${shard}`);
    return ids;
  }

  /** The shard for a new pod: the one with the fewest of `states` on it, the first of those. */
  emptiest(states: Iterable<ShapingState>): number {
    const n = this.ifbs.map(() => 0);
    for (const r of states) if (this.side.id(r)) n[this.side.shard(r) ?? 0] = (n[this.side.shard(r) ?? 0] ?? 0) + 1;
    return n.indexOf(Math.min(...n));
  }

  /**
   * The pods to move off shards that hold more than an even part of `states` (ceil of pods /
   * shards): after an upgrade from fewer shards (one tree: every pod on shard 0), so that the pods
   * already running spread as new ones do. The ones a shard keeps are its first.
   */
  crowded(states: Iterable<ShapingState>): string[] {
    const by = this.ifbs.map(() => [] as string[]);
    for (const r of states) if (this.side.id(r)) by[this.side.shard(r) ?? 0]?.push(r.id);
    const even = Math.ceil(by.reduce((n, ids) => n + ids.length, 0) / this.ifbs.length);
    return by.flatMap((ids) => ids.slice(even));
  }

  /** By shard: its pods in the tree, their veths, bands and guarantees (shares.ts). */
  loads(states: Iterable<ShapingState>): Array<{ veths: ShardPod[] }> {
    const out = this.ifbs.map(() => ({ veths: [] as ShardPod[] }));
    for (const r of states) {
      const o = this.side.id(r) ? out[this.side.shard(r) ?? 0] : undefined;
      if (o && r.hostVeth && !bypasses(r, this.dir))
        o.veths.push({ veth: r.hostVeth, band: r.limits.priority ?? DEFAULT_BAND, guarantee: this.side.guarantee(r) });
    }
    return out;
  }

  /** Idle classes on every shard. */
  get pooled(): number {
    return this.ids.reduce((n, c) => n + c.pooled, 0);
  }

  clear(): void {
    for (const c of this.ids) c.clear();
  }
}

export interface EnsurePlan {
  /** Deletes of what the pod no longer has, run first; absent objects are fine. */
  pre: string[];
  /** The pod's objects as they must be; the 1-based line numbers in `optional` may fail (tc -batch). */
  lines: string[];
  optional: Set<number>;
}

/**
 * The lines that take the pod from `prev` (what was installed, if anything) to `next` (its limits,
 * ips and class id decided; `next.filters` is filled in here). `prevVethExists`: whether the old
 * veth is still there when the pod moved to another one (its qdiscs are then cleared). A `next`
 * without a veth (hostVeth '') gets its ifb side only; the next plan, with the veth, then adds only
 * the veth's lines when the ifb side is what it needs.
 */
export function planEnsure(
  ifb: string,
  prev: ShapingState | undefined,
  next: ShapingState,
  prevVethExists: boolean,
  trees: Trees = {},
): EnsurePlan {
  const tree = trees.egress;
  const inTree = trees.ingress;
  const veth = next.hostVeth;
  const limits = next.limits;
  const pre: string[] = [];
  const lines: string[] = [];
  const optional = new Set<number>();
  // A different veth than before (sandbox recreated under the same id): clear the old one.
  if (prev && prev.hostVeth !== veth && prevVethExists) {
    if (prev.ingressInstalled) pre.push(`qdisc del dev ${prev.hostVeth} root`);
    if (prev.egressInstalled) pre.push(`qdisc del dev ${prev.hostVeth} ingress`);
  }
  const sameVeth = prev?.hostVeth === veth;
  // A bulk leaf whose bucket shrinks is made anew, not changed in place: tbf keeps the packets it
  // queued under the old, larger bucket (GSO super-packets it did not segment), and one larger
  // than the new bucket can never be sent: the pod's traffic that way stopped for good (a 200M ->
  // 100M re-shape under an iperf3 flow). Deleting the leaf drops its queue once (at most 25 ms of
  // the old rate; TCP recovers); the replace line below makes the new one.
  const prevInTree = !!prev?.ingressClassId && prev.ingressInstalled;
  const nextInTree = inTree !== undefined && !!next.ingressClassId && next.ingressInstalled;
  const vethIngress = (l: BandwidthLimits) => (l.ingress === undefined ? undefined : podLayout(l.ingress, l.ingressBurst));
  if (sameVeth && prev.ingressInstalled && !prevInTree && !nextInTree && leafShrinks(vethIngress(prev.limits), vethIngress(limits)))
    pre.push(`qdisc del dev ${veth} parent ${VETH.bulk}`);
  if (
    prevInTree &&
    nextInTree &&
    prev.ingressClassId === next.ingressClassId &&
    leafShrinks(ingressTreeLayout(prev.limits, inTree.tree), ingressTreeLayout(limits, inTree.tree))
  ) {
    pre.push(`qdisc del dev ${inTree.ifb} parent 1:${hex(ifbClassIds(next.ingressClassId ?? 0).bulk)}`);
  }
  if (
    prev?.egressInstalled &&
    next.egressInstalled &&
    prev.classId === next.classId &&
    leafShrinks(egressLayout(prev.limits, tree), egressLayout(limits, tree))
  ) {
    pre.push(`qdisc del dev ${ifb} parent 1:${hex(ifbClassIds(next.classId).bulk)}`);
  }
  // TO the pod: into the ingress tree, or htb with two leaves on the host veth ('': no veth yet,
  // the ifb side only). A root of the other layout goes first (htb cannot change in place).
  if (veth === '') {
    // nothing on a veth
  } else if (nextInTree && bypasses(next, 'ingress')) {
    // Kept out of the tree (steering.ts): no root on the veth, as on a node without the plugin's shaping.
    if (sameVeth && prev.ingressInstalled && !(prevInTree && bypasses(prev, 'ingress'))) pre.push(`qdisc del dev ${veth} root`);
  } else if (nextInTree) {
    if (sameVeth && prev.ingressInstalled && !prevInTree) pre.push(`qdisc del dev ${veth} root`);
    optional.add(lines.length + 1);
    lines.push(...vethToIfbLines(veth, inTree.ifb));
  } else if (limits.ingress !== undefined) {
    if (sameVeth && prevInTree) pre.push(`qdisc del dev ${veth} root`);
    optional.add(lines.length + 1);
    lines.push(...vethLines(veth, podLayout(limits.ingress, limits.ingressBurst)));
  } else if (sameVeth && prev?.ingressInstalled && !(prevInTree && bypasses(prev, 'ingress'))) {
    lines.push(`qdisc del dev ${veth} root`);
  }
  // The ingress tree's side: the pod's class, leaves and destination filters on the ingress ifb.
  if (nextInTree) {
    next.ingressFilters = filtersFor(inTree.ifb, next.ips, next.ingressClassId ?? 0, 'ingress').map(refOf);
    const keep = new Set(next.ingressFilters.map((f) => `${f.prio}/${f.handle}`));
    const reparent = prevInTree && prev.ingressClassId === next.ingressClassId && (prev.ingressParent ?? 0) !== (next.ingressParent ?? 0);
    for (const f of prevInTree ? (prev.ingressFilters ?? []) : [])
      if (reparent || !keep.has(`${f.prio}/${f.handle}`)) pre.push(filterDelLine(inTree.ifb, f));
    if (reparent) pre.push(...classDelLines(inTree.ifb, next.ingressClassId ?? 0));
    lines.push(...ifbLines(inTree.ifb, next, inTree.tree, 'ingress'));
  } else if (prevInTree && inTree) {
    for (const f of prev.ingressFilters ?? []) pre.push(filterDelLine(inTree.ifb, f));
    pre.push(
      ...(prev.ingressParent ? classDelLines(inTree.ifb, prev.ingressClassId ?? 0) : idleLines(inTree.ifb, prev.ingressClassId ?? 0)),
    );
  }
  // FROM the pod: redirect to the shared ifb, class + filters there.
  if (next.egressInstalled) {
    next.filters = filtersFor(ifb, next.ips, next.classId).map(refOf);
    const keep = new Set(next.filters.map((f) => `${f.prio}/${f.handle}`));
    // A new parent (its namespace's class came or went): htb cannot move a class, so it is made anew.
    const reparent =
      prev?.egressInstalled === true && prev.classId === next.classId && (prev.egressParent ?? 0) !== (next.egressParent ?? 0);
    for (const f of prev?.filters ?? []) if (reparent || !keep.has(`${f.prio}/${f.handle}`)) pre.push(filterDelLine(ifb, f));
    if (reparent) pre.push(...classDelLines(ifb, next.classId));
    // The ifb side made moments ago for this very veth-less state (hostVeth ''): only the veth's part is left.
    const ifbReady =
      !reparent &&
      prev?.hostVeth === '' &&
      prev.egressInstalled &&
      prev.classId === next.classId &&
      JSON.stringify(egressLayout(prev.limits, tree)) === JSON.stringify(egressLayout(limits, tree)) &&
      prev.ips.join() === next.ips.join();
    if (!ifbReady) lines.push(...ifbLines(ifb, next, tree));
    if (veth !== '') {
      if (!bypasses(next, 'egress')) lines.push(...redirectLines(veth, ifb));
      // Kept out of the egress tree (steering.ts): the veth's redirect goes, its ifb side stays.
      else if (sameVeth && prev?.egressInstalled && !bypasses(prev, 'egress')) pre.push(`qdisc del dev ${veth} ingress`);
    }
  } else if (prev?.egressInstalled) {
    if (sameVeth && !bypasses(prev, 'egress')) pre.push(`qdisc del dev ${veth} ingress`);
    for (const f of prev.filters) pre.push(filterDelLine(ifb, f));
    pre.push(...(prev.egressParent ? classDelLines(ifb, prev.classId) : idleLines(ifb, prev.classId)));
  }
  return { pre, lines, optional };
}

/** Whether a state keeps its pod out of the tree that way (ShapingState.bypass). */
export function bypasses(s: Pick<ShapingState, 'bypass'>, dir: 'ingress' | 'egress'): boolean {
  return s.bypass?.includes(dir) === true;
}

/** Whether a direction's bulk leaf bucket gets smaller from `before` to `after` (both shaped that way). */
function leafShrinks(before: PodLayout | undefined, after: PodLayout | undefined): boolean {
  return before !== undefined && after !== undefined && after.bulk.leaf.burst < before.bulk.leaf.burst;
}

/**
 * Deletes of a pod's side on the ifbs named in `on`: its filters, then its leaves (its classes go
 * idle, for the next pod: ClassIds) or, under a namespace's class, its classes. A removal names both
 * ifbs; a failed ensure only those where it took a new class id.
 */
export function ifbSideDelLines(rec: ShapingState, on: { egress?: string; ingress?: string }): string[] {
  const lines: string[] = [];
  if (on.egress && rec.classId) {
    lines.push(...rec.filters.map((f) => filterDelLine(on.egress ?? '', f)));
    lines.push(...(rec.egressParent ? classDelLines(on.egress, rec.classId) : idleLines(on.egress, rec.classId)));
  }
  if (on.ingress && rec.ingressClassId) {
    lines.push(...(rec.ingressFilters ?? []).map((f) => filterDelLine(on.ingress ?? '', f)));
    lines.push(...(rec.ingressParent ? classDelLines(on.ingress, rec.ingressClassId) : idleLines(on.ingress, rec.ingressClassId)));
  }
  return lines;
}

/** Deletes of the ifb's pod filters and classes that none of `owners` claims (init's one listing). */
export function orphanLines(ifb: string, listing: IfbListing, owners: ShapingState[]): string[] {
  const ownedClasses = new Set<number>();
  const ownedFilters = new Set<string>();
  for (const r of owners) {
    if (r.classId) for (const c of Object.values(ifbClassIds(r.classId))) ownedClasses.add(c);
    if (r.egressParent) ownedClasses.add(r.egressParent);
    for (const f of r.filters) ownedFilters.add(`${f.prio}/${f.handle}`);
  }
  const lines: string[] = [];
  for (const f of listing.podFilters) {
    if (!ownedFilters.has(`${f.prio}/${f.handle}`)) lines.push(filterDelLine(ifb, f));
  }
  // Leaves before their parents, namespace classes last: htb refuses to delete a class that has children.
  const orphans = [...listing.classes]
    .filter((c) => !ownedClasses.has(c) && !TREE_CLASSES.has(c))
    .sort((a, b) => Number(isGroupClass(a)) - Number(isGroupClass(b)) || b - a);
  for (const c of orphans) lines.push(`class del dev ${ifb} classid 1:${hex(c)}`);
  return lines;
}
