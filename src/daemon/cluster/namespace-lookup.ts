/**
 * The Namespaces' bandwidth policy in cluster mode (issue 24): a cache fed by list + watch of
 * /api/v1/namespaces that keeps only each namespace's policy annotations
 * (src/bandwidth/namespace-policy.ts NAMESPACE_POLICY_ANNOTATIONS), with one GET on a miss (a pod ADD
 * in a namespace the watch has not delivered yet; its answer fills the cache, so each namespace
 * costs at most one). It tells a listener when a namespace's policy annotations appear or change
 * (live re-shaping of its pods, src/daemon/shaping/live-shaping.ts), with what it knew before.
 *
 * Only in cluster mode; RBAC: get, list and watch on namespaces. The static mode watches nothing.
 */
import type { V1Namespace } from '@kubernetes/client-node';
import { KubenetError } from '../../errors.js';
import type { Logger } from '../../log.js';
import { moduleLogger } from '../../util/module-logger.js';
import { policyAnnotations, rawPolicy } from '../../pod/index.js';
import { KubeApi, KubeApiError, ListWatchLoop, loadKubeConfig, sharedAborter, type KubeClientOptions } from '../kube/watch.js';

/** A namespace's policy annotations as the watch saw them change. */
export interface NamespaceUpdate {
  name: string;
  /** Its policy annotations now ({} when it has none). */
  annotations: Record<string, string>;
  /** Before this update; undefined when the namespace is new to the watcher (first list, new namespace). */
  previous: Record<string, string> | undefined;
}

/** What the agent asks of the namespaces (cluster mode). */
export interface NamespaceLookup {
  /** The namespace's policy annotations ({} without any), from the cache or one GET; undefined when it does not exist. */
  annotations(namespace: string): Promise<Record<string, string> | undefined>;
  /** The cache only (no API request). */
  cachedAnnotations(namespace: string): Record<string, string> | undefined;
  /** Hear of every namespace listed, added, or whose policy annotations changed. */
  onNamespaceUpdate(fn: (u: NamespaceUpdate) => void | Promise<void>): void;
  start(): Promise<void>;
  stop(): Promise<void>;
}

/** Namespace GETs one agent may have in flight (ADDs in namespaces not yet in the watch). */
const MAX_LOOKUPS_IN_FLIGHT = 256;

export class ClusterNamespaceLookup implements NamespaceLookup {
  private readonly log: Logger;
  /** The Forbidden answer of a namespace GET was logged (once: every ADD asks again). */
  private forbiddenLogged = false;
  private readonly api: KubeApi;
  private readonly loop: ListWatchLoop<V1Namespace>;
  /** name → policy annotations; a namespace a GET found missing is kept as undefined until the watch says otherwise. */
  private cache = new Map<string, Record<string, string> | undefined>();
  /** GETs in flight by namespace: ADDs of many pods of one namespace share one. */
  private readonly fetching = new Map<string, Promise<Record<string, string> | undefined>>();
  private aborter = sharedAborter(MAX_LOOKUPS_IN_FLIGHT);
  private listener: ((u: NamespaceUpdate) => void | Promise<void>) | undefined;

  constructor(opts: KubeClientOptions) {
    this.log = moduleLogger(opts.logger, 'namespace-lookup');
    this.api = new KubeApi(loadKubeConfig(opts));
    this.loop = new ListWatchLoop<V1Namespace>({
      api: this.api,
      log: this.log,
      path: '/api/v1/namespaces',
      fieldSelector: '',
      retry: opts,
      onList: async (items) => {
        const before = this.cache;
        this.cache = new Map(items.map((n) => [n.metadata?.name ?? '', policyAnnotations(n.metadata?.annotations)]));
        // After a (re-)list every namespace is news: changes made while no watch was open are seen here.
        for (const [name, annotations] of this.cache) await this.tell(name, annotations ?? {}, before.get(name));
      },
      onEvent: async (type, n) => {
        const name = n.metadata?.name ?? '';
        const before = this.cache.get(name);
        if (type === 'DELETED') {
          this.cache.delete(name);
          return;
        }
        const now = policyAnnotations(n.metadata?.annotations);
        this.cache.set(name, now);
        // Only policy changes are news: a namespace's other annotations and labels change often.
        if (before === undefined || rawPolicy(before) !== rawPolicy(now)) await this.tell(name, now, before);
      },
    });
  }

  onNamespaceUpdate(fn: (u: NamespaceUpdate) => void | Promise<void>): void {
    this.listener = fn;
  }

  private async tell(name: string, annotations: Record<string, string>, previous: Record<string, string> | undefined): Promise<void> {
    if (!this.listener || !name) return;
    try {
      await this.listener({ name, annotations: { ...annotations }, previous: previous && { ...previous } });
    } catch (err) {
      this.log.error({ err, namespace: name }, 'namespace update handler failed');
    }
  }

  async start(): Promise<void> {
    if (this.aborter.signal.aborted) this.aborter = sharedAborter(MAX_LOOKUPS_IN_FLIGHT);
    this.loop.start();
  }

  async stop(): Promise<void> {
    this.aborter.abort();
    await this.loop.stop();
  }

  cachedAnnotations(namespace: string): Record<string, string> | undefined {
    const c = this.cache.get(namespace);
    return c && { ...c };
  }

  async annotations(namespace: string): Promise<Record<string, string> | undefined> {
    if (this.cache.has(namespace)) return this.cachedAnnotations(namespace);
    let p = this.fetching.get(namespace);
    if (!p) {
      p = this.fetch(namespace).finally(() => this.fetching.delete(namespace));
      this.fetching.set(namespace, p);
    }
    const a = await p;
    return a && { ...a };
  }

  private async fetch(namespace: string): Promise<Record<string, string> | undefined> {
    const path = `/api/v1/namespaces/${encodeURIComponent(namespace)}`;
    let found: Record<string, string> | undefined;
    try {
      const ns = await this.api.getJson<V1Namespace>(path, {}, this.aborter.signal);
      found = policyAnnotations(ns.metadata?.annotations);
    } catch (err) {
      if (err instanceof KubeApiError && err.status === 403) {
        // A ClusterRole of before the namespace policy (the image updated, not the RBAC): the node
        // keeps setting pods up as that version did, without the policy, and says why (not cached:
        // the next ADD asks again, so applying the manifest's RBAC is enough).
        if (!this.forbiddenLogged)
          this.log.warn(
            { namespace, err },
            "the ClusterRole does not allow reading namespaces: pods are set up without namespace bandwidth policy (apply manifests/kubenet.yaml's RBAC)",
          );
        this.forbiddenLogged = true;
        return undefined;
      }
      if (!(err instanceof KubeApiError && err.status === 404)) {
        const why = err instanceof Error ? err.message : String(err);
        throw new KubenetError(`cannot look up namespace ${namespace} in the Kubernetes API: ${why}`, { cause: err });
      }
    }
    this.log.debug({ namespace, found: found !== undefined }, 'namespace not in the watch cache yet; fetched it');
    // The watch may have delivered it meanwhile: what it says is at least as new.
    if (!this.cache.has(namespace)) this.cache.set(namespace, found);
    return this.cache.get(namespace);
  }
}
