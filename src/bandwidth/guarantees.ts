/**
 * Guarantees and priority: how a pod asks for bandwidth the node reserves for it, and in which band
 * it shares what is left (pure; the agent feeds it the pod's spec and status).
 *
 * - **Guarantee**: a request of the node's extended resources `kubenet.io/egress-bandwidth` /
 *   `kubenet.io/ingress-bandwidth` in the pod's containers' `resources` (1 unit = 1 Mbit/s, so a
 *   10G node shows 10000 and the integers stay readable). kube-scheduler sums them as it sums every
 *   extended resource: the pod's request is the sum over its containers, or the largest init
 *   container's when that is more; a request given only as a limit counts as its limit (extended
 *   resources must have request == limit). The scheduler thus never places more guarantees on a
 *   node than the capacity the agent publishes on its Node (capacity.ts).
 * - **Priority band** for what is left after guarantees: the pod's QoS class (Guaranteed 0,
 *   Burstable 1, BestEffort 2; served in that order), or the annotation
 *   `kubenet.io/bandwidth-priority: high | medium | low` (0, 1, 2), which overrides it.
 * - A ceiling below the guarantee is raised to the guarantee (the promise wins; the agent says so
 *   in a Warning Event); a guarantee without a ceiling may borrow up to the node's capacity.
 */
import { ConfigError } from '../errors.js';
import { formatBandwidth, type BandwidthLimits } from './limits.js';
import { parseQuantity } from './quantity.js';

type Direction = 'ingress' | 'egress';

/** The node's extended resources, one per direction: their one definition. */
export const BANDWIDTH_RESOURCES = {
  ingress: 'kubenet.io/ingress-bandwidth',
  egress: 'kubenet.io/egress-bandwidth',
} as const satisfies Record<Direction, string>;
/** bits/s per unit of those resources (1 Mbit/s). */
export const RESOURCE_UNIT_BITS = 1_000_000;
/** The annotation that overrides the band the QoS class gives. */
export const PRIORITY_ANNOTATION = 'kubenet.io/bandwidth-priority';
/** The bands by name, 0 first. */
export const PRIORITY_BANDS = ['high', 'medium', 'low'] as const;
export type PriorityName = (typeof PRIORITY_BANDS)[number];
/** The band of each QoS class (Kubernetes' own `status.qosClass`). */
export const QOS_BANDS: Record<string, number> = { Guaranteed: 0, Burstable: 1, BestEffort: 2 };
/** A pod whose QoS class is not known (no status yet, no cluster) shares in the middle band. */
export const DEFAULT_BAND = 1;

/** The parts of a pod's spec the guarantee is read from (structurally a V1PodSpec). */
export interface ResourceSpec {
  containers?: Array<{ resources?: { requests?: Record<string, unknown>; limits?: Record<string, unknown> } }>;
  initContainers?: Array<{ resources?: { requests?: Record<string, unknown>; limits?: Record<string, unknown> } }>;
}

/** What a pod asks of the node, bits/s; a direction it does not request is absent. */
export interface Guarantees {
  ingress?: number;
  egress?: number;
}

function units(v: unknown, where: string): bigint {
  const q = typeof v === 'string' ? parseQuantity(v) : typeof v === 'number' && Number.isSafeInteger(v) ? BigInt(v) : undefined;
  if (q === undefined || q < 0n)
    throw new ConfigError(`${where}: invalid quantity ${JSON.stringify(v)} (expected a whole number of Mbit/s, e.g. "200")`);
  return q;
}

function containerAsk(c: NonNullable<ResourceSpec['containers']>[number], name: string, where: string): bigint {
  const v = c.resources?.requests?.[name] ?? c.resources?.limits?.[name];
  return v === undefined ? 0n : units(v, `${where} ${name}`);
}

/**
 * The pod's guarantees from its containers' requests of the node's bandwidth resources, as the
 * scheduler counts them (see the module doc). @throws ConfigError naming the resource and value
 */
export function guaranteesFromSpec(spec: ResourceSpec | undefined): Guarantees {
  const out: Guarantees = {};
  for (const d of ['ingress', 'egress'] as const) {
    const name = BANDWIDTH_RESOURCES[d];
    let sum = 0n;
    for (const c of spec?.containers ?? []) sum += containerAsk(c, name, 'container resource');
    let init = 0n;
    for (const c of spec?.initContainers ?? []) {
      const a = containerAsk(c, name, 'init container resource');
      if (a > init) init = a;
    }
    const total = sum > init ? sum : init;
    if (total > 0n) out[d] = Number(total) * RESOURCE_UNIT_BITS;
  }
  return out;
}

/** The band from the priority annotation, or the QoS class's; an invalid annotation is a problem and the QoS class's band applies. */
export function priorityOf(
  annotations: Record<string, string> | undefined,
  qosClass: string | undefined,
): { priority: number; problem?: string } {
  const fromQos = (qosClass !== undefined ? QOS_BANDS[qosClass] : undefined) ?? DEFAULT_BAND;
  const v = annotations?.[PRIORITY_ANNOTATION];
  if (v === undefined) return { priority: fromQos };
  const i = (PRIORITY_BANDS as readonly string[]).indexOf(v);
  if (i < 0)
    return {
      priority: fromQos,
      problem: `annotation ${PRIORITY_ANNOTATION} ${JSON.stringify(v)} is not one of ${PRIORITY_BANDS.join(', ')}; the pod's QoS class (${qosClass ?? 'unknown'}) gives band ${PRIORITY_BANDS[fromQos]}`,
    };
  return { priority: i };
}

/** A direction whose ceiling was below its guarantee (raised to it). */
export interface RaisedCeiling {
  direction: Direction;
  ceiling: number;
  guarantee: number;
}

/**
 * `limits` with the pod's guarantees and band: a ceiling below its direction's guarantee is raised
 * to it and reported. Bursts of a raised ceiling are dropped (sized for the new rate).
 */
export function withGuarantees(
  limits: BandwidthLimits,
  g: Guarantees,
  priority: number | undefined,
): { limits: BandwidthLimits; raised: RaisedCeiling[] } {
  const out: BandwidthLimits = { ...limits };
  delete out.ingressGuarantee;
  delete out.egressGuarantee;
  delete out.priority;
  const raised: RaisedCeiling[] = [];
  for (const d of ['ingress', 'egress'] as const) {
    const guarantee = g[d];
    if (guarantee === undefined) continue;
    out[d === 'ingress' ? 'ingressGuarantee' : 'egressGuarantee'] = guarantee;
    const ceiling = out[d];
    if (ceiling !== undefined && ceiling < guarantee) {
      raised.push({ direction: d, ceiling, guarantee });
      out[d] = guarantee;
      delete out[d === 'ingress' ? 'ingressBurst' : 'egressBurst'];
    }
  }
  if (priority !== undefined) out.priority = priority;
  return { limits: out, raised };
}

/** The Warning for a raised ceiling, naming the annotation, the resource and both values. */
export function raisedMessage(r: RaisedCeiling): string {
  const annotation = r.direction === 'ingress' ? 'kubernetes.io/ingress-bandwidth' : 'kubernetes.io/egress-bandwidth';
  return `${annotation} ${formatBandwidth(r.ceiling)} is below the pod's guarantee (${BANDWIDTH_RESOURCES[r.direction]} request, ${formatBandwidth(r.guarantee)}): ${r.direction} ceiling raised to ${formatBandwidth(r.guarantee)}`;
}
