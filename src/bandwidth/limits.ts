/**
 * Bandwidth limits, their one home: the type, the bounds, and every way a limit arrives — the pod's
 * `kubernetes.io/ingress-bandwidth` / `egress-bandwidth` annotations (Kubernetes quantities) and a
 * runtime's `runtimeConfig.bandwidth` (bits/s, as containerd and CRI-O pass the annotations) — each
 * checked against the same bounds, with errors naming where the value came from.
 */
import { ConfigError } from '../errors.js';
import { parseQuantity } from './quantity.js';

/**
 * A pod's bandwidth: ceilings (rates in bits/s, bursts in bits; a missing direction has none, a
 * missing burst is sized by the shaper), guarantees (bits/s the node reserves for the pod under
 * contention, from its requests of the node's extended resources: guarantees.ts) and the priority
 * band in which it shares what is left after guarantees (0 first .. 2 last: guarantees.ts). A
 * guarantee and a band take effect only on a node with a capacity (capacity.ts).
 */
export interface BandwidthLimits {
  ingress?: number;
  egress?: number;
  ingressBurst?: number;
  egressBurst?: number;
  ingressGuarantee?: number;
  egressGuarantee?: number;
  priority?: number;
  /** The pod's namespace's cap on the sum of its pods on this node, per direction (namespace-policy.ts), bits/s. */
  ingressTotal?: number;
  egressTotal?: number;
}

/** The priority bands (guarantees.ts PRIORITY_BANDS): 0 is served first. */
export const MAX_PRIORITY = 2;

/**
 * Where a direction's limit came from: the pod's own (its annotations, a runtime's runtimeConfig,
 * `kubenet shape`), its namespace's default, or its namespace's ceiling (namespace-policy.ts).
 */
export type LimitSource = 'pod' | 'namespace-default' | 'namespace-ceiling';

/** The source of each shaped direction. */
export interface LimitSources {
  ingress?: LimitSource;
  egress?: LimitSource;
}

/** Two sets of sources are the same (absent = none recorded). */
export function sameSources(a: LimitSources | undefined, b: LimitSources | undefined): boolean {
  return a?.ingress === b?.ingress && a?.egress === b?.egress;
}

/** Traffic TO the pod. */
export const INGRESS_ANNOTATION = 'kubernetes.io/ingress-bandwidth';
/** Traffic FROM the pod. */
export const EGRESS_ANNOTATION = 'kubernetes.io/egress-bandwidth';

/** Kubelet's lower bound on a bandwidth annotation, bits/s. */
export const MIN_BANDWIDTH = 1_000;
/**
 * The highest rate the shaper can enforce, bits/s: 10 Tbit/s. Kubelet accepts annotations up to 1P,
 * but tc keeps a class's burst in 32 bits of bytes, which above ~20 Tbit/s cannot hold even the
 * 1.5 ms burst the shaper gives a pod; such a value is refused here, naming it, before anything runs.
 */
export const MAX_BANDWIDTH = 10_000_000_000_000;
/** A burst, in bits, is at most this (tc's 32-bit byte count; the shaper bounds it further from the rate). */
export const MAX_BURST_BITS = 4294967295 * 8;

/** The accepted form of a bandwidth quantity, in the words of every error about one. */
export const BANDWIDTH_FORM =
  'want a number of bits/s with an optional suffix k, M, G, T (or Ki, Mi, Gi, Ti) and no space or unit, e.g. "10M" or "500k"';

/**
 * A bandwidth quantity in bits/s, validated against kubelet's bounds. Errors name `what` (the
 * annotation, key or flag the value came from), the value, and the accepted form or bound.
 */
export function parseBandwidth(value: string, what: string): number {
  const v = parseQuantity(value);
  if (v === undefined) {
    throw new ConfigError(`${what}: ${JSON.stringify(value)} is not a bandwidth: ${BANDWIDTH_FORM}`);
  }
  if (v < BigInt(MIN_BANDWIDTH)) {
    throw new ConfigError(`${what}: bandwidth ${JSON.stringify(value)} is below the minimum 1k (1000 bit/s)`);
  }
  if (v > BigInt(MAX_BANDWIDTH)) {
    throw new ConfigError(`${what}: bandwidth ${JSON.stringify(value)} is above the maximum 10T (10^13 bit/s) that tc can enforce`);
  }
  return Number(v);
}

/**
 * Reads `kubernetes.io/ingress-bandwidth` (to the pod) and `kubernetes.io/egress-bandwidth`
 * (from the pod). Absent annotations leave that direction unshaped; present but invalid ones
 * throw a ConfigError naming the annotation and the value.
 */
export function bandwidthFromAnnotations(annotations?: Record<string, string>): BandwidthLimits {
  const limits: BandwidthLimits = {};
  if (!annotations) return limits;
  const ingress = annotations[INGRESS_ANNOTATION];
  if (ingress !== undefined) limits.ingress = parseBandwidth(ingress, `annotation ${INGRESS_ANNOTATION}`);
  const egress = annotations[EGRESS_ANNOTATION];
  if (egress !== undefined) limits.egress = parseBandwidth(egress, `annotation ${EGRESS_ANNOTATION}`);
  return limits;
}

/** True when the limits neither cap nor guarantee either direction. */
export function isUnshaped(limits: BandwidthLimits): boolean {
  return (
    limits.ingress === undefined &&
    limits.egress === undefined &&
    limits.ingressGuarantee === undefined &&
    limits.egressGuarantee === undefined
  );
}

/**
 * True when the pod asked for nothing that way: no ceiling, guarantee or namespace total, and no
 * priority band. On a node with a capacity such a pod is kept out of the tree while the node is far
 * from it (src/shaper/steering.ts).
 */
export function isBestEffort(limits: BandwidthLimits, dir: 'ingress' | 'egress'): boolean {
  return (
    limits.priority === undefined &&
    (dir === 'ingress'
      ? limits.ingress === undefined && limits.ingressGuarantee === undefined && limits.ingressTotal === undefined
      : limits.egress === undefined && limits.egressGuarantee === undefined && limits.egressTotal === undefined)
  );
}

/** True when the limits cap or guarantee this direction. */
export function shapesDirection(limits: BandwidthLimits, dir: 'ingress' | 'egress'): boolean {
  return dir === 'ingress'
    ? limits.ingress !== undefined || limits.ingressGuarantee !== undefined
    : limits.egress !== undefined || limits.egressGuarantee !== undefined;
}

/**
 * Checks limits given as numbers (the library, runtimeConfig.bandwidth after parsing): each rate an
 * integer-valued number within MIN_BANDWIDTH..MAX_BANDWIDTH bits/s, each burst a positive number of
 * bits up to MAX_BURST_BITS. Throws a ConfigError naming `what`, the key and the value.
 */
export function checkLimits(limits: BandwidthLimits, what: string): BandwidthLimits {
  if (typeof limits !== 'object' || limits === null || Array.isArray(limits))
    throw new ConfigError(`${what}: bandwidth limits must be an object`);
  for (const [k, v] of Object.entries(limits)) {
    if (v === undefined) continue;
    const isRate =
      k === 'ingress' ||
      k === 'egress' ||
      k === 'ingressGuarantee' ||
      k === 'egressGuarantee' ||
      k === 'ingressTotal' ||
      k === 'egressTotal';
    if (!isRate && k !== 'ingressBurst' && k !== 'egressBurst' && k !== 'priority')
      throw new ConfigError(`${what}: unknown bandwidth key ${JSON.stringify(k)}`);
    if (typeof v !== 'number' || !Number.isFinite(v)) throw new ConfigError(`${what}: ${k} must be a number, got ${JSON.stringify(v)}`);
    if (k === 'priority') {
      if (!Number.isInteger(v) || v < 0 || v > MAX_PRIORITY)
        throw new ConfigError(`${what}: priority must be an integer 0..${MAX_PRIORITY}, got ${v}`);
      continue;
    }
    if (isRate && (v < MIN_BANDWIDTH || v > MAX_BANDWIDTH)) {
      throw new ConfigError(`${what}: ${k} ${v} bits/s is outside ${MIN_BANDWIDTH}..${MAX_BANDWIDTH} bits/s`);
    }
    if (!isRate && (v <= 0 || v > MAX_BURST_BITS)) throw new ConfigError(`${what}: ${k} ${v} bits is outside 1..${MAX_BURST_BITS} bits`);
  }
  return limits;
}

/** Two limits are the same when every rate, burst, guarantee, total and the priority are. */
export function sameLimits(a: BandwidthLimits, b: BandwidthLimits): boolean {
  return (
    a.ingress === b.ingress &&
    a.egress === b.egress &&
    a.ingressBurst === b.ingressBurst &&
    a.egressBurst === b.egressBurst &&
    a.ingressGuarantee === b.ingressGuarantee &&
    a.egressGuarantee === b.egressGuarantee &&
    a.priority === b.priority &&
    a.ingressTotal === b.ingressTotal &&
    a.egressTotal === b.egressTotal
  );
}

/** containerd passes this burst (uint32 max) when the pod sets none: it means "none given". */
export const UNSET_BURST = 4294967295;

function isObj(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function describe(v: unknown): string {
  const s = JSON.stringify(v) ?? String(v);
  return s.length > 80 ? `${s.slice(0, 80)}…` : s;
}

/**
 * runtimeConfig.bandwidth as containerd and CRI-O pass it: rates in bits/s, bursts in bits, keys in
 * camelCase (the CNI convention) or PascalCase (containerd 1.6). A rate of 0 means no limit that
 * way; a burst of 4294967295 means none given. Undefined when no limit is given.
 * @throws ConfigError naming the key and the value
 */
export function limitsFromRuntimeConfig(bw: unknown): BandwidthLimits | undefined {
  if (bw === undefined || bw === null) return undefined;
  const where = 'runtimeConfig.bandwidth';
  if (!isObj(bw)) throw new ConfigError(`${where} must be an object, got ${describe(bw)}`);
  const known = ['ingressRate', 'ingressBurst', 'egressRate', 'egressBurst'];
  for (const k of Object.keys(bw)) {
    if (!known.some((c) => c === k || c[0]!.toUpperCase() + c.slice(1) === k))
      throw new ConfigError(`${where} has an unknown key ${JSON.stringify(k)}`);
  }
  const pick = (camel: string): number | undefined => {
    const pascal = camel[0]!.toUpperCase() + camel.slice(1);
    if (bw[camel] !== undefined && bw[pascal] !== undefined) throw new ConfigError(`${where} gives both ${camel} and ${pascal}`);
    const v = bw[camel] ?? bw[pascal];
    if (v === undefined || v === null) return undefined;
    if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 0)
      throw new ConfigError(`${where}.${camel} must be a non-negative integer, got ${describe(v)}`);
    return v;
  };
  const out: BandwidthLimits = {};
  for (const [dir, rate, burst] of [
    ['ingress', 'ingressRate', 'ingressBurst'],
    ['egress', 'egressRate', 'egressBurst'],
  ] as const) {
    const r = pick(rate);
    const b = pick(burst);
    if (!r) continue; // 0 or absent: no limit that way
    if (r < MIN_BANDWIDTH || r > MAX_BANDWIDTH)
      throw new ConfigError(`${where}.${rate} ${r} is outside ${MIN_BANDWIDTH}..${MAX_BANDWIDTH} bits/s`);
    out[dir] = r;
    if (!b || b === UNSET_BURST) continue;
    if (b > MAX_BURST_BITS) throw new ConfigError(`${where}.${burst} ${b} is above ${MAX_BURST_BITS} bits`);
    out[dir === 'ingress' ? 'ingressBurst' : 'egressBurst'] = b;
  }
  return out.ingress || out.egress ? out : undefined;
}

/** A rate in bits/s as a short quantity, e.g. 20000000 → "20M", 1500000 → "1.5M", 1000 → "1k". */
export function formatBandwidth(bps: number): string {
  for (const [unit, v] of [
    ['T', 1e12],
    ['G', 1e9],
    ['M', 1e6],
    ['k', 1e3],
  ] as const) {
    if (bps >= v) return `${+(bps / v).toFixed(3)}${unit}`;
  }
  return String(bps);
}

/** Limits as people read them: "ingress 20M, egress 10M (guaranteed 5M)", or "none". */
export function describeLimits(limits: BandwidthLimits): string {
  const parts: string[] = [];
  for (const d of ['ingress', 'egress'] as const) {
    const ceil = limits[d];
    const g = limits[d === 'ingress' ? 'ingressGuarantee' : 'egressGuarantee'];
    if (ceil === undefined && g === undefined) continue;
    parts.push(
      `${d} ${ceil === undefined ? 'no ceiling' : formatBandwidth(ceil)}${g === undefined ? '' : ` (guaranteed ${formatBandwidth(g)})`}`,
    );
  }
  return parts.length > 0 ? parts.join(', ') : 'none';
}

/**
 * New rates for a running pod, keeping a direction's burst only where its rate stays the same
 * (annotations and `kubenet shape` give rates only: a new rate gets the burst the shaper sizes).
 * Guarantees, the priority (the pod's requests and QoS class, not its annotations) and the namespace's
 * totals are kept.
 */
export function withRates(current: BandwidthLimits, rates: { ingress?: number | undefined; egress?: number | undefined }): BandwidthLimits {
  const out: BandwidthLimits = {};
  if (current.ingressGuarantee !== undefined) out.ingressGuarantee = current.ingressGuarantee;
  if (current.egressGuarantee !== undefined) out.egressGuarantee = current.egressGuarantee;
  if (current.priority !== undefined) out.priority = current.priority;
  if (current.ingressTotal !== undefined) out.ingressTotal = current.ingressTotal;
  if (current.egressTotal !== undefined) out.egressTotal = current.egressTotal;
  if (rates.ingress !== undefined) {
    out.ingress = rates.ingress;
    if (rates.ingress === current.ingress && current.ingressBurst !== undefined) out.ingressBurst = current.ingressBurst;
  }
  if (rates.egress !== undefined) {
    out.egress = rates.egress;
    if (rates.egress === current.egress && current.egressBurst !== undefined) out.egressBurst = current.egressBurst;
  }
  return out;
}

/** `limits` with the namespace totals `from` has (none where it has none). */
export function withTotals(limits: BandwidthLimits, from: BandwidthLimits): BandwidthLimits {
  const out: BandwidthLimits = { ...limits };
  delete out.ingressTotal;
  delete out.egressTotal;
  if (from.ingressTotal !== undefined) out.ingressTotal = from.ingressTotal;
  if (from.egressTotal !== undefined) out.egressTotal = from.egressTotal;
  return out;
}

/** Same rates both ways (bursts aside). */
export function sameRates(a: BandwidthLimits, b: BandwidthLimits): boolean {
  return a.ingress === b.ingress && a.egress === b.egress;
}
