/**
 * A pod's wanted shaping, as one pure function of what it depends on: the pod's own rates (the
 * runtime's runtimeConfig at ADD, else its bandwidth annotations), its namespace's policy (defaults,
 * ceilings, totals), what it asks of the node (guarantees, band) and the node's capacity, and, for a
 * pod already shaped, what it has now (a re-shape keeps a burst whose rate stays). The CNI ADD
 * (cni/handler.ts) and every live re-shape (live-shaping.ts: the pod watch, the namespace watch,
 * the retries of a refused re-shape) go through it, so a pod's limits are worked out one way.
 * `kubenet shape` is an override of the rates and goes its own way (live-shaping.ts `shape`).
 */
import type { NodeCapacity } from '../../bandwidth/capacity.js';
import { bandwidthFromAnnotations, withRates, withTotals, type BandwidthLimits, type LimitSources } from '../../bandwidth/limits.js';
import { applyNamespacePolicy, type ResolvedLimits } from '../../bandwidth/namespace-policy.js';
import { applyAsk, type AskNote, type PodAsk } from './pod-guarantees.js';

export interface WantedInput {
  /** The pod's own rates from its runtime (runtimeConfig); without them, its annotations' (parsed here). */
  own?: BandwidthLimits | undefined;
  /** The pod's annotations (its rates when `own` is absent, and its band). */
  annotations?: Record<string, string> | undefined;
  /** Its namespace's annotations (cluster mode); undefined: no policy. */
  policy?: Record<string, string> | undefined;
  namespace: string;
  /** What it asks of the node (cluster mode: the pod watch's). */
  ask?: PodAsk | undefined;
  /** Present where the node hands out guarantees (cluster mode): its capacity now, undefined when unknown. */
  node?: { capacity: NodeCapacity | undefined } | undefined;
  /** What the pod has now (a re-shape), with where its limits came from. */
  current?: { limits: BandwidthLimits; sources?: LimitSources | undefined } | undefined;
  /** Resolve only its guarantees and band: its rates stay as they are (a pod first seen without a bandwidth annotation or policy). */
  keepRates?: boolean;
}

export interface Wanted {
  limits: BandwidthLimits;
  /** Where its limits come from, recorded only where a namespace policy took part. */
  sources: LimitSources | undefined;
  /** The namespace policy's verdict: capped asks and invalid values, for the Warnings. */
  resolved: ResolvedLimits;
  /** What the pod asked of the node and does not get as asked, for the Warnings. */
  notes: AskNote[];
}

/** @throws ConfigError when a bandwidth annotation cannot be parsed (the pod keeps what it has). */
export function wantedShaping(i: WantedInput): Wanted {
  const resolved = applyNamespacePolicy(i.own ?? bandwidthFromAnnotations(i.annotations), i.policy, i.namespace);
  const cur = i.current;
  let limits = !cur ? resolved.limits : i.keepRates ? cur.limits : withTotals(withRates(cur.limits, resolved.limits), resolved.limits);
  let notes: AskNote[] = [];
  if (i.ask && i.node) ({ limits, notes } = applyAsk(limits, i.ask, i.annotations, i.node.capacity));
  const sources = cur && i.keepRates ? cur.sources : resolved.policy ? resolved.sources : undefined;
  return { limits, sources, resolved, notes };
}
