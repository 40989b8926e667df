/**
 * Pod annotations for CNI ADD (bandwidth limits) in cluster mode: a cache of the pods on this
 * node fed by list + watch of /api/v1/pods (spec.nodeName=<node>), with one GET on a miss
 * (the runtime may call ADD before the watch has delivered a freshly scheduled pod).
 */
import type { V1Pod } from '@kubernetes/client-node';
import { ConfigError, KubenetError } from '../errors.js';
import type { Logger } from '../log.js';
import type { PodLookup } from './cni-handler.js';
import { KubeApi, KubeApiError, ListWatchLoop, loadKubeConfig, type KubeClientOptions } from './kube-watch.js';

export type ClusterPodLookupOptions = KubeClientOptions;

const key = (namespace: string, name: string) => `${namespace}/${name}`;

export class ClusterPodLookup implements PodLookup {
  private readonly log: Logger;
  private readonly api: KubeApi;
  private readonly loop: ListWatchLoop<V1Pod>;
  /** "namespace/name" → annotations of the pods on this node. */
  private cache = new Map<string, Record<string, string>>();
  /** Aborts GETs in flight on stop(). */
  private aborter = new AbortController();

  constructor(opts: ClusterPodLookupOptions) {
    if (!opts.nodeName) throw new ConfigError('the node name is needed to watch the pods of this node');
    this.log = opts.logger.child({ component: 'pod-lookup', node: opts.nodeName });
    this.api = new KubeApi(loadKubeConfig(opts));
    this.loop = new ListWatchLoop<V1Pod>({
      api: this.api,
      log: this.log,
      path: '/api/v1/pods',
      fieldSelector: `spec.nodeName=${opts.nodeName}`,
      retryMinMs: opts.retryMinMs,
      retryMaxMs: opts.retryMaxMs,
      onList: (pods) => {
        this.cache = new Map(pods.map((p) => [key(p.metadata?.namespace ?? '', p.metadata?.name ?? ''), { ...p.metadata?.annotations }]));
      },
      onEvent: (type, p) => {
        const k = key(p.metadata?.namespace ?? '', p.metadata?.name ?? '');
        if (type === 'DELETED') this.cache.delete(k);
        else this.cache.set(k, { ...p.metadata?.annotations });
      },
    });
  }

  /** Starts filling the cache in the background; returns at once. */
  async start(): Promise<void> {
    if (this.aborter.signal.aborted) this.aborter = new AbortController();
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

  async annotations(namespace: string, name: string): Promise<Record<string, string> | undefined> {
    const cached = this.cache.get(key(namespace, name));
    if (cached) return { ...cached };
    const path = `/api/v1/namespaces/${encodeURIComponent(namespace)}/pods/${encodeURIComponent(name)}`;
    try {
      const pod = await this.api.getJson<V1Pod>(path, {}, this.aborter.signal);
      this.log.debug({ namespace, pod: name }, 'pod not in the watch cache yet; fetched it');
      return { ...pod.metadata?.annotations };
    } catch (err) {
      if (err instanceof KubeApiError && err.status === 404) return undefined;
      const why = err instanceof Error ? err.message : String(err);
      throw new KubenetError(`cannot look up pod ${namespace}/${name} in the Kubernetes API: ${why}`, { cause: err });
    }
  }
}
