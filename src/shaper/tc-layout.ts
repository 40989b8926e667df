/**
 * The shaper's objects in the kernel and the tc lines that make and remove them: pure, no kernel
 * access (tc.ts runs the lines; tc-plan.ts decides which). Exact-output tests:
 * test/shaper/tc-layout.test.ts.
 *
 * Layout (per node):
 *   TO the pod   (ingress annotation): htb 2: as the root qdisc of the pod's host veth (one pod per
 *                device: no per-pod hash), `default 3`:
 *                  class 2:1 rate = ceil = limit
 *                    class 2:2 interactive (prio 0), leaf bfifo 22:
 *                    class 2:3 bulk (prio 1), leaf tbf 23: (segments GSO, bounds the queue)
 *                filters on 2: (u32): prio 1 IPv4 and prio 2 IPv6 interactive selectors, prio 3
 *                ARP (all of it), each -> 2:2; anything else -> 2:3 by `default`. Every ensure
 *                flushes and re-adds them (handle-less: nothing is ever deleted one by one), so the
 *                lines stay idempotent. Handle 2:, not the tbf 1: of earlier versions: a replace at
 *                another handle grafts the new root over the old one, where the same handle with
 *                another kind is refused.
 *   FROM the pod (egress annotation):  ingress qdisc on the host veth, one u32 match-all filter with
 *                `mirred egress redirect` to the ifb of the pod's egress shard (shardIfb: `kubenet-ifb0`,
 *                `kubenet-ifb0.1`, ...; tc.ts picks the shard). Each shard's ifb has this structure
 *                and its own class ids. The ifb root is
 *                htb 1: (`default 0`: unclassified frames such as ARP pass unshaped); each pod owns
 *                class 1:<id> (rate = ceil = limit) with two leaf classes, 1:<id+0x800>
 *                interactive (prio 0, bfifo <0x2000+id>:) and 1:<id+0x1000> bulk (prio 1, tbf
 *                <0x1000+id>:). Classification is by source address with u32 hash tables keyed on
 *                the last address byte (256 buckets), one node per pod address in each of two
 *                tables per family: 12: (IPv4, prio 8) and 13: (IPv6, prio 9) are reached only
 *                through shared link filters that carry the interactive selectors, and send to the
 *                pod's interactive leaf; 10: (IPv4, prio 10) and 11: (IPv6, prio 11) are reached
 *                by every packet and send to its bulk leaf. The selectors are thus shared (made
 *                once with the ifb), and a pod costs two /32 or /128 nodes per address with the
 *                explicit handle <table>:<last byte>:<node>. Removal deletes by those handles:
 *                nothing is listed per pod.
 *   The node's tree (a capacity is known: sizing.ts TreeParams): one shard, whose htb root has
 *                `default fffd`; class 1:fffe is the node (rate = ceil = the capacity), 1:fffd its
 *                default class (unclassified frames), and every pod class is a child of 1:fffe
 *                instead of the root (or of its namespace's class 1:<0x2000+n>, when the namespace
 *                has a total that way: groups.ts). The root's default cannot change, so a shard
 *                switches between the flat layout and the tree by being rebuilt (tc.ts init).
 *   The ingress tree (an ingress capacity): the veth's root is htb 2: without classes whose one
 *                filter redirects everything to `<ifb>.in`, which holds the same tree and tables,
 *                keyed on the destination address (vethToIfbLines, V4_IN, V6_IN).
 *
 */
import { ConfigError } from '../errors.js';
import { ipFamily, lastByte } from '../net/ip.js';
import type { BandwidthLimits } from '../bandwidth/limits.js';
import {
  groupClass,
  podLayout,
  SMALL_PACKET_BYTES,
  treeClasses,
  treePodLayout,
  type HtbClass,
  type PodLayout,
  type TreeParams,
} from './sizing.js';

export const DEFAULT_IFB = 'kubenet-ifb0';

export {
  AUTO_SHARDS_PER_CPU,
  ingressIfb,
  ingressShardIfb,
  ingressShardOf,
  MAX_INGRESS_SHARDS,
  MAX_SHARDS,
  shardIfb,
  shardOf,
  shardsFor,
} from './shard-names.js';

/** Class ids 1..MAX_CLASS (u32 node ids are 12 bits: node = class id + 0x800 * slot, two addresses per family). */
export const MAX_CLASS = 0x7ff;
/** On the ifb, a pod's leaves are 1:<id + offset>, their qdiscs <base + id>:. */
export const INTERACTIVE_CLASS_OFFSET = 0x800;
export const BULK_CLASS_OFFSET = 0x1000;
const BULK_LEAF_MAJOR_BASE = 0x1000;
const INTERACTIVE_LEAF_MAJOR_BASE = 0x2000;
/** Mask of the length bits that make a packet not small (512 -> 0xfe00). */
const NOT_SMALL_MASK = `0x${(0xffff & ~(SMALL_PACKET_BYTES - 1)).toString(16)}`;

interface Family {
  proto: 'ip' | 'ipv6';
  match: 'ip src' | 'ip6 src' | 'ip dst' | 'ip6 dst';
  plen: number;
  /** Offset of the 32-bit word whose last byte (the address's last byte) is the hash key. */
  hashAt: number;
  /** Every packet of the family: node per pod address -> its bulk leaf. */
  bulk: { prio: number; table: string };
  /** Reached through the shared links carrying `selectors`: node per pod address -> its interactive leaf. */
  interactive: { prio: number; table: string };
  /** u32 selectors of interactive packets, OR'd (one filter each): small, ICMP, DNS answers. */
  selectors: string[];
}
const V4: Family = {
  proto: 'ip',
  match: 'ip src',
  plen: 32,
  hashAt: 12,
  bulk: { prio: 10, table: '10' },
  interactive: { prio: 8, table: '12' },
  selectors: [`match u16 0 ${NOT_SMALL_MASK} at 2`, 'match ip protocol 1 0xff', 'match ip protocol 17 0xff match ip sport 53 0xffff'],
};
const V6: Family = {
  proto: 'ipv6',
  match: 'ip6 src',
  plen: 128,
  hashAt: 20,
  bulk: { prio: 11, table: '11' },
  interactive: { prio: 9, table: '13' },
  selectors: [`match u16 0 ${NOT_SMALL_MASK} at 4`, 'match ip6 protocol 58 0xff', 'match ip6 protocol 17 0xff match ip6 sport 53 0xffff'],
};
/**
 * The ingress tree's families (traffic TO the pods, on the ingress ifb): the same tables and
 * selectors, classified by destination (the address's last byte: IPv4 bytes 16..19, IPv6 36..39).
 */
const V4_IN: Family = { ...V4, match: 'ip dst', hashAt: 16 };
const V6_IN: Family = { ...V6, match: 'ip6 dst', hashAt: 36 };
/** The families of a direction's ifb. */
const familiesOf = (dir: Direction): [Family, Family] => (dir === 'egress' ? [V4, V6] : [V4_IN, V6_IN]);
export type Direction = 'ingress' | 'egress';

export const TABLES = ['10', '11', '12', '13'];
/** The node class and its default class in the tree (above every pod's ids). */
export const NODE_CLASS = 0xfffe;
export const DEFAULT_CLASS = 0xfffd;
/** The classes of the tree itself: never a pod's, never an orphan. */
export const TREE_CLASSES: ReadonlySet<number> = new Set([NODE_CLASS, DEFAULT_CLASS]);
/** A namespace's class (tc-plan.ts GroupIds) is 1:<GROUP_CLASS_BASE + n>, n = 1..MAX_GROUPS: above every pod's ids. */
export const GROUP_CLASS_BASE = 0x2000;
export const MAX_GROUPS = 0x7ff;
export const isGroupClass = (c: number): boolean => c > GROUP_CLASS_BASE && c <= GROUP_CLASS_BASE + MAX_GROUPS;
/** The veth-side redirect filter: first (and only) node of the root hash table of its u32 instance. */
const REDIRECT_HANDLE = '800::800';
/** The veth root (traffic TO the pod): htb 2:, pod class 2:1, interactive 2:2 (leaf 22:), bulk 2:3 (leaf 23:). */
export const VETH = {
  root: '2:',
  pod: '2:1',
  interactive: '2:2',
  bulk: '2:3',
  interactiveLeaf: '22:',
  bulkLeaf: '23:',
  bulkMinor: 3,
} as const;
export const STATE_VERSION = 1;

export interface FilterRef {
  prio: number;
  proto: string;
  /** u32 handle, "10:b:3" */
  handle: string;
}

/** What the shaper installed for one pod: kept by the caller (the pod record) and given back to `init`. */
export interface ShapingState {
  version: number;
  id: string;
  hostVeth: string;
  ips: string[];
  limits: BandwidthLimits;
  /** htb class minor on the pod's egress shard's ifb, 0 when egress is not shaped. */
  classId: number;
  /** The ingress tree (a capacity that way): the pod's class minor on the ingress ifb, its filters and counter base. */
  ingressClassId?: number;
  ingressFilters?: FilterRef[];
  ingressBase?: CounterBase;
  /**
   * In a tree, a direction whose namespace has a total: the class id of the namespace's class, the
   * parent of the pod's class (else the node class). `group` names the namespace.
   */
  group?: string;
  egressParent?: number;
  ingressParent?: number;
  /** The egress shard (its ifb: shardIfb); absent in states of versions without shards: shard 0. */
  shard?: number;
  /** The ingress shard, with an ingress class (its ifb: ingressShardIfb); absent: shard 0. */
  ingressShard?: number;
  /**
   * In a tree, the directions in which this best-effort pod (isBestEffort) is kept out of it while
   * the node is far from its capacity that way (steering.ts): its classes and filters on the ifb
   * are there, its veth's redirect is not, so its packets cost what they cost without the plugin.
   * Not kept across a restart: an adopted state is steered in until the next decision.
   */
  bypass?: Direction[];
  /**
   * What the pod's veth carried out of the tree that way (its class did not count it), for its
   * figures: the bytes and packets of earlier spells outside, and where the veth's own counter
   * stood when the spell now under way began (counters.ts withOutside).
   */
  outside?: Partial<Record<Direction, OutsideCount>>;
  ingressInstalled: boolean;
  egressInstalled: boolean;
  filters: FilterRef[];
  /**
   * The ifb classes' counters when this pod took them from the pool of idle classes (tc-plan.ts
   * ClassIds): htb counts on across pods, so the pod's own figures are the kernel's minus these.
   * Absent for classes made for the pod.
   */
  egressBase?: CounterBase;
}

/** A pod's traffic outside a tree (ShapingState.outside). */
export interface OutsideCount {
  carried: { bytes: number; packets: number };
  /** The veth's counter that way when the spell outside began; absent while the pod is in the tree. */
  from?: { bytes: number; packets: number };
}

/** What a pod's direction had counted before it was the pod's (ShapingState.egressBase). */
export interface CounterBase {
  bytes: number;
  packets: number;
  drops: number;
  overlimits: number;
}

export const hex = (n: number) => n.toString(16);

/** The bulk leaf: a tbf that segments GSO and bounds the queue (sizing.ts leafParams). */
function tbfArgs(l: PodLayout): string {
  return `tbf rate ${l.bulk.leaf.rate}bit burst ${l.bulk.leaf.burst}b limit ${l.bulk.leaf.limit}b`;
}

/** tc's htb class parameters. */
function htbArgs(c: HtbClass): string {
  return `htb rate ${c.rate}bit ceil ${c.ceil}bit burst ${c.burst}b cburst ${c.cburst}b quantum ${c.quantum} prio ${c.prio}`;
}

/** The pod's classes on the ifb: its own, then its leaves (deleted in the reverse order). */
export function ifbClassIds(classId: number): { pod: number; interactive: number; bulk: number } {
  return { pod: classId, interactive: classId + INTERACTIVE_CLASS_OFFSET, bulk: classId + BULK_CLASS_OFFSET };
}

/**
 * `ip` lines that make the shards' ifbs as the shaper needs them: each there, up, with a queue
 * (txqueuelen 1000: a zero would make htb keep two packets in its direct queue). `links`: the
 * host's links by name now.
 */
export function ifbLinkLines(ifbs: readonly string[], links: ReadonlyMap<string, { txQLen: number }>): string[] {
  return ifbs.flatMap((ifb) => {
    const link = links.get(ifb);
    return [
      ...(link ? [] : [`link add name ${ifb} type ifb`]),
      ...(link?.txQLen ? [] : [`link set dev ${ifb} txqueuelen 1000`]),
      `link set dev ${ifb} up`,
    ];
  });
}

/** The ifb's shared structure: the htb root, the node's tree when there is one, the u32 hash tables and the links into them. */
export function structureLines(ifb: string, tree?: TreeParams, dir: Direction = 'egress'): string[] {
  const lines = [
    `qdisc replace dev ${ifb} root handle 1: htb default ${tree ? hex(DEFAULT_CLASS) : 0} direct_qlen 1000`,
    ...(tree ? treeLines(ifb, tree) : []),
  ];
  const hash = (f: Family) => `hashkey mask 0x000000ff at ${f.hashAt}`;
  const families = familiesOf(dir);
  for (const f of families) {
    const t = f.interactive;
    lines.push(`filter add dev ${ifb} parent 1: prio ${t.prio} handle ${t.table}: protocol ${f.proto} u32 divisor 256`);
    for (const sel of f.selectors)
      lines.push(`filter add dev ${ifb} parent 1: prio ${t.prio} protocol ${f.proto} u32 ${sel} ${hash(f)} link ${t.table}:`);
  }
  for (const f of families) {
    const t = f.bulk;
    lines.push(`filter add dev ${ifb} parent 1: prio ${t.prio} handle ${t.table}: protocol ${f.proto} u32 divisor 256`);
    lines.push(`filter add dev ${ifb} parent 1: prio ${t.prio} protocol ${f.proto} u32 match u32 0 0 at 0 ${hash(f)} link ${t.table}:`);
  }
  return lines;
}

/** Per pod address: a node in the family's interactive table and one in its bulk table. */
export function filtersFor(
  ifb: string,
  ips: string[],
  classId: number,
  dir: Direction = 'egress',
): Array<FilterRef & { ip: string; line: string }> {
  const [v4, v6] = familiesOf(dir);
  const slots = { 4: 0, 6: 0 };
  const ids = ifbClassIds(classId);
  const out: Array<FilterRef & { ip: string; line: string }> = [];
  for (const ip of ips) {
    const fam = ipFamily(ip);
    const f = fam === 4 ? v4 : v6;
    const slot = slots[fam]++;
    if (slot > 1) throw new ConfigError(`pod has more than two IPv${fam} addresses; the shaper classifies at most two per family`);
    const node = `${hex(lastByte(ip))}:${hex(classId + slot * 0x800)}`;
    for (const [t, leaf] of [
      [f.interactive, ids.interactive],
      [f.bulk, ids.bulk],
    ] as const) {
      const handle = `${t.table}:${node}`;
      const bucket = handle.slice(0, handle.lastIndexOf(':') + 1);
      out.push({
        prio: t.prio,
        proto: f.proto,
        handle,
        ip,
        line: `filter replace dev ${ifb} parent 1: prio ${t.prio} handle ${handle} protocol ${f.proto} u32 ht ${bucket} match ${f.match} ${ip}/${f.plen} flowid 1:${hex(leaf)}`,
      });
    }
  }
  return out;
}

/**
 * A pod's ifb classes back to the pool: its two leaf qdiscs deleted (their queues dropped; htb gives
 * each class a default pfifo until the next pod replaces it), the classes kept for the next pod. No
 * traffic reaches them once the pod's filters are gone.
 */
export function idleLines(ifb: string, classId: number): string[] {
  const ids = ifbClassIds(classId);
  return [ids.interactive, ids.bulk].map((c) => `qdisc del dev ${ifb} parent 1:${hex(c)}`);
}

/**
 * A pod's classes deleted, leaves first (with their qdiscs), for a pod whose parent changes (htb
 * cannot move a class) or that leaves a namespace's class (whose classes are not pooled: the
 * namespace's class goes when its last pod does). Its filters must be gone first: htb refuses to
 * delete a class filters point at.
 */
export function classDelLines(ifb: string, classId: number): string[] {
  const ids = ifbClassIds(classId);
  return [ids.bulk, ids.interactive, ids.pod].map((c) => `class del dev ${ifb} classid 1:${hex(c)}`);
}

/** A namespace's class under the node class: guaranteed what its pods are, ceil its total. */
export function groupLine(ifb: string, groupId: number, guaranteed: number, total: number, tree: TreeParams): string {
  return `class replace dev ${ifb} parent 1:${hex(NODE_CLASS)} classid 1:${hex(groupId)} ${htbArgs(groupClass(guaranteed, total, tree))}`;
}

/** Deletes one pod filter node by its handle. */
export function filterDelLine(ifb: string, f: FilterRef): string {
  return `filter del dev ${ifb} parent 1: prio ${f.prio} handle ${f.handle} protocol ${f.proto} u32`;
}

/**
 * A pod's egress classes and queues: at its limit alone (flat), or in the node's tree (its ceiling,
 * guarantee and band). Undefined when there is nothing to shape that way.
 */
export function egressLayout(limits: BandwidthLimits, tree?: TreeParams): PodLayout | undefined {
  if (tree)
    return treePodLayout(
      { ceil: limits.egress, burst: limits.egressBurst, guarantee: limits.egressGuarantee, band: limits.priority },
      tree,
    );
  return limits.egress === undefined ? undefined : podLayout(limits.egress, limits.egressBurst);
}

/** A pod's classes and queues in the ingress tree. */
export function ingressTreeLayout(limits: BandwidthLimits, tree: TreeParams): PodLayout {
  return treePodLayout(
    { ceil: limits.ingress, burst: limits.ingressBurst, guarantee: limits.ingressGuarantee, band: limits.priority },
    tree,
  );
}

/** The node class and its default class, as replace lines (the tree only). */
export function treeLines(ifb: string, tree: TreeParams): string[] {
  const c = treeClasses(tree);
  return [
    `class replace dev ${ifb} parent 1: classid 1:${hex(NODE_CLASS)} ${htbArgs(c.node)}`,
    `class replace dev ${ifb} parent 1:${hex(NODE_CLASS)} classid 1:${hex(DEFAULT_CLASS)} ${htbArgs(c.fallback)}`,
  ];
}

/** The ifb side of a pod (class, leaves, their qdiscs, filters), as replace lines. */
export function ifbLines(ifb: string, rec: ShapingState, tree?: TreeParams, dir: Direction = 'egress'): string[] {
  const classId = dir === 'egress' ? rec.classId : (rec.ingressClassId ?? 0);
  const l = !classId
    ? undefined
    : dir === 'egress'
      ? egressLayout(rec.limits, tree)
      : tree
        ? ingressTreeLayout(rec.limits, tree)
        : undefined;
  if (!l) return [];
  const ids = ifbClassIds(classId);
  const [pod, int, bulk] = [ids.pod, ids.interactive, ids.bulk].map(hex) as [string, string, string];
  const parent = (dir === 'egress' ? rec.egressParent : rec.ingressParent) ?? (tree ? NODE_CLASS : undefined);
  return [
    `class replace dev ${ifb} parent 1:${parent === undefined ? '' : hex(parent)} classid 1:${pod} ${htbArgs(l.pod)}`,
    `class replace dev ${ifb} parent 1:${pod} classid 1:${int} ${htbArgs(l.interactive)}`,
    `class replace dev ${ifb} parent 1:${pod} classid 1:${bulk} ${htbArgs(l.bulk)}`,
    `qdisc replace dev ${ifb} parent 1:${int} handle ${hex(INTERACTIVE_LEAF_MAJOR_BASE + classId)}: bfifo limit ${l.interactive.queue}`,
    `qdisc replace dev ${ifb} parent 1:${bulk} handle ${hex(BULK_LEAF_MAJOR_BASE + classId)}: ${tbfArgs(l)}`,
    ...filtersFor(ifb, rec.ips, classId, dir).map((f) => f.line),
  ];
}

/**
 * The bulk leaves of a pod's shaped directions as today's sizing makes them. `replace` changes a
 * tbf in place, keeping what it queued: right while the bucket only grows between versions (1 ms
 * to 3 ms of the rate in issue 32); a shrinking one must be made anew (tc-plan.ts planEnsure).
 */
export function bulkLeafLines(
  ifb: string,
  rec: ShapingState,
  tree?: TreeParams,
  ingressTree?: { ifb: string; tree: TreeParams },
): string[] {
  const { ingress, ingressBurst } = rec.limits;
  const e = rec.egressInstalled && rec.classId ? egressLayout(rec.limits, tree) : undefined;
  const inId = rec.ingressClassId;
  return [
    ...(rec.ingressInstalled && inId && ingressTree
      ? [
          `qdisc replace dev ${ingressTree.ifb} parent 1:${hex(ifbClassIds(inId).bulk)} handle ${hex(BULK_LEAF_MAJOR_BASE + inId)}: ${tbfArgs(ingressTreeLayout(rec.limits, ingressTree.tree))}`,
        ]
      : []),
    ...(rec.ingressInstalled && !inId && ingress !== undefined
      ? [`qdisc replace dev ${rec.hostVeth} parent ${VETH.bulk} handle ${VETH.bulkLeaf} ${tbfArgs(podLayout(ingress, ingressBurst))}`]
      : []),
    ...(e
      ? [
          `qdisc replace dev ${ifb} parent 1:${hex(ifbClassIds(rec.classId).bulk)} handle ${hex(BULK_LEAF_MAJOR_BASE + rec.classId)}: ${tbfArgs(e)}`,
        ]
      : []),
  ];
}

/**
 * htb's direct queue on the veth, in packets: what the unshaped destinations' traffic (skb priority
 * `2:0`) waits in. Given, because htb otherwise takes the device's txqueuelen, which the bridge
 * plugin sets to 0 on its veths (htb then keeps 2 packets); the leaves have limits of their own.
 */
export const VETH_DIRECT_QLEN = 1000;

/**
 * The veth root for traffic TO the pod (see the module doc). The first line fails, expectedly,
 * when our htb is already there (htb has no change operation); it creates it on a bare veth and
 * grafts it over any other root (an earlier version's tbf 1:). The filter flush makes the filter
 * lines idempotent without handles; on a fresh htb it is a no-op.
 */
export function vethLines(veth: string, l: PodLayout): string[] {
  const lines = [
    `qdisc replace dev ${veth} root handle ${VETH.root} htb default ${VETH.bulkMinor} direct_qlen ${VETH_DIRECT_QLEN}`,
    `class replace dev ${veth} parent ${VETH.root} classid ${VETH.pod} ${htbArgs(l.pod)}`,
    `class replace dev ${veth} parent ${VETH.pod} classid ${VETH.interactive} ${htbArgs(l.interactive)}`,
    `class replace dev ${veth} parent ${VETH.pod} classid ${VETH.bulk} ${htbArgs(l.bulk)}`,
    `qdisc replace dev ${veth} parent ${VETH.interactive} handle ${VETH.interactiveLeaf} bfifo limit ${l.interactive.queue}`,
    `qdisc replace dev ${veth} parent ${VETH.bulk} handle ${VETH.bulkLeaf} ${tbfArgs(l)}`,
    `filter del dev ${veth} parent ${VETH.root}`,
  ];
  [V4, V6].forEach((f, i) => {
    for (const sel of f.selectors)
      lines.push(`filter add dev ${veth} parent ${VETH.root} prio ${i + 1} protocol ${f.proto} u32 ${sel} flowid ${VETH.interactive}`);
  });
  lines.push(`filter add dev ${veth} parent ${VETH.root} prio 3 protocol arp u32 match u32 0 0 flowid ${VETH.interactive}`);
  return lines;
}

/**
 * Traffic TO the pod into the ingress tree: the veth's root is an htb without classes whose one
 * match-all filter redirects every packet to the ingress ifb. A packet whose skb priority is the
 * root's handle (2:0, the unshaped sources: unshaped.ts) leaves through htb's direct queue before
 * any filter, unshaped, as with the flat layout. The first line fails, expectedly, when the root is
 * already ours (htb has no change operation); a flat layout's root (with classes) is deleted first
 * (tc-plan.ts).
 */
export function vethToIfbLines(veth: string, ifb: string): string[] {
  return [
    `qdisc replace dev ${veth} root handle ${VETH.root} htb default 0 direct_qlen ${VETH_DIRECT_QLEN}`,
    `filter replace dev ${veth} parent ${VETH.root} prio 1 handle ${REDIRECT_HANDLE} protocol all u32 match u32 0 0 action mirred egress redirect dev ${ifb}`,
  ];
}

/**
 * The ingress qdisc on the host veth and its one match-all filter redirecting everything the pod
 * sends to the ifb. `ingress`, not `clsact`: one tcf block instead of two, and every block
 * creation walks a kernel list of all blocks on the host (flow_indr_dev_setup_offload).
 */
export function redirectLines(veth: string, ifb: string): string[] {
  return [
    `qdisc replace dev ${veth} ingress`,
    `filter replace dev ${veth} parent ffff: prio 1 handle ${REDIRECT_HANDLE} protocol all u32 match u32 0 0 action mirred egress redirect dev ${ifb}`,
  ];
}
