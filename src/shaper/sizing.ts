/**
 * Buffer sizing for the shaper, pure functions of the rate (bits/s). Rates are enforced at the
 * wire (L2 frame bytes, as tbf and htb count them); TCP goodput is ~95.6% of that at MTU 1500.
 *
 * Each shaped direction of a pod is an htb class at the pod's limit with two leaves (tc.ts):
 * `interactive` (prio 0: ICMP, packets under 512 bytes, DNS answers) and `bulk` (prio 1,
 * everything else). The two leaves are sized for opposite jobs:
 *
 * - pod class: rate = ceil = the limit; burst (what it may send at line rate after idling) small
 *   enough that a new transfer cannot blow through the limit (1.5 ms of the rate, so a 10M pod
 *   bursts 3 kB), at least two full frames so that 1G still keeps up with timer slack.
 * - interactive leaf: an assured 10% of the limit (ceil: the limit). While its small packets stay
 *   within that share the leaf is "green" in htb terms and is dequeued ahead of everything, even
 *   while the pod class is out of tokens: a ping or a probe's SYN waits for no bulk frame, not
 *   even the one being paid for (the class's debt is then repaid by the bulk leaf, so the limit
 *   holds on average). 10% is well above what a pod's interactive traffic needs (a saturating
 *   flow's pure ACKs are ~2.3% of its rate; ping and a 5/s probe ~17 kbit/s), and below it the
 *   bulk leaf keeps 90% assured. Its queue is a bfifo of 8 frames or 5 ms of the rate: it only
 *   fills when the pod floods small packets, which then wait for each other, not for bulk.
 * - bulk leaf: assured the other 90%, ceil the limit, prio 1. Its queue is the reference plugin's
 *   (25 ms of the rate plus the burst), at least 8 frames. With small packets out of it, its depth
 *   no longer costs anyone else latency, and a deep bulk queue is what avoids retransmit storms:
 *   pods here run BBR (the node's default, inherited by every netns), which does not back off on
 *   loss, so a shallow tail-drop queue loses a steady share of what BBR overshoots; the
 *   reference-sized bulk queue matches the reference. The bulk leaf is a tbf that does not shape
 *   (see leafParams). Deeper is not better at low rates: BBR's startup sizes its cwnd from the RTT
 *   it sees, so a deeper queue lets it overshoot further.
 *
 * Why small packets have a leaf of their own: with one queue for everything, a BBR flow sometimes
 * starts with a bandwidth sample taken at veth speed, before the shaping queue built up. While
 * BBR's max filter holds that sample, its cwnd exceeds the queue, which fills to its limit in
 * pulses and tail-drops whatever arrives then: the bulk flow's segments, and a ping's replies or a
 * probe's packets with them. With the interactive leaf a ping, an ARP reply or a probe never enters
 * the bulk queue, full or not.
 *
 * Measured (losses and retransmissions per queue depth, the single queue's ping loss):
 * docs/shaping.md, "Queue sizing", with the command for each figure.
 */
export const FRAME = 1514;

const BURST_SECONDS = 0.0015;
const MIN_BURST = 2 * FRAME;
const MAX_BURST_SECONDS = 0.1;
/** The reference plugin's latency term (its `limit` is rate × 25 ms + burst). */
const BULK_LATENCY_SECONDS = 0.025;
const MIN_BULK_QUEUE = 8 * FRAME;
export const INTERACTIVE_SHARE = 0.1;
const INTERACTIVE_QUEUE_SECONDS = 0.005;
const MIN_INTERACTIVE_QUEUE = 8 * FRAME;
/**
 * The bulk tbf leaf's bucket, which is also its segmentation threshold. TCP sizes its GSO
 * super-packets to ~1 ms of its pacing rate (tcp_tso_autosize, up to 64 kB), and BBR paces at
 * 1.25x the rate it measured while probing: a 1 ms bucket cut a 200M pod's every skb into frames
 * (32 such pods at once: 1.9 cores, per-CPU backlog drops, 10^5 retransmissions); 3 ms holds them.
 */
const LEAF_BUCKET_SECONDS = 0.003;
/** Packets whose IP total length (IPv6: payload length) is below this are interactive. */
export const SMALL_PACKET_BYTES = 512;
/** The largest byte count tc's u32 fields hold (with room for its own rounding). */
const MAX_TC_BYTES = 0xffffffff - 0xffff;

export interface RateParams {
  /** bits/s */
  rate: number;
  /** bytes */
  burst: number;
  /** bytes the bulk leaf may have queued */
  limit: number;
  /** htb quantum, bytes */
  quantum: number;
}

/** One htb class: rates in bits/s, burst/cburst/quantum in bytes, prio 0 (first) .. 7. */
export interface HtbClass {
  rate: number;
  ceil: number;
  burst: number;
  cburst: number;
  quantum: number;
  prio: number;
}

/** Everything tc needs for one shaped direction of a pod. */
export interface PodLayout {
  /** The pod's class: rate = ceil = the limit. */
  pod: HtbClass;
  /** Small packets: bfifo of `queue` bytes. */
  interactive: HtbClass & { queue: number };
  /** Everything else: tbf leaf that segments GSO and bounds the queue. */
  bulk: HtbClass & { leaf: { rate: number; burst: number; limit: number } };
}

/**
 * Burst in bytes for a rate in bits/s. An explicit `burstBits` is honoured between two frames and
 * 100 ms of the rate: runtimes pass huge bursts (containerd sends 2^31-1 bits for any annotated
 * pod), and a burst that size lets a pod send far beyond its limit in its first second.
 */
export function burstBytes(rateBits: number, burstBits?: number): number {
  const bytesPerSec = rateBits / 8;
  const sized =
    burstBits === undefined
      ? Math.max(MIN_BURST, Math.ceil(bytesPerSec * BURST_SECONDS))
      : Math.max(MIN_BURST, Math.min(Math.ceil(burstBits / 8), Math.ceil(bytesPerSec * MAX_BURST_SECONDS)));
  // tc keeps a burst in 32 bits of bytes.
  return Math.min(sized, MAX_TC_BYTES);
}

/** The bulk leaf's queue: the reference plugin's (25 ms of the rate + burst), at least 8 frames. */
export function queueLimitBytes(rateBits: number, burst = burstBytes(rateBits)): number {
  return Math.min(MAX_TC_BYTES, Math.max(MIN_BULK_QUEUE, Math.ceil((rateBits / 8) * BULK_LATENCY_SECONDS) + burst));
}

/** The interactive leaf's queue: 5 ms of the pod's rate, at least 8 frames. */
export function interactiveQueueBytes(rateBits: number): number {
  return Math.min(MAX_TC_BYTES, Math.max(MIN_INTERACTIVE_QUEUE, Math.ceil((rateBits / 8) * INTERACTIVE_QUEUE_SECONDS)));
}

/**
 * HTB quantum, explicit so htb never derives it from r2q (and never warns "quantum of class is
 * big/small"). The two leaves of a pod differ in prio, so the quantum never arbitrates between
 * them; it only has to be at least one frame and within htb's sane range.
 */
export function htbQuantum(rateBits: number): number {
  return Math.min(200_000, Math.max(FRAME, Math.ceil(rateBits / 8 / 1000)));
}

export function rateParams(rateBits: number, burstBits?: number): RateParams {
  const rate = Math.round(rateBits);
  const burst = burstBytes(rate, burstBits);
  return { rate, burst, limit: queueLimitBytes(rate, burst), quantum: htbQuantum(rate) };
}

/**
 * The tbf leaf under the bulk class. It does not shape: htb does. It exists to segment GSO
 * super-packets into frames at enqueue and to bound the queue in bytes: a plain bfifo either drops
 * 64 kB GSO skbs (the class then falls well short of its rate) or, sized for them, holds far more
 * delay than the bulk queue should; leaving larger skbs unsegmented adds queueing delay at low
 * rates, while segmenting everything costs CPU (a share of the rate) at high rates, and segmenting
 * TCP's usual skbs costs a packet's work per frame (measured: docs/shaping.md, "Queue sizing").
 * So the bucket, which is also the segmentation threshold, is 3 ms of the rate but at least two
 * frames: larger than what TCP sends at that rate, small against the bulk queue. Its rate (1000×
 * the class, at least 100 Gbit/s) refills the bucket faster than htb can dequeue back to back, so
 * it never throttles and htb never logs "non-work-conserving" for it.
 */
export function leafParams(p: RateParams): { rate: number; burst: number; limit: number } {
  return {
    rate: Math.min(1e18, Math.max(p.rate * 1000, 100e9)),
    burst: Math.min(MAX_TC_BYTES, Math.max(2 * FRAME, Math.ceil((p.rate / 8) * LEAF_BUCKET_SECONDS))),
    limit: p.limit,
  };
}

/**
 * The node's tree (a capacity is known, src/bandwidth/capacity.ts): every pod class is a child of
 * one node class at the capacity, and a pod's class has its guarantee as its rate (what htb serves
 * it before anyone borrows) and its ceiling (the capacity when it has none) as its ceil. What is
 * left after the guarantees goes to the leaves in the order of their prio: a pod's band b gives its
 * interactive leaf prio 2b and its bulk leaf 2b+1, so every leaf of band 0 borrows before any of
 * band 1, and within a band the pods share equally (one quantum for every leaf of the tree: htb's
 * round robin between leaves of one prio is by quantum).
 *
 * A pod without a guarantee keeps a small assured rate for its interactive leaf (a tenth of its
 * ceiling, at most INTERACTIVE_FLOOR), so its ping, probes and ACKs stay ahead of bulk borrowing;
 * that is outside the guarantees the scheduler counts, at most 1 Mbit/s a pod.
 */
export interface TreeParams {
  /** The node's capacity that way, bits/s: the node class's rate and ceil, every pod's ceiling at most. */
  capacity: number;
  /** On one of several egress shards (shares.ts): the node class's rate and ceil, this shard's part of the capacity. */
  share?: number;
}

/** A pod's ask in the tree: ceiling and burst (its annotation), guarantee (its requests), band (0..2). */
export interface TreeAsk {
  ceil?: number;
  burst?: number;
  guarantee?: number;
  band?: number;
}

/** The most a pod without a guarantee has assured for its interactive leaf, bits/s. */
export const INTERACTIVE_FLOOR = 1_000_000;
/** The least rate htb is given for a class that has no guarantee, bits/s (the smallest bandwidth quantity). */
export const MIN_TREE_RATE = 1_000;
/** The band of a pod whose band is not known (guarantees.ts DEFAULT_BAND). */
const DEFAULT_TREE_BAND = 1;

/** One quantum for every leaf of the tree: 100 µs of the capacity, within htb's sane range. */
export function treeQuantum(capacity: number): number {
  return Math.min(200_000, Math.max(FRAME, Math.ceil(capacity / 8 / 10_000)));
}

/**
 * The node class (rate = ceil = the capacity, or the shard's share of it) and the default class
 * (unclassified frames: rate MIN_TREE_RATE, ceil the capacity, last band; its ceil is what a restart
 * reads back as the capacity the tree was made for).
 */
export function treeClasses(t: TreeParams): { node: HtbClass; fallback: HtbClass } {
  const burst = burstBytes(t.capacity);
  const quantum = treeQuantum(t.capacity);
  const node = t.share ?? t.capacity;
  return {
    node: { rate: node, ceil: node, burst, cburst: burst, quantum, prio: 0 },
    fallback: { rate: MIN_TREE_RATE, ceil: t.capacity, burst: MIN_BURST, cburst: burst, quantum, prio: 5 },
  };
}

/**
 * A namespace's class in the tree (a group between the node class and its pods' classes): its
 * ceil is the namespace's total, its rate what its pods are guaranteed together (at most the
 * total), so guarantees inside it hold and the rest of it is borrowed from the node like any pod's.
 */
export function groupClass(guaranteed: number, total: number, t: TreeParams): HtbClass {
  const ceil = Math.min(total, t.capacity);
  const rate = Math.max(MIN_TREE_RATE, Math.min(guaranteed, ceil));
  return { rate, ceil, burst: burstBytes(rate), cburst: burstBytes(ceil), quantum: treeQuantum(t.capacity), prio: 0 };
}

/** A pod's classes and queues in the node's tree (see TreeParams). */
export function treePodLayout(ask: TreeAsk, t: TreeParams): PodLayout {
  const ceil = Math.min(ask.ceil ?? t.capacity, t.capacity);
  const g = Math.min(ask.guarantee ?? 0, ceil);
  const band = ask.band ?? DEFAULT_TREE_BAND;
  const p = rateParams(ceil, ask.burst);
  const quantum = treeQuantum(t.capacity);
  const iRate = Math.max(
    MIN_TREE_RATE,
    Math.round(g * INTERACTIVE_SHARE),
    Math.min(INTERACTIVE_FLOOR, Math.round(ceil * INTERACTIVE_SHARE)),
  );
  const bRate = Math.max(MIN_TREE_RATE, g - Math.round(g * INTERACTIVE_SHARE));
  const podRate = Math.max(g, iRate + bRate);
  return {
    pod: { rate: podRate, ceil, burst: burstBytes(podRate), cburst: p.burst, quantum, prio: 0 },
    interactive: {
      rate: iRate,
      ceil,
      burst: burstBytes(iRate),
      cburst: p.burst,
      quantum,
      prio: 2 * band,
      queue: interactiveQueueBytes(ceil),
    },
    bulk: { rate: bRate, ceil, burst: burstBytes(bRate), cburst: p.burst, quantum, prio: 2 * band + 1, leaf: leafParams(p) },
  };
}

/** The classes and queues of one shaped direction (see the module doc). */
export function podLayout(rateBits: number, burstBits?: number): PodLayout {
  const p = rateParams(rateBits, burstBits);
  const iRate = Math.max(1, Math.round(p.rate * INTERACTIVE_SHARE));
  const bRate = Math.max(1, p.rate - iRate);
  return {
    pod: { rate: p.rate, ceil: p.rate, burst: p.burst, cburst: p.burst, quantum: p.quantum, prio: 0 },
    interactive: {
      rate: iRate,
      ceil: p.rate,
      burst: burstBytes(iRate),
      cburst: p.burst,
      quantum: htbQuantum(iRate),
      prio: 0,
      queue: interactiveQueueBytes(p.rate),
    },
    bulk: { rate: bRate, ceil: p.rate, burst: p.burst, cburst: p.burst, quantum: htbQuantum(bRate), prio: 1, leaf: leafParams(p) },
  };
}
