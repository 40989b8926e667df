/**
 * Buffer sizing for the shaper, pure functions of the rate (bits/s). Rates are enforced at the
 * wire (L2 frame bytes, as tbf and htb count them); TCP goodput is ~95.6% of that at MTU 1500.
 *
 * - burst: what a class may send at line rate after idling. Small enough that a new transfer
 *   cannot blow through the limit (1.5 ms of the rate, so a 10M pod bursts 3 kB, not the 2 Gbit/s
 *   kubernetes once saw), at least two full frames, so that 1G still keeps up with timer slack.
 * - queue limit: bytes a pod may have queued. The kernel here has no fq/codel, so this bound is
 *   the only defence against bufferbloat. Low rates: what the reference plugin queues (25 ms of
 *   the rate + two frames), capped at 20 frames + two; high rates: 3 ms of the rate; never below
 *   4 frames. Measured (bench/shaping.ts): below ~16 frames at 10M a saturating TCP flow keeps
 *   the tail-drop queue full and 7-30% of the pod's other packets (ping) are dropped, for a few
 *   ms of RTT gained; at ~22 frames RTT and loss match the reference (9-12 ms, 0%). From 100M up
 *   the 3 ms term rules (1.2-1.8 ms RTT at 100M where the reference queues 3.5-6.5 ms).
 */
export const FRAME = 1514;

const BURST_SECONDS = 0.0015;
const MIN_BURST = 2 * FRAME;
const MAX_BURST_SECONDS = 0.1;
const QUEUE_SECONDS = 0.003;
const REF_LATENCY_SECONDS = 0.025;
const REF_TERM_MAX = 20 * FRAME;
const MIN_QUEUE = 4 * FRAME;
/** The largest byte count tc's u32 fields hold (with room for its own rounding). */
const MAX_TC_BYTES = 0xffffffff - 0xffff;

export interface RateParams {
  /** bits/s */
  rate: number;
  /** bytes */
  burst: number;
  /** bytes queued at most */
  limit: number;
  /** htb quantum, bytes */
  quantum: number;
}

/**
 * Burst in bytes for a rate in bits/s. An explicit `burstBits` is honoured between two frames and
 * 100 ms of the rate: runtimes pass huge bursts (containerd sends 2^31-1 bits for any annotated
 * pod), which is exactly how a 10M pod once did 2 Gbit/s in its first second.
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

export function queueLimitBytes(rateBits: number): number {
  const bytesPerSec = rateBits / 8;
  const refLike = Math.min(REF_TERM_MAX, Math.ceil(bytesPerSec * REF_LATENCY_SECONDS)) + MIN_BURST;
  return Math.max(MIN_QUEUE, refLike, Math.ceil(bytesPerSec * QUEUE_SECONDS));
}

/**
 * HTB quantum, explicit so htb never derives it from r2q (and never warns "quantum of class is
 * big/small"). Every pod class is a root class that never borrows, so the quantum only has to be
 * at least one frame and within htb's sane range.
 */
export function htbQuantum(rateBits: number): number {
  return Math.min(200_000, Math.max(FRAME, Math.ceil(rateBits / 8 / 1000)));
}

export function rateParams(rateBits: number, burstBits?: number): RateParams {
  const rate = Math.round(rateBits);
  return { rate, burst: burstBytes(rate, burstBits), limit: queueLimitBytes(rate), quantum: htbQuantum(rate) };
}

/**
 * The tbf leaf under a pod's htb class on the shared ifb. It does not shape: htb does. It exists
 * to segment GSO super-packets into frames at enqueue and to bound the queue in bytes. Measured:
 * a plain bfifo drops 64 kB GSO skbs (10M class got 6-7 Mbit/s) or, sized for them, holds 50 ms at
 * 10M; at 10M, leaving 4-frame skbs unsegmented cost 30% more queueing delay than 2-frame ones;
 * at 1G, segmenting everything cost 7% of the rate (CPU). So the bucket, which is also the
 * segmentation threshold, is 1 ms of the rate but at least two frames. Its rate (1000× the class,
 * at least 100 Gbit/s) refills the bucket faster than htb can dequeue back to back, so it never
 * throttles and htb never logs "non-work-conserving" for it.
 */
export function leafParams(p: RateParams): { rate: number; burst: number; limit: number } {
  return {
    rate: Math.min(1e18, Math.max(p.rate * 1000, 100e9)),
    burst: Math.max(2 * FRAME, Math.ceil((p.rate / 8) * 0.001)),
    limit: p.limit,
  };
}
