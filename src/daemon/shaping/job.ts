/**
 * What the live re-shapes' queue holds (live-shaping.ts, work-queue.ts): a pod's resolution with
 * what triggered it, and how a newer trigger for a pod already waiting is merged into it; and what
 * an update is judged on to be queued at all.
 */
import { EGRESS_ANNOTATION, INGRESS_ANNOTATION } from '../../bandwidth/limits.js';
import { PRIORITY_ANNOTATION } from '../../bandwidth/guarantees.js';
import { NAMESPACE_POLICY_ANNOTATIONS } from '../../bandwidth/namespace-policy.js';
import type { PodAsk } from '../cluster/pod-guarantees.js';

export type PodRef = { namespace: string; name: string; uid: string | undefined };

/** Why a pod is resolved again: what it is told about besides a change of its limits. */
export interface Trigger {
  via: string;
  /** Its own annotations changed: a capped ask is reported even when the limits stay. */
  podChanged: boolean;
  /** Its namespace's policy changed: invalid namespace values are reported. */
  namespaceChanged: boolean;
  /** Resolve only its guarantees and band; its rates stay (a first sight without a bandwidth annotation or policy). */
  keepRates?: boolean;
}

/** A pod's resolution waiting for the worker (work-queue.ts). */
export interface Job {
  pod: PodRef;
  annotations: Record<string, string>;
  why: Trigger;
  ask?: PodAsk;
}

/** A newer trigger for a pod already waiting: its newer pod, annotations and ask; what either was told to report. */
export function mergeJobs(a: Job, b: Job): Job {
  const ask = b.ask ?? a.ask;
  const why: Trigger = {
    via: b.why.via,
    podChanged: a.why.podChanged || b.why.podChanged,
    namespaceChanged: a.why.namespaceChanged || b.why.namespaceChanged,
    ...(a.why.keepRates && b.why.keepRates ? { keepRates: true } : {}),
  };
  return { pod: b.pod, annotations: b.annotations, why, ...(ask ? { ask } : {}) };
}

/** What an admission queued: settled once the worker has resolved it. */
export interface Queued {
  done: Promise<void>;
}

/** The bandwidth annotations' raw values (the two ceilings, the band; null when absent): what a change is judged on. */
export function rawBandwidth(a: Record<string, string> | undefined): string {
  return JSON.stringify([a?.[INGRESS_ANNOTATION] ?? null, a?.[EGRESS_ANNOTATION] ?? null, a?.[PRIORITY_ANNOTATION] ?? null]);
}

export function hasBandwidthAnnotation(a: Record<string, string>): boolean {
  return a[INGRESS_ANNOTATION] !== undefined || a[EGRESS_ANNOTATION] !== undefined;
}

/** The namespace has policy annotations (valid or not). */
export function hasPolicyAnnotation(a: Record<string, string> | undefined): boolean {
  return NAMESPACE_POLICY_ANNOTATIONS.some((k) => a?.[k] !== undefined);
}
