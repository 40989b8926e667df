/**
 * Namespace bandwidth policy (issue 24): annotations on a Namespace give its pods default limits
 * (for a direction a pod asks nothing for) and a ceiling (for a pod that asks more, or nothing):
 *
 * - `kubenet.io/default-ingress-bandwidth`, `kubenet.io/default-egress-bandwidth`
 * - `kubenet.io/max-ingress-bandwidth`, `kubenet.io/max-egress-bandwidth`
 * - `kubenet.io/max-ingress-bandwidth-total`, `kubenet.io/max-egress-bandwidth-total`: a cap on the
 *   sum of the namespace's pods on a node together (issue 33), carried in every pod's limits as
 *   `ingressTotal` / `egressTotal`; the shaper enforces it as a class of the node's tree between
 *   the node and the namespace's pods (src/shaper/groups.ts), where the node has a capacity.
 *
 * Same quantities and bounds as the pod's own `kubernetes.io/ingress-bandwidth` /
 * `egress-bandwidth` (limits.ts parseBandwidth). Per direction, the pod's own limit stands when it
 * is at most the ceiling; above it the pod gets the ceiling (`capped`); a pod that asks nothing
 * gets the default, or the ceiling when there is no default (as a LimitRange's `max` does), or the
 * ceiling when the default is above it. An invalid namespace value is ignored (the pod gets what it
 * would without that key) and reported in `problems`. Without a valid key the pod's limits are
 * returned as they came (bursts included): a namespace without policy changes nothing.
 *
 * Pure: no I/O; the agent feeds it the annotations of the pod and of its namespace.
 */
import { PRIORITY_BANDS } from './guarantees.js';
import {
  bandwidthFromAnnotations,
  EGRESS_ANNOTATION,
  formatBandwidth,
  INGRESS_ANNOTATION,
  parseBandwidth,
  type BandwidthLimits,
  type LimitSource,
  type LimitSources,
} from './limits.js';

type Direction = 'ingress' | 'egress';
const DIRECTIONS: readonly Direction[] = ['ingress', 'egress'];

/** The namespace annotations, by role and direction: their one definition. */
export const NAMESPACE_ANNOTATIONS = {
  default: { ingress: 'kubenet.io/default-ingress-bandwidth', egress: 'kubenet.io/default-egress-bandwidth' },
  max: { ingress: 'kubenet.io/max-ingress-bandwidth', egress: 'kubenet.io/max-egress-bandwidth' },
  total: { ingress: 'kubenet.io/max-ingress-bandwidth-total', egress: 'kubenet.io/max-egress-bandwidth-total' },
} as const satisfies Record<'default' | 'max' | 'total', Record<Direction, string>>;

/** Every namespace policy annotation (what a namespace watch keeps and compares). */
export const NAMESPACE_POLICY_ANNOTATIONS: readonly string[] = DIRECTIONS.flatMap((d) => [
  NAMESPACE_ANNOTATIONS.default[d],
  NAMESPACE_ANNOTATIONS.max[d],
  NAMESPACE_ANNOTATIONS.total[d],
]);

/** The parsed policy of one namespace (bits/s), with what was refused. */
export interface NamespacePolicy {
  default: { ingress?: number; egress?: number };
  max: { ingress?: number; egress?: number };
  total: { ingress?: number; egress?: number };
  /** One message per invalid annotation (ignored), naming the namespace, the annotation and the value. */
  problems: string[];
}

/** A pod above a ceiling: what it asked and what it got. */
export interface Capped {
  direction: Direction;
  asked: number;
  ceiling: number;
}

export interface ResolvedLimits {
  limits: BandwidthLimits;
  /** One per shaped direction of `limits`. */
  sources: LimitSources;
  /** Directions where the pod asked more than its namespace's ceiling. */
  capped: Capped[];
  /** Invalid namespace values, ignored (and a default above its ceiling). */
  problems: string[];
  /** The namespace has a policy (at least one valid key): callers record the sources only then. */
  policy: boolean;
}

/** Only the policy annotations of a namespace (a watch cache keeps just these). */
export function policyAnnotations(annotations: Record<string, string> | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  for (const k of NAMESPACE_POLICY_ANNOTATIONS) {
    const v = annotations?.[k];
    if (v !== undefined) out[k] = v;
  }
  return out;
}

/** The policy annotations' raw values, to tell whether they changed. */
export function rawPolicy(annotations: Record<string, string> | undefined): string {
  return JSON.stringify(NAMESPACE_POLICY_ANNOTATIONS.map((k) => annotations?.[k] ?? null));
}

/** Parses a namespace's policy annotations; an invalid one is left out and described in `problems`. */
export function parseNamespacePolicy(annotations: Record<string, string> | undefined, namespace = ''): NamespacePolicy {
  const policy: NamespacePolicy = { default: {}, max: {}, total: {}, problems: [] };
  const where = namespace ? `namespace ${namespace}: ` : '';
  for (const role of ['default', 'max', 'total'] as const) {
    for (const d of DIRECTIONS) {
      const key = NAMESPACE_ANNOTATIONS[role][d];
      const v = annotations?.[key];
      if (v === undefined) continue;
      try {
        policy[role][d] = parseBandwidth(v, `${where}annotation ${key}`);
      } catch (err) {
        policy.problems.push(`${err instanceof Error ? err.message : String(err)}; ignored`);
      }
    }
  }
  return policy;
}

/** Whether a parsed policy sets anything. */
export function hasPolicy(p: NamespacePolicy): boolean {
  return DIRECTIONS.some((d) => p.default[d] !== undefined || p.max[d] !== undefined || p.total[d] !== undefined);
}

/**
 * The limits a pod gets from its own (the annotations', or a runtime's runtimeConfig.bandwidth) and
 * its namespace's policy annotations. See the module doc.
 */
export function applyNamespacePolicy(
  own: BandwidthLimits,
  namespaceAnnotations: Record<string, string> | undefined,
  namespace = '',
): ResolvedLimits {
  const policy = parseNamespacePolicy(namespaceAnnotations, namespace);
  const problems = [...policy.problems];
  const sources: LimitSources = {};
  if (!hasPolicy(policy)) {
    for (const d of DIRECTIONS) if (own[d] !== undefined) sources[d] = 'pod';
    return { limits: own, sources, capped: [], problems, policy: false };
  }
  const limits: BandwidthLimits = {};
  const capped: Capped[] = [];
  const where = namespace ? ` of namespace ${namespace}` : '';
  for (const d of DIRECTIONS) {
    const asked = own[d];
    const def = policy.default[d];
    const max = policy.max[d];
    const burst = d === 'ingress' ? 'ingressBurst' : 'egressBurst';
    let rate: number | undefined;
    if (asked !== undefined) {
      if (max !== undefined && asked > max) {
        rate = max;
        sources[d] = 'namespace-ceiling';
        capped.push({ direction: d, asked, ceiling: max });
      } else {
        rate = asked;
        sources[d] = 'pod';
        if (own[burst] !== undefined) limits[burst] = own[burst];
      }
    } else if (def !== undefined && (max === undefined || def <= max)) {
      rate = def;
      sources[d] = 'namespace-default';
    } else if (max !== undefined) {
      if (def !== undefined) {
        problems.push(
          `annotation ${NAMESPACE_ANNOTATIONS.default[d]} ${formatBandwidth(def)}${where} is above its ceiling ${NAMESPACE_ANNOTATIONS.max[d]} ${formatBandwidth(max)}; the ceiling applies`,
        );
      }
      rate = max;
      sources[d] = 'namespace-ceiling';
    }
    if (rate !== undefined) limits[d] = rate;
  }
  // The namespace's totals on this node; the pod's own guarantees and band pass through.
  if (policy.total.ingress !== undefined) limits.ingressTotal = policy.total.ingress;
  if (policy.total.egress !== undefined) limits.egressTotal = policy.total.egress;
  for (const k of ['ingressGuarantee', 'egressGuarantee', 'priority'] as const) if (own[k] !== undefined) limits[k] = own[k];
  // Key order as the pod's own limits have it (ingress, egress, then bursts): records compare equal.
  const ordered: BandwidthLimits = {};
  for (const k of [
    'ingress',
    'egress',
    'ingressBurst',
    'egressBurst',
    'ingressGuarantee',
    'egressGuarantee',
    'priority',
    'ingressTotal',
    'egressTotal',
  ] as const)
    if (limits[k] !== undefined) ordered[k] = limits[k];
  return { limits: ordered, sources, capped, problems, policy: true };
}

/**
 * The resolver on annotations alone: the pod's `kubernetes.io/*-bandwidth` and its namespace's
 * policy. @throws ConfigError for an invalid value of the pod's own annotations (as before)
 */
export function resolveLimits(
  podAnnotations: Record<string, string> | undefined,
  namespaceAnnotations: Record<string, string> | undefined,
  namespace = '',
): ResolvedLimits {
  return applyNamespacePolicy(bandwidthFromAnnotations(podAnnotations), namespaceAnnotations, namespace);
}

/** A direction's source as people read it in `status` / `top`: "" for the pod's own. */
export function sourceTag(s: LimitSource | undefined): string {
  return s === 'namespace-default' ? 'ns-default' : s === 'namespace-ceiling' ? 'ns-ceiling' : '';
}

/**
 * Limits with where each came from, guarantees and (with a guarantee) the band, as Events say it:
 * "ingress 20M (namespace ceiling), egress 5M", "egress 100M (guaranteed 60M); priority high".
 */
export function describeSourcedLimits(limits: BandwidthLimits, sources: LimitSources | undefined): string {
  const parts: string[] = [];
  for (const d of DIRECTIONS) {
    const v = limits[d];
    const g = limits[d === 'ingress' ? 'ingressGuarantee' : 'egressGuarantee'];
    if (v === undefined && g === undefined) continue;
    const s = sources?.[d];
    const from =
      v !== undefined && s === 'namespace-default'
        ? ' (namespace default)'
        : v !== undefined && s === 'namespace-ceiling'
          ? ' (namespace ceiling)'
          : '';
    parts.push(
      `${d} ${v === undefined ? 'no ceiling' : formatBandwidth(v)}${from}${g === undefined ? '' : ` (guaranteed ${formatBandwidth(g)})`}`,
    );
  }
  if (parts.length === 0) return 'none';
  const guaranteed = limits.ingressGuarantee !== undefined || limits.egressGuarantee !== undefined;
  const band = limits.priority === undefined || !guaranteed ? undefined : PRIORITY_BANDS[limits.priority];
  return band === undefined ? parts.join(', ') : `${parts.join(', ')}; priority ${band}`;
}

/** The Warning for a capped direction, naming both annotations and the values. */
export function cappedMessage(c: Capped, namespace: string): string {
  const podKey = c.direction === 'ingress' ? INGRESS_ANNOTATION : EGRESS_ANNOTATION;
  return `${podKey} ${formatBandwidth(c.asked)} is above the ceiling ${NAMESPACE_ANNOTATIONS.max[c.direction]} ${formatBandwidth(c.ceiling)} of namespace ${namespace}: ${c.direction} limited to ${formatBandwidth(c.ceiling)}`;
}

/** A direction `kubenet shape` asked above its namespace's ceiling (`asked` undefined: no limit at all). */
export interface CappedAsk {
  direction: Direction;
  asked: number | undefined;
  ceiling: number;
}

/**
 * Rates an operator asks for (`kubenet shape`) held to the namespace's ceilings: a direction asked
 * above its ceiling, or left without a limit where there is one, gets the ceiling. Defaults do not
 * apply: the operator said what they want, the ceiling is the namespace's bound on it.
 */
export function capToCeilings(
  asked: { ingress?: number | undefined; egress?: number | undefined },
  namespaceAnnotations: Record<string, string> | undefined,
  namespace = '',
): { rates: { ingress?: number; egress?: number }; capped: CappedAsk[] } {
  const max = parseNamespacePolicy(namespaceAnnotations, namespace).max;
  const rates: { ingress?: number; egress?: number } = {};
  const capped: CappedAsk[] = [];
  for (const d of DIRECTIONS) {
    const a = asked[d];
    const ceiling = max[d];
    if (ceiling !== undefined && (a === undefined || a > ceiling)) capped.push({ direction: d, asked: a, ceiling });
    const rate = ceiling !== undefined && (a === undefined || a > ceiling) ? ceiling : a;
    if (rate !== undefined) rates[d] = rate;
  }
  return { rates, capped };
}

/** What `kubenet shape` answers for a capped direction, naming the ceiling's annotation. */
export function cappedAskMessage(c: CappedAsk, namespace: string): string {
  const what = c.asked === undefined ? `no ${c.direction} limit` : `${c.direction} ${formatBandwidth(c.asked)}`;
  return `${what} is above the ceiling ${NAMESPACE_ANNOTATIONS.max[c.direction]} ${formatBandwidth(c.ceiling)} of namespace ${namespace}: ${c.direction} limited to ${formatBandwidth(c.ceiling)}`;
}
