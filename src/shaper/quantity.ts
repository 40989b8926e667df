/**
 * Kubernetes resource quantities and the pod bandwidth annotations.
 *
 * The grammar follows k8s.io/apimachinery `resource.ParseQuantity`: an optionally signed decimal
 * number ("10", "1.5", ".5", "2.") followed by at most one suffix: binary SI (Ki Mi Gi Ti Pi Ei),
 * decimal SI (n u m "" k M G T P E) or a decimal exponent (e3, E-2). Mixing a suffix with an
 * exponent ("1e3M"), spaces ("10 Mbit") and units ("Mbit") are rejected, as kubelet does.
 * Values are computed exactly (BigInt) and rounded up to whole units like `Quantity.Value()`.
 *
 * The bandwidth annotations are bits per second, limited to [1k, 1P] as in kubelet's
 * `ExtractPodBandwidthResources`.
 */
import { ConfigError } from '../errors.js';

/** Rates in bits/s, bursts in bits. A missing direction is unshaped; a missing burst is sized by the shaper. */
export interface BandwidthLimits {
  ingress?: number;
  egress?: number;
  ingressBurst?: number;
  egressBurst?: number;
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

const QUANTITY_RE = /^([+-]?)(\d+(?:\.\d*)?|\.\d+)(?:(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)|[eE]([+-]?\d+))?$/;

/** base, exponent per suffix: value = number * base^exponent */
const SUFFIXES: Record<string, [bigint, number]> = {
  Ki: [2n, 10],
  Mi: [2n, 20],
  Gi: [2n, 30],
  Ti: [2n, 40],
  Pi: [2n, 50],
  Ei: [2n, 60],
  n: [10n, -9],
  u: [10n, -6],
  m: [10n, -3],
  k: [10n, 3],
  M: [10n, 6],
  G: [10n, 9],
  T: [10n, 12],
  P: [10n, 15],
  E: [10n, 18],
};

/** An exact rational value: num / den, den > 0. */
interface Exact {
  num: bigint;
  den: bigint;
}

function parseExact(s: string): Exact | undefined {
  const m = QUANTITY_RE.exec(s);
  if (!m) return undefined;
  const sign = m[1] === '-' ? -1n : 1n;
  const numberPart = m[2] ?? '';
  const [intPart = '', fracPart = ''] = numberPart.split('.');
  let num = BigInt((intPart || '0') + fracPart) * sign;
  let den = 10n ** BigInt(fracPart.length);
  let base = 10n;
  let exp = 0;
  if (m[3] !== undefined) {
    const sfx = SUFFIXES[m[3]];
    if (!sfx) return undefined;
    [base, exp] = sfx;
  } else if (m[4] !== undefined) {
    exp = Number(m[4]);
    // kubelet's own quantities never need more; refusing huge exponents keeps BigInt math bounded.
    if (!Number.isSafeInteger(exp) || Math.abs(exp) > 60) return undefined;
  }
  if (exp >= 0) num *= base ** BigInt(exp);
  else den *= base ** BigInt(-exp);
  return { num, den };
}

/**
 * Parses a Kubernetes quantity and returns its value rounded up to an integer (like
 * `Quantity.Value()`), or undefined when the text is not a quantity. Negative values are returned
 * as such; callers decide what range is valid.
 */
export function parseQuantity(s: string): bigint | undefined {
  const v = parseExact(s);
  if (!v) return undefined;
  const q = v.num / v.den;
  const r = v.num % v.den;
  return r > 0n ? q + 1n : q;
}

/** A bandwidth quantity in bits/s, validated against kubelet's bounds; `what` names the source in errors. */
export function parseBandwidth(value: string, what: string): number {
  const v = parseQuantity(value);
  if (v === undefined) {
    throw new ConfigError(`${what}: invalid bandwidth quantity ${JSON.stringify(value)} (expected e.g. "10M", "500k", "1Gi")`);
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

/** True when the limits shape neither direction. */
export function isUnshaped(limits: BandwidthLimits): boolean {
  return limits.ingress === undefined && limits.egress === undefined;
}

/**
 * Checks limits given as numbers (the library, runtimeConfig.bandwidth after parsing): each rate an
 * integer-valued number within MIN_BANDWIDTH..MAX_BANDWIDTH bits/s, each burst a positive number of
 * bits up to MAX_BURST_BITS. Throws a ConfigError naming `what`, the key and the value.
 */
export function checkLimits(limits: BandwidthLimits, what: string): BandwidthLimits {
  if (typeof limits !== 'object' || limits === null || Array.isArray(limits)) throw new ConfigError(`${what}: bandwidth limits must be an object`);
  for (const [k, v] of Object.entries(limits)) {
    if (v === undefined) continue;
    const isRate = k === 'ingress' || k === 'egress';
    if (!isRate && k !== 'ingressBurst' && k !== 'egressBurst') throw new ConfigError(`${what}: unknown bandwidth key ${JSON.stringify(k)}`);
    if (typeof v !== 'number' || !Number.isFinite(v)) throw new ConfigError(`${what}: ${k} must be a number, got ${JSON.stringify(v)}`);
    if (isRate && (v < MIN_BANDWIDTH || v > MAX_BANDWIDTH)) {
      throw new ConfigError(`${what}: ${k} ${v} bits/s is outside ${MIN_BANDWIDTH}..${MAX_BANDWIDTH} bits/s`);
    }
    if (!isRate && (v <= 0 || v > MAX_BURST_BITS)) throw new ConfigError(`${what}: ${k} ${v} bits is outside 1..${MAX_BURST_BITS} bits`);
  }
  return limits;
}

/** Two limits are the same when every rate and burst is. */
export function sameLimits(a: BandwidthLimits, b: BandwidthLimits): boolean {
  return a.ingress === b.ingress && a.egress === b.egress && a.ingressBurst === b.ingressBurst && a.egressBurst === b.egressBurst;
}
