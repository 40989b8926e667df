/**
 * What a pod asks of the node besides its ceilings, in cluster mode: its guarantees (its
 * containers' requests of `kubenet.io/{egress,ingress}-bandwidth`, src/bandwidth/guarantees.ts) and
 * its priority band (its QoS class, or `kubenet.io/bandwidth-priority`); and how that enters the
 * limits the shaper gets, on the ADD path (cni/handler.ts) and when re-shaping live
 * (live-shaping.ts), with a Warning for each thing the pod does not get as asked:
 *
 * - a ceiling below its guarantee is raised to it (`BandwidthCeilingRaised`);
 * - a priority annotation that is not a band: the QoS class's band (`BandwidthPriorityRejected`);
 * - a request that is no whole number of Mbit/s: no guarantee (`BandwidthGuaranteeRejected`);
 * - a guarantee in a direction the node has no capacity for: none (`BandwidthGuaranteeUnavailable`,
 *   "guarantees are off on this node: ...", naming the config keys).
 *
 * The band is given only on a node with a capacity (the tree it orders exists only there), and only
 * when it is known: a pod without a QoS class (none yet; fakes) and without a valid annotation gets
 * none, and the shaper's default. And the
 * node's side: what its pods are guaranteed together, what is free (`kubenet status`, /metrics). Pure.
 */
import type { V1Pod } from '@kubernetes/client-node';
import { describeCapacity, type NodeCapacity } from '../../bandwidth/capacity.js';
import {
  BANDWIDTH_RESOURCES,
  guaranteesFromSpec,
  priorityOf,
  PRIORITY_ANNOTATION,
  raisedMessage,
  withGuarantees,
  type Guarantees,
} from '../../bandwidth/guarantees.js';
import { formatBandwidth, type BandwidthLimits } from '../../bandwidth/limits.js';
import type { PodRecord } from '../../pod/index.js';
import {
  REASON_CEILING_RAISED,
  REASON_GUARANTEE_REJECTED,
  REASON_GUARANTEE_UNAVAILABLE,
  REASON_PRIORITY_REJECTED,
} from '../kube/events.js';

/** What a pod asks of the node, from its spec and status (the pod watch keeps it per pod). */
export interface PodAsk {
  guarantees: Guarantees;
  /** Its requests could not be read (the message says which and why): it gets no guarantee. */
  problem?: string;
  /** `status.qosClass`: Guaranteed, Burstable or BestEffort. */
  qosClass?: string;
}

/** A Warning about the pod: its reason (events.ts) and message. */
export interface AskNote {
  reason: string;
  message: string;
}

/** The pod's ask from its spec and status. */
export function podAsk(pod: Pick<V1Pod, 'spec' | 'status'>): PodAsk {
  const out: PodAsk = { guarantees: {} };
  try {
    out.guarantees = guaranteesFromSpec(pod.spec);
  } catch (err) {
    out.problem = err instanceof Error ? err.message : String(err);
  }
  const qos = pod.status?.qosClass;
  if (qos) out.qosClass = qos;
  return out;
}

/** Two asks are the same (absent: none known). */
export function sameAsk(a: PodAsk | undefined, b: PodAsk | undefined): boolean {
  return (
    a?.guarantees.ingress === b?.guarantees.ingress &&
    a?.guarantees.egress === b?.guarantees.egress &&
    a?.problem === b?.problem &&
    a?.qosClass === b?.qosClass
  );
}

/** The pod asks something of the node beyond its ceilings: a guarantee, a band by annotation, or it asked wrongly. */
export function asksOfNode(ask: PodAsk | undefined, annotations: Record<string, string> | undefined): boolean {
  return (
    ask?.guarantees.ingress !== undefined ||
    ask?.guarantees.egress !== undefined ||
    ask?.problem !== undefined ||
    annotations?.[PRIORITY_ANNOTATION] !== undefined
  );
}

/** Why a direction has no capacity, as the Warning and `kubenet status` say it. */
export function capacityOffReason(c: NodeCapacity | undefined, direction: 'ingress' | 'egress'): string {
  const keys = `set ${direction}Capacity, or capacityDevice to a device that reports its link speed, in the agent's config`;
  if (c === undefined) return `no capacity is known (${keys})`;
  if (c.device === undefined) return `no ${direction} capacity: no IPv4 default route to read a link speed from (${keys})`;
  return `no ${direction} capacity: ${c.device} reports no link speed (${keys})`;
}

/**
 * `limits` with what the pod asks of the node: its guarantees where the node has a capacity that
 * way (a ceiling below one raised to it), its band when the node has any capacity; and the Warnings.
 */
export function applyAsk(
  limits: BandwidthLimits,
  ask: PodAsk,
  annotations: Record<string, string> | undefined,
  capacity: NodeCapacity | undefined,
): { limits: BandwidthLimits; notes: AskNote[] } {
  const notes: AskNote[] = [];
  const band = priorityOf(annotations, ask.qosClass);
  if (band.problem !== undefined) notes.push({ reason: REASON_PRIORITY_REJECTED, message: band.problem });
  if (ask.problem !== undefined) notes.push({ reason: REASON_GUARANTEE_REJECTED, message: `${ask.problem}; the pod gets no guarantee` });
  const kept: Guarantees = {};
  for (const d of ['ingress', 'egress'] as const) {
    const g = ask.guarantees[d];
    if (g === undefined) continue;
    if (capacity?.[d] === undefined) {
      notes.push({
        reason: REASON_GUARANTEE_UNAVAILABLE,
        message: `guarantees are off on this node: ${capacityOffReason(capacity, d)}; the pod's ${BANDWIDTH_RESOURCES[d]} request (${formatBandwidth(g)}) is not reserved`,
      });
      continue;
    }
    kept[d] = g;
  }
  // A band where the node has a capacity, and the pod's is known (the API server sets the QoS class of every pod).
  const on = capacity?.egress !== undefined || capacity?.ingress !== undefined;
  const known = ask.qosClass !== undefined || (annotations?.[PRIORITY_ANNOTATION] !== undefined && band.problem === undefined);
  const { limits: out, raised } = withGuarantees(limits, kept, on && known ? band.priority : undefined);
  for (const r of raised) notes.push({ reason: REASON_CEILING_RAISED, message: raisedMessage(r) });
  return { limits: out, notes };
}

/** The guarantees a pod's limits carry (what `kubenet shape` keeps). */
export function guaranteesOf(limits: BandwidthLimits): Guarantees {
  return {
    ...(limits.ingressGuarantee !== undefined ? { ingress: limits.ingressGuarantee } : {}),
    ...(limits.egressGuarantee !== undefined ? { egress: limits.egressGuarantee } : {}),
  };
}

/** What the node's ready pods are guaranteed together, per direction, bits/s. */
export function committed(limits: Iterable<BandwidthLimits>): { ingress: number; egress: number } {
  const out = { ingress: 0, egress: 0 };
  for (const l of limits) {
    out.ingress += l.ingressGuarantee ?? 0;
    out.egress += l.egressGuarantee ?? 0;
  }
  return out;
}

/** The node's bandwidth as `kubenet status` shows it. */
export interface BandwidthReport {
  /** Per direction, bits/s: undefined where guarantees are off (`off` says why). */
  capacity: { ingress?: number; egress?: number };
  /** "egress 10G (link speed of eth0), ingress 1G (config)". */
  description: string;
  committed: { ingress: number; egress: number };
  free: { ingress?: number; egress?: number };
  off?: { ingress?: string; egress?: string };
}

/** The node's capacity, what its ready pods are guaranteed together and what is free; why a direction has none. */
export function bandwidthReport(c: NodeCapacity | undefined, records: PodRecord[]): BandwidthReport {
  const sum = committed(records.filter((r) => r.phase === 'ready').map((r) => r.limits));
  const out: BandwidthReport = { capacity: {}, description: c ? describeCapacity(c) : 'unknown', committed: sum, free: {} };
  for (const d of ['ingress', 'egress'] as const) {
    const v = c?.[d];
    if (v === undefined) {
      out.off = {
        ...out.off,
        [d]: c ? capacityOffReason(c, d) : "no capacity: guarantees come from the pods' requests of the Node's resources, in cluster mode",
      };
      continue;
    }
    out.capacity[d] = v;
    out.free[d] = v - sum[d];
  }
  return out;
}
