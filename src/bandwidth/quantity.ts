/**
 * Kubernetes resource quantities, as k8s.io/apimachinery `resource.ParseQuantity` reads them: an
 * optionally signed decimal number ("10", "1.5", ".5", "2.") followed by at most one suffix: binary
 * SI (Ki Mi Gi Ti Pi Ei), decimal SI (n u m "" k M G T P E) or a decimal exponent (e3, E-2). Mixing a
 * suffix with an exponent ("1e3M"), spaces ("10 Mbit") and units ("Mbit") are rejected, as kubelet
 * does. Values are computed exactly (BigInt) and rounded up to whole units like `Quantity.Value()`.
 */
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
