/**
 * Kubernetes Events on pods (core/v1, as kubelet writes them), so `kubectl describe pod` shows what
 * the agent did to a pod's bandwidth: Normal `BandwidthApplied` (the limits, guarantees, band) and
 * Warnings (`BandwidthRejected`: the annotation and the error; the reasons below, one each).
 * POSTed through the agent's own API client (kube/watch.ts); RBAC: `create` on `events` in the core group, nothing else (no patch: every
 * event is a new object, count 1).
 *
 * Fire and forget: recording never blocks or fails the work it reports. Events are posted one at a
 * time, in the order recorded, over one kept-alive connection (as client-go's broadcaster does,
 * from one goroutine per sink): a burst of ADDs then costs the API server, and the node's CPU while
 * the burst runs, one request at a time instead of one connection per Event in flight. At most
 * MAX_PENDING events wait; beyond that they are dropped (and logged), so a slow or absent API
 * server cannot pile them up in memory.
 */
import type { Logger } from '../../log.js';
import { moduleLogger } from '../../util/module-logger.js';
import { KubeApi, loadKubeConfig, sharedAborter, type KubeClientOptions } from './watch.js';

export const REASON_APPLIED = 'BandwidthApplied';
export const REASON_REJECTED = 'BandwidthRejected';
/** A pod asked more than its namespace's ceiling and got the ceiling (src/bandwidth/namespace-policy.ts). */
export const REASON_CAPPED = 'BandwidthCapped';
/** A pod's ceiling was below its guarantee and was raised to it (src/bandwidth/guarantees.ts). */
export const REASON_CEILING_RAISED = 'BandwidthCeilingRaised';
/** A pod's `kubenet.io/bandwidth-priority` annotation is not a band: its QoS class's band applies. */
export const REASON_PRIORITY_REJECTED = 'BandwidthPriorityRejected';
/** A pod's request of a bandwidth resource is no whole number of Mbit/s: it gets no guarantee. */
export const REASON_GUARANTEE_REJECTED = 'BandwidthGuaranteeRejected';
/** A pod asks a guarantee of a node without a capacity that way: guarantees are off there. */
export const REASON_GUARANTEE_UNAVAILABLE = 'BandwidthGuaranteeUnavailable';

export interface PodRef {
  namespace: string;
  name: string;
  uid?: string | undefined;
}

/** A Node (routes between nodes, src/daemon/cluster/routes.ts): its Events go to namespace `default`, as kubelet's do. */
export interface NodeRef {
  kind: 'Node';
  name: string;
}

export type ObjectRef = PodRef | NodeRef;

const isNode = (o: ObjectRef): o is NodeRef => 'kind' in o && o.kind === 'Node';
/** The namespace an Event about `o` lives in. */
const eventNamespace = (o: ObjectRef) => (isNode(o) ? 'default' : o.namespace);
const refText = (o: ObjectRef) => (isNode(o) ? `node/${o.name}` : `${o.namespace}/${o.name}`);

export type EventType = 'Normal' | 'Warning';

export interface EventRecorder {
  record(obj: ObjectRef, type: EventType, reason: string, message: string): void;
  /** Resolves once every event recorded so far is answered (or failed). */
  flush(): Promise<void>;
  /** Aborts posts in flight; later records are dropped. */
  stop(): Promise<void>;
}

/** Static mode: no API server, nowhere to record. */
export const noEvents: EventRecorder = {
  record: () => undefined,
  flush: async () => undefined,
  stop: async () => undefined,
};

const MAX_PENDING = 64;
/** The API server refuses a longer message. */
const MAX_MESSAGE = 1024;

/** The Event object for one occurrence (core/v1, the fields kubelet's recorder sets; a Node's uid is its name, as kubelet gives it). */
export function eventObject(
  obj: ObjectRef,
  type: EventType,
  reason: string,
  message: string,
  node: string,
  now = new Date(),
): Record<string, unknown> {
  const ts = now.toISOString().replace(/\.\d+Z$/, 'Z');
  const nanos = BigInt(now.getTime()) * 1_000_000n + BigInt(Math.floor(Math.random() * 1_000_000));
  return {
    apiVersion: 'v1',
    kind: 'Event',
    metadata: { name: `${obj.name}.${nanos.toString(16)}`, namespace: eventNamespace(obj) },
    involvedObject: isNode(obj)
      ? { apiVersion: 'v1', kind: 'Node', name: obj.name, uid: obj.name }
      : { apiVersion: 'v1', kind: 'Pod', namespace: obj.namespace, name: obj.name, ...(obj.uid ? { uid: obj.uid } : {}) },
    reason,
    message: message.length > MAX_MESSAGE ? `${message.slice(0, MAX_MESSAGE - 1)}…` : message,
    type,
    source: { component: 'kubenet', host: node },
    reportingComponent: 'kubenet',
    reportingInstance: node,
    firstTimestamp: ts,
    lastTimestamp: ts,
    count: 1,
  };
}

export class KubeEventRecorder implements EventRecorder {
  private readonly api: KubeApi;
  private readonly log: Logger;
  /** Recorded, not yet posted, oldest first. */
  private readonly queue: Array<{ path: string; body: Record<string, unknown>; about: { object: string; reason: string } }> = [];
  /** The loop posting the queue, one Event at a time; undefined while the queue is empty. */
  private posting: Promise<void> | undefined;
  private readonly aborter = sharedAborter(1);
  private dropped = 0;

  constructor(private readonly opts: Pick<KubeClientOptions, 'nodeName' | 'logger' | 'kubeconfig' | 'kubeConfig'>) {
    this.api = new KubeApi(loadKubeConfig(opts));
    this.log = moduleLogger(opts.logger, 'events');
  }

  record(obj: ObjectRef, type: EventType, reason: string, message: string): void {
    if (!obj.name || (!isNode(obj) && !obj.namespace) || this.aborter.signal.aborted) return;
    const about = { object: refText(obj), reason };
    if (this.queue.length >= MAX_PENDING) {
      if (this.dropped++ % 100 === 0) this.log.warn({ dropped: this.dropped, ...about }, 'too many events waiting; dropping');
      return;
    }
    // Stamped now, when it happened, not when it is posted.
    this.queue.push({
      path: `/api/v1/namespaces/${encodeURIComponent(eventNamespace(obj))}/events`,
      body: eventObject(obj, type, reason, message, this.opts.nodeName),
      about,
    });
    this.kick();
  }

  private kick(): void {
    if (this.posting || this.queue.length === 0) return;
    this.posting = this.drain().finally(() => {
      this.posting = undefined;
      this.kick(); // one recorded between the loop's last look and here
    });
  }

  private async drain(): Promise<void> {
    for (let e = this.queue.shift(); e && !this.aborter.signal.aborted; e = this.queue.shift()) {
      try {
        await this.api.postJson(e.path, e.body, this.aborter.signal);
        this.log.debug(e.about, 'event recorded');
      } catch (err) {
        if (!this.aborter.signal.aborted) this.log.warn({ err, ...e.about }, 'could not record an event');
      }
    }
  }

  async flush(): Promise<void> {
    while (this.posting) await this.posting;
  }

  async stop(): Promise<void> {
    this.aborter.abort();
    this.queue.length = 0;
    await this.flush();
  }
}
