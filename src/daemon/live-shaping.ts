/**
 * Live bandwidth: a running pod's limits changed without restarting it or resetting its
 * connections (the shaper replaces its htb classes in place), from two sources:
 *
 * - cluster mode: the pod watch (pod-lookup.ts). When `kubernetes.io/ingress-bandwidth` or
 *   `egress-bandwidth` is added, changed or removed on a pod this agent set up, its tc follows at
 *   once (the watch event's handler re-shapes; the watch waits for it, so one pod's changes apply in
 *   order). An invalid new value keeps the old limits. Pods the agent did not set up are ignored.
 *   A pod seen for the first time (the first list after a start, or a watch event during its ADD)
 *   is re-shaped only when it carries a bandwidth annotation whose rates differ from what it has:
 *   a pod without one may have its limits from the runtime's runtimeConfig.
 * - `kubenet shape NAMESPACE/NAME` through the agent socket (http-api.ts), in any mode. In cluster
 *   mode the annotations stay the source of truth: such a change lasts until they change.
 *
 * In cluster mode every change is an Event on the pod (events.ts): Normal `BandwidthApplied` with
 * the limits (also when an ADD applies limits), Warning `BandwidthRejected` with the annotation and
 * the error (an invalid value, at ADD or later).
 */
import { ConfigError, UnknownPodError } from '../errors.js';
import type { Logger } from '../log.js';
import {
  bandwidthFromAnnotations,
  describeLimits,
  EGRESS_ANNOTATION,
  INGRESS_ANNOTATION,
  isUnshaped,
  parseBandwidth,
  sameLimits,
  sameRates,
  withRates,
  type BandwidthLimits,
  type PodNetwork,
  type PodRecord,
} from '../pod/index.js';
import { KeyedMutex } from '../util/keyed-mutex.js';
import type { PodLookup, PodUpdate } from './cni-handler.js';
import { REASON_APPLIED, REASON_REJECTED, type EventRecorder } from './events.js';

/** What `kubenet shape` asks: quantities as in the annotations; `clear` starts from no limits. */
export interface ShapeRequest {
  ingress?: string;
  egress?: string;
  clear?: boolean;
}

export interface ShapedPod {
  namespace: string;
  name: string;
  id: string;
  limits: BandwidthLimits;
  previous: BandwidthLimits;
  changed: boolean;
}

/** Parses a POST /v1/pods/NS/NAME/limits body. @throws ConfigError */
export function parseShapeRequest(body: unknown): { ingress?: number; egress?: number; clear: boolean } {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw new ConfigError('limits request: want a JSON object {"ingress"?, "egress"?, "clear"?}');
  const rec = body as Record<string, unknown>;
  for (const k of Object.keys(rec)) if (!['ingress', 'egress', 'clear'].includes(k)) throw new ConfigError(`limits request: unknown field ${JSON.stringify(k)}`);
  const out: { ingress?: number; egress?: number; clear: boolean } = { clear: false };
  if (rec.clear !== undefined) {
    if (typeof rec.clear !== 'boolean') throw new ConfigError('limits request: "clear" must be a boolean');
    out.clear = rec.clear;
  }
  for (const dir of ['ingress', 'egress'] as const) {
    const v = rec[dir];
    if (v === undefined) continue;
    if (typeof v !== 'string') throw new ConfigError(`limits request: "${dir}" must be a quantity string such as "10M"`);
    out[dir] = parseBandwidth(v, `--${dir}`);
  }
  if (out.ingress === undefined && out.egress === undefined && !out.clear) throw new ConfigError('nothing to change: give --ingress, --egress or --clear');
  return out;
}

/** The two bandwidth annotations' raw values ("" when absent): what a change is judged on. */
function rawBandwidth(a: Record<string, string> | undefined): string {
  return JSON.stringify([a?.[INGRESS_ANNOTATION] ?? null, a?.[EGRESS_ANNOTATION] ?? null]);
}

function hasBandwidthAnnotation(a: Record<string, string>): boolean {
  return a[INGRESS_ANNOTATION] !== undefined || a[EGRESS_ANNOTATION] !== undefined;
}

export class LiveShaping {
  private readonly log: Logger;
  private readonly mutex = new KeyedMutex();

  constructor(
    private readonly network: PodNetwork,
    private readonly events: EventRecorder,
    private readonly pods: PodLookup | undefined,
    log: Logger,
  ) {
    this.log = log.child({ component: 'live-shaping' });
  }

  /** Subscribes to the pod watch (cluster mode); before the lookup starts. */
  start(): void {
    this.pods?.onPodUpdate?.((u) => this.onPodUpdate(u));
  }

  private ready(namespace: string, name: string): PodRecord[] {
    return this.network.list().filter((r) => r.phase === 'ready' && r.namespace === namespace && r.name === name);
  }

  private uid(namespace: string, name: string): string | undefined {
    return this.pods?.uid?.(namespace, name);
  }

  /** One pod as the watch saw it (see the module doc). */
  async onPodUpdate(u: PodUpdate): Promise<void> {
    if (!u.namespace || !u.name || this.ready(u.namespace, u.name).length === 0) return;
    if (u.previous !== undefined && rawBandwidth(u.previous) === rawBandwidth(u.annotations)) return;
    if (u.previous === undefined && !hasBandwidthAnnotation(u.annotations)) return;
    const pod = { namespace: u.namespace, name: u.name, uid: u.uid };
    await this.mutex.run(`${u.namespace}/${u.name}`, async () => {
      const records = this.ready(u.namespace, u.name);
      let rates: BandwidthLimits;
      try {
        rates = bandwidthFromAnnotations(u.annotations);
      } catch (err) {
        const keeping = describeLimits(records[0]?.limits ?? {});
        const message = `${err instanceof Error ? err.message : String(err)}; the pod keeps its limits (${keeping})`;
        this.log.warn({ pod: `${u.namespace}/${u.name}`, err }, 'bandwidth annotation refused; keeping the old limits');
        this.events.record(pod, 'Warning', REASON_REJECTED, message);
        return;
      }
      for (const r of records) {
        if (sameRates(r.limits, rates)) continue;
        await this.apply(r, withRates(r.limits, rates), pod, 'annotation');
      }
    });
  }

  /** Re-shapes one attachment, with its Event; false when it was gone or the kernel refused. */
  private async apply(r: PodRecord, limits: BandwidthLimits, pod: { namespace: string; name: string; uid: string | undefined }, via: string): Promise<boolean> {
    const t0 = performance.now();
    try {
      await this.network.reshape(r.containerId, r.ifName, limits);
    } catch (err) {
      if (err instanceof UnknownPodError) return false; // deleted meanwhile
      this.log.error({ err, pod: `${r.namespace}/${r.name}` }, 'could not change the pod\'s limits');
      this.events.record(pod, 'Warning', REASON_REJECTED, `could not apply bandwidth limits ${describeLimits(limits)}: ${err instanceof Error ? err.message : String(err)}; the pod keeps ${describeLimits(r.limits)}`);
      throw err;
    }
    const ms = +(performance.now() - t0).toFixed(2);
    this.log.info({ pod: `${r.namespace}/${r.name}`, from: r.limits, to: limits, via, ms }, 'pod re-shaped');
    this.events.record(pod, 'Normal', REASON_APPLIED, isUnshaped(limits) ? `bandwidth limits removed (were ${describeLimits(r.limits)})` : `bandwidth limits applied: ${describeLimits(limits)} (were ${describeLimits(r.limits)})`);
    return true;
  }

  /** An ADD set the pod up: its limits (an Event), and a change of its annotations the ADD may have missed. */
  attached(record: PodRecord): void {
    if (!record.namespace || !record.name) return;
    const pod = { namespace: record.namespace, name: record.name, uid: this.uid(record.namespace, record.name) };
    if (!isUnshaped(record.limits)) this.events.record(pod, 'Normal', REASON_APPLIED, `bandwidth limits applied: ${describeLimits(record.limits)}`);
    const now = this.pods?.cachedAnnotations?.(record.namespace, record.name);
    if (now) void this.onPodUpdate({ ...pod, annotations: now, previous: undefined }).catch((err: unknown) => this.log.error({ err }, 'late re-shape failed'));
  }

  /** An ADD was refused for its bandwidth annotations. */
  refused(pod: { namespace: string; name: string }, err: unknown): void {
    this.events.record({ ...pod, uid: this.uid(pod.namespace, pod.name) }, 'Warning', REASON_REJECTED, err instanceof Error ? err.message : String(err));
  }

  /** `kubenet shape`: new limits for every attachment of the pod. @throws UnknownPodError, ConfigError */
  async shape(namespace: string, name: string, req: { ingress?: number; egress?: number; clear: boolean }): Promise<ShapedPod[]> {
    if (this.ready(namespace, name).length === 0) throw new UnknownPodError(`pod ${namespace}/${name} is not attached to kubenet on this node`);
    return this.mutex.run(`${namespace}/${name}`, async () => {
      const out: ShapedPod[] = [];
      const pod = { namespace, name, uid: this.uid(namespace, name) };
      for (const r of this.ready(namespace, name)) {
        const base = req.clear ? {} : r.limits;
        const limits = withRates(r.limits, { ingress: req.ingress ?? base.ingress, egress: req.egress ?? base.egress });
        const changed = !sameLimits(limits, r.limits) && (await this.apply(r, limits, pod, 'kubenet shape'));
        out.push({ namespace, name, id: r.containerId, limits: changed ? limits : r.limits, previous: r.limits, changed });
      }
      if (out.length === 0) throw new UnknownPodError(`pod ${namespace}/${name} is not attached to kubenet on this node`);
      return out;
    });
  }
}
