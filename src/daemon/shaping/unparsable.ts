/**
 * Bandwidth annotations that cannot be parsed, on pods of this node not (yet) set up here: a Warning
 * `BandwidthRejected` once per pod and values, naming the annotation, the value and the accepted
 * form; an ADD refused for the same values adds none. The pod watch is the one place that sees them:
 * containerd refuses such a sandbox before any CNI call (kubelet shows only `FailedCreatePodSandBox
 * ... quantities must match the regular expression`). Host-network pods are left alone (no runtime
 * reads their annotations).
 */
import type { Logger } from '../../log.js';
import { bandwidthFromAnnotations, EGRESS_ANNOTATION, INGRESS_ANNOTATION } from '../../pod/index.js';
import type { PodUpdate } from '../cluster/pod-lookup.js';
import { REASON_REJECTED, type EventRecorder } from '../kube/events.js';

/** How many pods' unparsable annotations are remembered (so each is told once); the oldest are forgotten first. */
const MAX_TOLD = 4096;

/** What a Warning was about: the pod's uid and both values. */
function toldKey(uid: string | undefined, a: Record<string, string>): string {
  return JSON.stringify([uid ?? '', a[INGRESS_ANNOTATION] ?? null, a[EGRESS_ANNOTATION] ?? null]);
}

export class UnparsableWarnings {
  /** "namespace/name" → the uid and values it was told of. */
  private readonly told = new Map<string, string>();

  constructor(
    private readonly events: EventRecorder,
    private readonly log: Logger,
  ) {}

  /** A pod of this node not set up here, as the watch saw it: a Warning when its values cannot be parsed, once per pod and values. */
  seen(u: PodUpdate): void {
    const k = `${u.namespace}/${u.name}`;
    if (u.hostNetwork === true) return;
    try {
      bandwidthFromAnnotations(u.annotations);
      this.told.delete(k); // fixed (or never wrong): a new wrong value is told again
    } catch (err) {
      const told = toldKey(u.uid, u.annotations);
      if (this.told.get(k) === told) return;
      this.told.delete(k);
      this.told.set(k, told);
      if (this.told.size > MAX_TOLD) this.told.delete(this.told.keys().next().value ?? '');
      const message = `${err instanceof Error ? err.message : String(err)}; the pod's network cannot be set up until the annotation is fixed or removed`;
      this.log.warn({ pod: k, err }, 'a pod of this node carries a bandwidth annotation that cannot be parsed');
      this.events.record({ namespace: u.namespace, name: u.name, uid: u.uid }, 'Warning', REASON_REJECTED, message);
    }
  }

  /** An ADD refused for its annotations (`annotations`: as the watch has them): a Warning, unless the same values were told already. */
  addRefused(
    pod: { namespace: string; name: string; uid: string | undefined },
    annotations: Record<string, string> | undefined,
    err: unknown,
  ): void {
    if (annotations && this.told.get(`${pod.namespace}/${pod.name}`) === toldKey(pod.uid, annotations)) return;
    this.events.record(pod, 'Warning', REASON_REJECTED, err instanceof Error ? err.message : String(err));
  }
}
