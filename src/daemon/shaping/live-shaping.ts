/**
 * Live bandwidth: a running pod's limits changed without restarting it or resetting its
 * connections (the shaper replaces its htb classes in place), from three sources:
 *
 * - cluster mode: the pod watch (pod-lookup.ts). When `kubernetes.io/ingress-bandwidth` or
 *   `egress-bandwidth` is added, changed or removed on a pod this agent set up, its tc follows at
 *   once. An invalid new value keeps the old limits. Pods the agent did not set up are ignored.
 *   A pod seen for the first time (the first list after a start, or a watch event during its ADD)
 *   is re-shaped only when it carries a bandwidth annotation whose rates differ from what it has,
 *   or its namespace has a bandwidth policy: a pod without either may have its limits from the
 *   runtime's runtimeConfig.
 * - cluster mode: the namespace watch (namespace-lookup.ts). When a namespace's policy annotations
 *   (src/bandwidth/namespace-policy.ts: defaults and ceilings) change, every pod of it on this node is
 *   resolved again from its own annotations and the new policy, and re-shaped where that differs.
 *   Pods in namespaces without a policy are resolved exactly as before (their own annotations).
 * - `kubenet shape NAMESPACE/NAME` through the agent socket (http/socket-api.ts), in any mode. In cluster
 *   mode the annotations stay the source of truth: such a change lasts until they change. It never
 *   sets a limit above the namespace's ceiling (nor none where there is one): such a direction gets
 *   the ceiling, and the answer says so (`capped`), as a pod's own annotation above it would.
 *
 * In cluster mode every change is an Event on the pod (events.ts): Normal `BandwidthApplied` with
 * the limits (also when an ADD applies limits; a limit from the namespace says so), Warning
 * `BandwidthRejected` with the annotation and the error (an invalid value of the pod, at ADD or
 * later; an invalid value of its namespace, ignored, at ADD and when the namespace changes),
 * Warning `BandwidthCapped` when the pod asks more than its namespace's ceiling and gets the ceiling.
 *
 * A pod of this node whose bandwidth annotation cannot be parsed gets its `BandwidthRejected`
 * Warning from the pod watch even when the runtime never calls the plugin (unparsable.ts).
 *
 * A re-shape the kernel refuses (a watch's, or a retry's) is a Warning `BandwidthRejected` saying
 * what the pod keeps and when it is tried again, and is retried with backoff (1 s doubling to 60 s,
 * jittered) from the pod's annotations and ask as the watch has them then, until it applies, a newer
 * resolution of the pod applies or is refused, or the pod is gone: never only logged, and never left
 * waiting for the pod's next change. `kubenet_pod_reshape_failures_total` counts the refusals and
 * `kubenet_pod_reshapes_retrying` the pods waiting for a retry. A namespace's pods are each resolved
 * on their own: one refused re-shape does not stop the others'.
 *
 * The watches and the retries only queue a pod (work-queue.ts: a pod waits once however often it
 * changed, merged into its newest trigger); one worker resolves the queued pods in order, each under
 * the pod's lock, through cluster/wanted.ts's `wantedShaping` (the ADD path's too). The watches wait
 * for the queueing, never for the kernel; `kubenet_pod_reshapes_queued` is the queue's length.
 *
 * With a pod's guarantees and band (cluster mode, pod-guarantees.ts): every resolution applies
 * them too, with their Warnings; a change of what the pod asks of the node (its requests, its QoS
 * class, `kubenet.io/bandwidth-priority`) re-shapes it as an annotation change does. A pod seen for
 * the first time that asks a guarantee or a band but carries no bandwidth annotation (and no
 * namespace policy) keeps its rates: only its guarantees and band are resolved. `kubenet shape`
 * keeps a pod's guarantees: a ceiling below one is raised to it.
 */
import { UnknownPodError } from '../../errors.js';
import type { Logger } from '../../log.js';
import { moduleLogger } from '../../util/module-logger.js';
import {
  cappedMessage,
  describeLimits,
  describeSourcedLimits,
  isUnshaped,
  rawPolicy,
  sameLimits,
  sameSources,
  withRates,
  type BandwidthLimits,
  type LimitSources,
  type PodNetwork,
  type PodRecord,
  type ResolvedLimits,
} from '../../pod/index.js';
import { capToCeilings, cappedAskMessage } from '../../bandwidth/namespace-policy.js';
import { KeyedMutex } from '../../util/keyed-mutex.js';
import { KeyedRetries } from './retries.js';
import { KeyedWorkQueue } from './work-queue.js';
import {
  hasBandwidthAnnotation,
  hasPolicyAnnotation,
  mergeJobs,
  rawBandwidth,
  type Job,
  type PodRef,
  type Queued,
  type Trigger,
} from './job.js';
import { UnparsableWarnings } from './unparsable.js';
import type { PodLookup, PodUpdate } from '../cluster/pod-lookup.js';
import type { NodeCapacity } from '../../bandwidth/capacity.js';
import { PRIORITY_BANDS, raisedMessage, withGuarantees } from '../../bandwidth/guarantees.js';
import { REASON_APPLIED, REASON_CAPPED, REASON_CEILING_RAISED, REASON_REJECTED, type EventRecorder } from '../kube/events.js';
import { asksOfNode, guaranteesOf, sameAsk, type AskNote, type PodAsk } from '../cluster/pod-guarantees.js';
import type { NamespaceLookup, NamespaceUpdate } from '../cluster/namespace-lookup.js';

import type { ShapedPod } from './shape-request.js';
import { wantedShaping, type Wanted } from '../cluster/wanted.js';

export { parseShapeRequest, type ShapedPod, type ShapeRequest } from './shape-request.js';

/** The kernel (or the pod's store) refused a re-shape: what the pod asked and what it keeps, in the Warning's words. */
class ReshapeRefused extends Error {}

export class LiveShaping {
  private readonly log: Logger;
  private readonly mutex = new KeyedMutex();
  /** Refused re-shapes waiting to be tried again, by "namespace/name" (see the module doc). */
  private readonly retries = new KeyedRetries();
  private readonly unparsable: UnparsableWarnings;
  /** Pods waiting for their resolution; one worker (see the module doc). */
  private readonly queue: KeyedWorkQueue<Job>;

  constructor(
    private readonly network: PodNetwork,
    private readonly events: EventRecorder,
    private readonly pods: PodLookup | undefined,
    log: Logger,
    private readonly namespaces?: NamespaceLookup,
    /** Cluster mode: the node's capacity, out of which guarantees are given (pod-guarantees.ts). */
    private readonly capacity?: () => NodeCapacity | undefined,
  ) {
    this.log = moduleLogger(log, 'live-shaping');
    this.unparsable = new UnparsableWarnings(events, this.log);
    this.queue = new KeyedWorkQueue<Job>(
      (key, job) => this.work(key, job),
      mergeJobs,
      (key, err) => this.log.error({ err, pod: key }, 'resolving the pod failed'),
    );
  }

  /** Subscribes to the pod and namespace watches (cluster mode); before the lookups start. */
  start(): void {
    // The watches wait for the admission (in order), never for the kernel.
    this.pods?.onPodUpdate?.(async (u) => void (await this.admitPod(u)));
    this.namespaces?.onNamespaceUpdate((u) => void this.admitNamespace(u));
  }

  /** Re-shapes refused since the start (kubenet_pod_reshape_failures_total). */
  get failures(): number {
    return this.retries.failures;
  }

  /** Pods waiting for a retry of a refused re-shape (kubenet_pod_reshapes_retrying). */
  get retrying(): number {
    return this.retries.size;
  }

  /** Pods waiting for the worker (kubenet_pod_reshapes_queued). */
  get queued(): number {
    return this.queue.size;
  }

  /** Gives up the pending retries and the queued pods; nothing is resolved afterwards. */
  stop(): void {
    this.retries.stop();
    this.queue.stop();
  }

  /** Queues the pod's resolution (the worker runs `work`); resolves once it was worked on. */
  private resolve(pod: PodRef, annotations: Record<string, string>, why: Trigger, ask?: PodAsk): Promise<void> {
    return this.queue.add(`${pod.namespace}/${pod.name}`, { pod, annotations, why, ...(ask ? { ask } : {}) });
  }

  /**
   * The worker's: resolves the pod under its lock (follow), and retries it while the kernel refuses:
   * a resolution that ends otherwise (applied, nothing to change, refused annotations, pod gone) ends the retries.
   */
  private async work(key: string, { pod, annotations, why, ask }: Job): Promise<void> {
    await this.mutex.run(key, async () => {
      try {
        await this.follow(pod, annotations, why, ask);
      } catch (err) {
        if (!(err instanceof ReshapeRefused)) throw err;
        const next = this.retries.refused(key, (n) => {
          // The pod as the watch has it now (a change meanwhile is what is wanted); else as it was.
          const now = this.pods?.cachedAnnotations?.(pod.namespace, pod.name) ?? annotations;
          const nowAsk = this.pods?.cachedAsk?.(pod.namespace, pod.name) ?? ask;
          const again: Trigger = {
            via: `${why.via.replace(/ \(retry \d+\)$/, '')} (retry ${n})`,
            podChanged: false,
            namespaceChanged: false,
            ...(why.keepRates ? { keepRates: true } : {}),
          };
          this.resolve(pod, now, again, nowAsk).catch((e: unknown) => this.log.error({ err: e, pod: key }, 'bandwidth retry failed'));
        });
        const again = next ? `trying again in ${(next.waitMs / 1000).toFixed(next.waitMs < 10_000 ? 1 : 0)} s` : 'the agent is stopping';
        const message = `${err.message}; ${again}`;
        this.log.error({ err: err.cause ?? err, pod: key, ...next }, `could not change the pod's limits; ${again}`);
        this.events.record(pod, 'Warning', REASON_REJECTED, message);
        return;
      }
      this.retries.done(key);
    });
  }

  private ready(namespace: string, name: string): PodRecord[] {
    return this.network.list().filter((r) => r.phase === 'ready' && r.namespace === namespace && r.name === name);
  }

  private uid(namespace: string, name: string): string | undefined {
    return this.pods?.uid?.(namespace, name);
  }

  /** The namespace's policy annotations (cluster mode), or undefined: none, or the lookup failed (logged). */
  private async policyOf(namespace: string): Promise<Record<string, string> | undefined> {
    if (!this.namespaces) return undefined;
    try {
      return await this.namespaces.annotations(namespace);
    } catch (err) {
      this.log.warn({ err, namespace }, 'namespace policy unknown; resolving the pod without it');
      return undefined;
    }
  }

  /** One pod as the watch saw it (see the module doc). */
  async onPodUpdate(u: PodUpdate): Promise<void> {
    await (await this.admitPod(u))?.done;
  }

  /** Queues the pod when the update asks for a resolution; `done` once it was worked on. */
  private async admitPod(u: PodUpdate): Promise<Queued | undefined> {
    if (!u.namespace || !u.name) return;
    if (this.ready(u.namespace, u.name).length === 0) {
      this.unparsable.seen(u);
      return;
    }
    if (u.previous !== undefined && rawBandwidth(u.previous) === rawBandwidth(u.annotations) && sameAsk(u.previousAsk, u.ask)) return;
    let keepRates = false;
    if (u.previous === undefined && !hasBandwidthAnnotation(u.annotations)) {
      // Without a bandwidth annotation, only a namespace policy (now, or when it was set up) can say anything of its rates.
      const policed = this.ready(u.namespace, u.name).some((r) => r.limitSources) || hasPolicyAnnotation(await this.policyOf(u.namespace));
      if (!policed && !(this.capacity && asksOfNode(u.ask, u.annotations))) return;
      keepRates = !policed;
    }
    const pod = { namespace: u.namespace, name: u.name, uid: u.uid };
    const why = { via: 'annotation', podChanged: u.previous !== undefined, namespaceChanged: false, keepRates };
    return { done: this.resolve(pod, u.annotations, why, u.ask) };
  }

  /** A namespace's policy annotations as the watch saw them (see the module doc). */
  async onNamespaceUpdate(u: NamespaceUpdate): Promise<void> {
    await this.admitNamespace(u).done;
  }

  /** Queues the namespace's pods when its policy changed; `done` once all were worked on. */
  private admitNamespace(u: NamespaceUpdate): Queued {
    const none = { done: Promise.resolve() };
    if (u.previous !== undefined && rawPolicy(u.previous) === rawPolicy(u.annotations)) return none;
    const records = this.network.list().filter((r) => r.phase === 'ready' && r.namespace === u.name && r.name);
    // Seen for the first time without a policy: nothing of it is in force here.
    if (records.length === 0 || (u.previous === undefined && !hasPolicyAnnotation(u.annotations) && !records.some((r) => r.limitSources)))
      return none;
    const names = [...new Set(records.map((r) => r.name))];
    this.log.info(
      { namespace: u.name, policy: u.annotations, pods: names.length },
      'namespace bandwidth policy changed; resolving its pods again',
    );
    const dones: Array<Promise<void>> = [];
    for (const name of names) {
      // The pod watch has not listed it yet: its first sight there resolves it.
      const annotations = this.pods?.cachedAnnotations?.(u.name, name);
      if (!annotations) continue;
      const pod = { namespace: u.name, name, uid: this.uid(u.name, name) };
      const why = { via: 'namespace policy', podChanged: false, namespaceChanged: u.previous !== undefined };
      dones.push(this.resolve(pod, annotations, why, this.pods?.cachedAsk?.(u.name, name)));
    }
    return { done: Promise.all(dones).then(() => undefined) };
  }

  /**
   * Resolves the pod's limits from its annotations, its namespace's policy and (with `ask`) what it
   * asks of the node now, and applies them where they differ.
   */
  private async follow(pod: PodRef, annotations: Record<string, string>, why: Trigger, ask?: PodAsk): Promise<void> {
    const records = this.ready(pod.namespace, pod.name);
    if (records.length === 0) return;
    // Read inside the pod's lock: the policy as it is now, not as it was when the event came.
    const policy = await this.policyOf(pod.namespace);
    const node = ask && this.capacity ? { capacity: this.capacity() } : undefined;
    const base = { annotations, policy, namespace: pod.namespace, ask, node, keepRates: why.keepRates === true };
    const want = (r: PodRecord) => wantedShaping({ ...base, current: { limits: r.limits, sources: r.limitSources } });
    let wanted: Wanted[];
    try {
      wanted = records.map(want);
    } catch (err) {
      const message = `${err instanceof Error ? err.message : String(err)}; the pod keeps its limits (${describeLimits(records[0]?.limits ?? {})})`;
      this.log.warn({ pod: `${pod.namespace}/${pod.name}`, err }, 'bandwidth annotation refused; keeping the old limits');
      this.events.record(pod, 'Warning', REASON_REJECTED, message);
      return;
    }
    const res = (wanted[0] as Wanted).resolved;
    if (why.namespaceChanged) this.reportProblems(pod, res);
    let changed = false;
    for (const [k, r] of records.entries()) {
      const w = wanted[k] as Wanted;
      if (sameLimits(r.limits, w.limits) && sameSources(r.limitSources, w.sources)) continue;
      changed = (await this.apply(r, w.limits, w.sources, pod, why.via)) || changed;
    }
    const notes = wanted.at(-1)?.notes ?? [];
    if (changed || why.podChanged) {
      if (!why.keepRates) for (const c of res.capped) this.events.record(pod, 'Warning', REASON_CAPPED, cappedMessage(c, pod.namespace));
      this.note(pod, notes);
    }
  }

  /** What the pod asked of the node and did not get as asked: a Warning each. */
  private note(pod: PodRef, notes: AskNote[]): void {
    for (const n of notes) {
      this.log.warn({ pod: `${pod.namespace}/${pod.name}`, reason: n.reason }, n.message);
      this.events.record(pod, 'Warning', n.reason, n.message);
    }
  }

  /** Invalid namespace values (ignored): logged, and a Warning on the pod. */
  private reportProblems(pod: PodRef, res: ResolvedLimits): void {
    for (const p of res.problems) {
      this.log.warn({ pod: `${pod.namespace}/${pod.name}`, problem: p }, 'namespace bandwidth policy value refused; ignored');
      this.events.record(pod, 'Warning', REASON_REJECTED, p);
    }
  }

  /**
   * Re-shapes one attachment (`sources`: where the limits came from, when a namespace policy took
   * part), with its Event when the rates change; false when it was gone or the kernel refused.
   */
  private async apply(
    r: PodRecord,
    limits: BandwidthLimits,
    sources: LimitSources | undefined,
    pod: PodRef,
    via: string,
  ): Promise<boolean> {
    const t0 = performance.now();
    try {
      await this.network.reshape(r.containerId, r.ifName, limits, sources);
    } catch (err) {
      if (err instanceof UnknownPodError) return false; // deleted meanwhile
      throw new ReshapeRefused(
        `could not apply bandwidth limits ${describeLimits(limits)}: ${err instanceof Error ? err.message : String(err)}; the pod keeps ${describeLimits(r.limits)}`,
        { cause: err },
      );
    }
    if (sameLimits(r.limits, limits)) return true; // only where they came from changed: recorded, nothing to tell
    const ms = +(performance.now() - t0).toFixed(2);
    this.log.info(
      { pod: `${r.namespace}/${r.name}`, from: r.limits, to: limits, ...(sources ? { sources } : {}), via, ms },
      'pod re-shaped',
    );
    const were = describeSourcedLimits(r.limits, r.limitSources);
    const bandOnly = sameLimits({ ...r.limits, priority: 0 }, { ...limits, priority: 0 });
    const band = (p: number | undefined) => (p === undefined ? 'none' : (PRIORITY_BANDS[p] ?? String(p)));
    this.events.record(
      pod,
      'Normal',
      REASON_APPLIED,
      bandOnly
        ? `bandwidth priority ${band(limits.priority)} (was ${band(r.limits.priority)})`
        : isUnshaped(limits)
          ? `bandwidth limits removed (were ${were})`
          : `bandwidth limits applied: ${describeSourcedLimits(limits, sources)} (were ${were})`,
    );
    return true;
  }

  /** `kubenet shape`'s re-shape: a refusal is the operator's answer (the kernel's error) and a Warning on the pod; not retried. */
  private async applyAsked(r: PodRecord, limits: BandwidthLimits, sources: LimitSources | undefined, pod: PodRef): Promise<boolean> {
    try {
      return await this.apply(r, limits, sources, pod, 'kubenet shape');
    } catch (err) {
      if (!(err instanceof ReshapeRefused)) throw err;
      this.retries.counted();
      this.log.error({ err: err.cause ?? err, pod: `${pod.namespace}/${pod.name}` }, "could not change the pod's limits (kubenet shape)");
      this.events.record(pod, 'Warning', REASON_REJECTED, err.message);
      throw err.cause ?? err;
    }
  }

  /**
   * An ADD set the pod up: its limits (an Event; a capped ask and invalid namespace values as
   * Warnings, from the ADD's `resolved` policy), and a change of its annotations the ADD may have missed.
   */
  attached(record: PodRecord, resolved?: ResolvedLimits, notes: AskNote[] = []): void {
    if (!record.namespace || !record.name) return;
    const pod = { namespace: record.namespace, name: record.name, uid: this.uid(record.namespace, record.name) };
    if (!isUnshaped(record.limits))
      this.events.record(
        pod,
        'Normal',
        REASON_APPLIED,
        `bandwidth limits applied: ${describeSourcedLimits(record.limits, record.limitSources)}`,
      );
    if (resolved) {
      for (const c of resolved.capped) this.events.record(pod, 'Warning', REASON_CAPPED, cappedMessage(c, record.namespace));
      this.reportProblems(pod, resolved);
    }
    this.note(pod, notes);
    const now = this.pods?.cachedAnnotations?.(record.namespace, record.name);
    const ask = this.pods?.cachedAsk?.(record.namespace, record.name);
    if (now)
      void this.onPodUpdate({ ...pod, annotations: now, previous: undefined, ...(ask ? { ask } : {}) }).catch((err: unknown) =>
        this.log.error({ err }, 'late re-shape failed'),
      );
  }

  /** An ADD was refused for its bandwidth annotations: a Warning, unless the watch told the pod of the same values already. */
  refused(pod: { namespace: string; name: string }, err: unknown): void {
    this.unparsable.addRefused(
      { ...pod, uid: this.uid(pod.namespace, pod.name) },
      this.pods?.cachedAnnotations?.(pod.namespace, pod.name),
      err,
    );
  }

  /** `kubenet shape`: new limits for every attachment of the pod. @throws UnknownPodError, ConfigError */
  async shape(namespace: string, name: string, req: { ingress?: number; egress?: number; clear: boolean }): Promise<ShapedPod[]> {
    if (this.ready(namespace, name).length === 0)
      throw new UnknownPodError(`pod ${namespace}/${name} is not attached to kubenet on this node`);
    return this.mutex.run(`${namespace}/${name}`, async () => {
      const out: ShapedPod[] = [];
      const pod = { namespace, name, uid: this.uid(namespace, name) };
      const policy = await this.policyOf(namespace);
      for (const r of this.ready(namespace, name)) {
        const base = req.clear ? {} : r.limits;
        // Held to the namespace's ceilings (the operator is told, as a pod's own annotation above one would be);
        // its guarantees and band stay, and a new ceiling below a guarantee is raised to it.
        const { rates, capped } = capToCeilings(
          { ingress: req.ingress ?? base.ingress, egress: req.egress ?? base.egress },
          policy,
          namespace,
        );
        const { limits, raised } = withGuarantees(withRates(r.limits, rates), guaranteesOf(r.limits), r.limits.priority);
        this.note(
          pod,
          raised.map((x) => ({ reason: REASON_CEILING_RAISED, message: raisedMessage(x) })),
        );
        const sources: LimitSources | undefined =
          capped.length === 0 ? undefined : Object.fromEntries(capped.map((c) => [c.direction, 'namespace-ceiling']));
        const changed = !sameLimits(limits, r.limits) && (await this.applyAsked(r, limits, sources, pod));
        const notes = capped.map((c) => cappedAskMessage(c, namespace));
        out.push({
          namespace,
          name,
          id: r.containerId,
          limits: changed ? limits : r.limits,
          previous: r.limits,
          changed,
          ...(notes.length > 0 ? { capped: notes } : {}),
        });
      }
      if (out.some((p) => p.capped))
        this.log.info({ pod: `${namespace}/${name}`, capped: out[0]?.capped }, 'kubenet shape asked above the namespace ceiling; capped');
      if (out.length === 0) throw new UnknownPodError(`pod ${namespace}/${name} is not attached to kubenet on this node`);
      return out;
    });
  }
}
