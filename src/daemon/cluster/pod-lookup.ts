/**
 * The pods of this node in cluster mode: a cache fed by list + watch of /api/v1/pods
 * (spec.nodeName=<node>), with one GET on a miss (the runtime may call ADD before the watch has
 * delivered a freshly scheduled pod). It serves the pod annotations for CNI ADD (bandwidth limits)
 * and what the pod asks of the node (its requests of the bandwidth resources and its QoS class:
 * guarantees and band, pod-guarantees.ts), and tells a listener about every pod it learns of or
 * sees change (live re-shaping, src/daemon/shaping/live-shaping.ts), with what it knew before.
 */
import type { V1Pod } from '@kubernetes/client-node';
import { ConfigError, KubenetError } from '../../errors.js';
import type { Logger } from '../../log.js';
import { moduleLogger } from '../../util/module-logger.js';
import { podAsk, type PodAsk } from './pod-guarantees.js';
import { KubeApi, KubeApiError, ListWatchLoop, loadKubeConfig, sharedAborter, type KubeClientOptions } from '../kube/watch.js';

/** A pod of this node as the watch saw it (cluster mode). */
export interface PodUpdate {
  namespace: string;
  name: string;
  uid: string | undefined;
  annotations: Record<string, string>;
  /** The annotations known before this update; undefined when the pod is new to the watcher (first list, new pod). */
  previous: Record<string, string> | undefined;
  /** What it asks of the node now (guarantees, QoS class) and before this update (pod-guarantees.ts). */
  ask?: PodAsk;
  previousAsk?: PodAsk | undefined;
  /** spec.hostNetwork: the runtime never sets up its network (nor reads its bandwidth annotations). */
  hostNetwork?: boolean;
}

/** A pod as the ADD path needs it (cluster mode). */
export interface PodInfo {
  annotations: Record<string, string>;
  ask: PodAsk;
}

export interface PodLookup {
  /** The pod's annotations when the agent knows the pod (cluster mode), else undefined. */
  annotations(namespace: string, name: string): Promise<Record<string, string> | undefined>;
  /** Cluster mode: hear of every pod the watch lists, adds or modifies (live re-shaping). */
  onPodUpdate?(fn: (u: PodUpdate) => void | Promise<void>): void;
  /** Cluster mode: the pod's annotations and what it asks of the node, from the watch cache or one GET; undefined when it does not exist. */
  pod?(namespace: string, name: string): Promise<PodInfo | undefined>;
  /** Cluster mode: the watch cache only (no API request): annotations, ask and uid, or undefined. */
  cachedAnnotations?(namespace: string, name: string): Record<string, string> | undefined;
  cachedAsk?(namespace: string, name: string): PodAsk | undefined;
  uid?(namespace: string, name: string): string | undefined;
  /** Begin and end whatever feeds the lookup (a watch); the agent calls them around its own life. */
  start?(): Promise<void>;
  stop?(): Promise<void>;
}

/** Pod GETs one agent may have in flight (one per ADD of a pod not yet in the watch) before Node warns. */
const MAX_LOOKUPS_IN_FLIGHT = 1024;

export type ClusterPodLookupOptions = KubeClientOptions;

const key = (namespace: string, name: string) => `${namespace}/${name}`;

interface Cached {
  uid: string | undefined;
  annotations: Record<string, string>;
  ask: PodAsk;
}

function cached(p: V1Pod): Cached {
  return { uid: p.metadata?.uid, annotations: { ...p.metadata?.annotations }, ask: podAsk(p) };
}

export class ClusterPodLookup implements PodLookup {
  private readonly log: Logger;
  private readonly api: KubeApi;
  private readonly loop: ListWatchLoop<V1Pod>;
  /** "namespace/name" → what is known of the pods on this node. */
  private cache = new Map<string, Cached>();
  /** Aborts GETs in flight on stop(). */
  private aborter = sharedAborter(MAX_LOOKUPS_IN_FLIGHT);
  private listener: ((u: PodUpdate) => void | Promise<void>) | undefined;

  constructor(opts: ClusterPodLookupOptions) {
    if (!opts.nodeName) throw new ConfigError('the node name is needed to watch the pods of this node');
    this.log = moduleLogger(opts.logger, 'pod-lookup', { node: opts.nodeName });
    this.api = new KubeApi(loadKubeConfig(opts));
    this.loop = new ListWatchLoop<V1Pod>({
      api: this.api,
      log: this.log,
      path: '/api/v1/pods',
      fieldSelector: `spec.nodeName=${opts.nodeName}`,
      retry: opts,
      onList: async (pods) => {
        const before = this.cache;
        this.cache = new Map(pods.map((p) => [key(p.metadata?.namespace ?? '', p.metadata?.name ?? ''), cached(p)]));
        // After a (re-)list, every pod is news: changes made while no watch was open are seen here.
        for (const p of pods) await this.tell(p, before.get(key(p.metadata?.namespace ?? '', p.metadata?.name ?? '')));
      },
      onEvent: async (type, p) => {
        const k = key(p.metadata?.namespace ?? '', p.metadata?.name ?? '');
        const before = this.cache.get(k);
        if (type === 'DELETED') {
          this.cache.delete(k);
          return;
        }
        this.cache.set(k, cached(p));
        await this.tell(p, before);
      },
    });
  }

  /** `fn` hears of every pod listed or added/modified; the watch waits for it (updates of one pod arrive in order). */
  onPodUpdate(fn: (u: PodUpdate) => void | Promise<void>): void {
    this.listener = fn;
  }

  private async tell(p: V1Pod, before: Cached | undefined): Promise<void> {
    if (!this.listener) return;
    const now = cached(p);
    try {
      await this.listener({
        namespace: p.metadata?.namespace ?? '',
        name: p.metadata?.name ?? '',
        uid: now.uid,
        annotations: now.annotations,
        previous: before?.annotations,
        ask: now.ask,
        previousAsk: before?.ask,
        ...(p.spec?.hostNetwork === true ? { hostNetwork: true } : {}),
      });
    } catch (err) {
      this.log.error({ err, pod: `${p.metadata?.namespace}/${p.metadata?.name}` }, 'pod update handler failed');
    }
  }

  /** Starts filling the cache in the background; returns at once. */
  async start(): Promise<void> {
    if (this.aborter.signal.aborted) this.aborter = sharedAborter(MAX_LOOKUPS_IN_FLIGHT);
    this.loop.start();
  }

  /** Stops the watch and aborts lookups in flight. */
  async stop(): Promise<void> {
    this.aborter.abort();
    await this.loop.stop();
  }

  /** Whether the watch cache holds the pod (status, tests). */
  has(namespace: string, name: string): boolean {
    return this.cache.has(key(namespace, name));
  }

  /** The pod's uid as the watch last saw it (for Events), or undefined. */
  uid(namespace: string, name: string): string | undefined {
    return this.cache.get(key(namespace, name))?.uid;
  }

  /** The pod's annotations as the watch cache holds them now, without asking the API server. */
  cachedAnnotations(namespace: string, name: string): Record<string, string> | undefined {
    const c = this.cache.get(key(namespace, name));
    return c ? { ...c.annotations } : undefined;
  }

  /** What the pod asks of the node as the watch cache holds it now. */
  cachedAsk(namespace: string, name: string): PodAsk | undefined {
    return this.cache.get(key(namespace, name))?.ask;
  }

  async annotations(namespace: string, name: string): Promise<Record<string, string> | undefined> {
    return (await this.pod(namespace, name))?.annotations;
  }

  async pod(namespace: string, name: string): Promise<PodInfo | undefined> {
    const c = this.cache.get(key(namespace, name));
    if (c) return { annotations: { ...c.annotations }, ask: c.ask };
    const path = `/api/v1/namespaces/${encodeURIComponent(namespace)}/pods/${encodeURIComponent(name)}`;
    try {
      const pod = await this.api.getJson<V1Pod>(path, {}, this.aborter.signal);
      this.log.debug({ namespace, pod: name }, 'pod not in the watch cache yet; fetched it');
      return { annotations: { ...pod.metadata?.annotations }, ask: podAsk(pod) };
    } catch (err) {
      if (err instanceof KubeApiError && err.status === 404) return undefined;
      const why = err instanceof Error ? err.message : String(err);
      throw new KubenetError(`cannot look up pod ${namespace}/${name} in the Kubernetes API: ${why}`, { cause: err });
    }
  }
}
