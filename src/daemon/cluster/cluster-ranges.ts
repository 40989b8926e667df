/**
 * The cluster's own address ranges, followed live: the destinations whose traffic with shaped pods
 * is unshaped by default with `routes: direct` (config `unshapedCIDRs` unset; src/shaper/unshaped.ts
 * does the kernel side). They are exactly
 * - every Node's pod CIDRs (this node's too), from the Node watch the route controller already runs
 *   (routes.ts `onPodCidrs`): no second watch of the Nodes;
 * - the Service ranges: `spec.cidrs` of every ServiceCIDR (`networking.k8s.io/v1`, GA and served by
 *   default since Kubernetes 1.33), listed and watched here. A ServiceCIDR being deleted keeps its
 *   range until it is gone (its finalizer waits for the Services in it). Where the API server does
 *   not serve them (404: an older Kubernetes) the agent has no config key for the Service range:
 *   Service ranges are then unknown and traffic to ClusterIPs stays shaped, which it says once
 *   (list them in `unshapedCIDRs` to unshape them). Forbidden (403: the image updated, not the
 *   RBAC) is the same until the list succeeds: said once, asked again with backoff.
 *
 * Nothing is applied before both are known (the Nodes listed, the ServiceCIDRs listed or found
 * unserved): until then the kernel keeps what it had (the last agent's set; no flap on a restart).
 * Changes within `coalesceMs` of the first are one rewrite (a burst of Node events, the first
 * lists), one rewrite at a time, and only when the set (in the fewest CIDRs: mergeCidrs) differs
 * from the one applied. A rewrite that fails is tried again after `retryMs`.
 */
import type { KubernetesObject } from '@kubernetes/client-node';
import type { Logger } from '../../log.js';
import { moduleLogger } from '../../util/module-logger.js';
import { parseCidr, type Subnet } from '../../net/ip.js';
import { mergeCidrs } from '../../shaper/unshaped.js';
import { KubeApi, KubeApiError, ListWatchLoop, loadKubeConfig, type KubeClientOptions } from '../kube/watch.js';

export const SERVICE_CIDRS_PATH = '/apis/networking.k8s.io/v1/servicecidrs';
const COALESCE_MS = 200;
const RETRY_MS = 5_000;

/** A ServiceCIDR as far as its ranges go (networking.k8s.io/v1; client-node 1.4.0 has no type for it). */
export interface ServiceCidrObject extends KubernetesObject {
  spec?: { cidrs?: string[] };
}

export interface ClusterRangesOptions
  extends Pick<KubeClientOptions, 'logger' | 'kubeconfig' | 'kubeConfig' | 'retryMinMs' | 'retryMaxMs' | 'health'> {
  coalesceMs?: number;
  retryMs?: number;
}

/** What the ranges are now and where they came from (`kubenet status`, logs). */
export interface ClusterRangesState {
  /** The set applied last (merged); undefined before the first. */
  applied: string[] | undefined;
  podCidrs: number;
  serviceCidrs: string[];
  /** 'api': the ServiceCIDRs; 'unserved': the API server serves none (404); 'forbidden': not allowed to list them yet (403); undefined: not listed yet. */
  services: 'api' | 'unserved' | 'forbidden' | undefined;
}

/** The valid CIDRs of a ServiceCIDR's spec, canonical; an invalid one is left out (the API server validates them). */
export function serviceCidrsOf(obj: ServiceCidrObject): string[] {
  const out: string[] = [];
  for (const c of obj.spec?.cidrs ?? []) {
    try {
      out.push(parseCidr(c).cidr);
    } catch {
      // not a CIDR: nothing to unshape
    }
  }
  return out;
}

export class ClusterRanges {
  private readonly log: Logger;
  private readonly loop: ListWatchLoop<ServiceCidrObject>;
  private podCidrs: string[] | undefined;
  /** ServiceCIDR name → its CIDRs. */
  private readonly services = new Map<string, string[]>();
  private servicesFrom: ClusterRangesState['services'];
  private apply: ((cidrs: string[]) => Promise<void>) | undefined;
  private applied: string[] | undefined;
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private again = false;
  private stopped = false;
  /** Rewrites done and failed (tests, logs). */
  readonly counters = { rewrites: 0, failures: 0 };

  constructor(private readonly o: ClusterRangesOptions) {
    this.log = moduleLogger(o.logger, 'cluster-ranges');
    this.loop = new ListWatchLoop<ServiceCidrObject>({
      api: new KubeApi(loadKubeConfig(o)),
      log: this.log,
      path: SERVICE_CIDRS_PATH,
      fieldSelector: '',
      retry: o,
      onList: (items) => {
        this.services.clear();
        for (const s of items) if (s.metadata?.name) this.services.set(s.metadata.name, serviceCidrsOf(s));
        this.servicesFrom = 'api';
        this.changed();
      },
      onEvent: (type, s) => {
        const name = s.metadata?.name;
        if (!name) return;
        const before = this.services.get(name)?.join();
        if (type === 'DELETED') this.services.delete(name);
        else this.services.set(name, serviceCidrsOf(s));
        if (before !== this.services.get(name)?.join()) this.changed();
      },
      stopOn: (err) => {
        if (err instanceof KubeApiError && err.status === 403 && this.servicesFrom === undefined) {
          this.log.warn(
            { path: SERVICE_CIDRS_PATH },
            "not allowed to list ServiceCIDRs (the ClusterRole predates them: apply the manifest's RBAC): traffic from shaped pods to Services stays shaped until then",
          );
          this.servicesFrom = 'forbidden';
          this.changed();
        }
        if (!(err instanceof KubeApiError && err.status === 404)) return false;
        this.log.warn(
          { path: SERVICE_CIDRS_PATH },
          'the API server serves no ServiceCIDRs (networking.k8s.io/v1, Kubernetes 1.33+) and the agent has no config key for the Service range: traffic from shaped pods to Services stays shaped; list the Service range in unshapedCIDRs to unshape it',
        );
        this.servicesFrom = 'unserved';
        this.changed();
        return true;
      },
    });
  }

  /** Every Node's pod CIDRs, as the route controller's Node watch has them now (routes.ts onPodCidrs). */
  setPodCidrs(cidrs: string[]): void {
    const next = [...cidrs].sort();
    if (this.podCidrs?.join() === next.join()) return;
    this.podCidrs = next;
    this.changed();
  }

  /** Starts the ServiceCIDR watch; `apply` gets each new set (the agent: PodNetwork.setUnshaped). */
  start(apply: (cidrs: string[]) => Promise<void>): void {
    this.apply = apply;
    this.loop.start();
    this.changed();
  }

  /** Stops the watch; a rewrite in flight finishes (the kernel keeps the set for the next agent). */
  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    await this.loop.stop();
    await this.running;
  }

  state(): ClusterRangesState {
    return {
      applied: this.applied && [...this.applied],
      podCidrs: this.podCidrs?.length ?? 0,
      serviceCidrs: [...new Set([...this.services.values()].flat())].sort(),
      services: this.servicesFrom,
    };
  }

  /** The set now (merged), or undefined while the Nodes or the ServiceCIDRs are not known yet. */
  wanted(): Subnet[] | undefined {
    if (this.podCidrs === undefined || this.servicesFrom === undefined) return undefined;
    return mergeCidrs([...this.podCidrs, ...[...this.services.values()].flat()].map((c) => parseCidr(c)));
  }

  private changed(delayMs = this.o.coalesceMs ?? COALESCE_MS): void {
    if (this.stopped || !this.apply || this.timer) return;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      void this.rewrite();
    }, delayMs);
    this.timer.unref();
  }

  /** Applies the set when it differs from the last applied; one at a time (asked meanwhile: once more after). */
  private async rewrite(): Promise<void> {
    if (this.running) {
      this.again = true;
      return;
    }
    this.running = this.rewriteOnce();
    await this.running;
    this.running = undefined;
    if (this.again) {
      this.again = false;
      this.changed(0);
    }
  }

  private async rewriteOnce(): Promise<void> {
    const want = this.wanted();
    if (!want || !this.apply || this.stopped) return;
    const cidrs = want.map((s) => s.cidr);
    if (this.applied?.join() === cidrs.join()) return;
    const t0 = performance.now();
    try {
      await this.apply(cidrs);
    } catch (err) {
      this.counters.failures++;
      this.log.error({ err, cidrs, retryInMs: this.o.retryMs ?? RETRY_MS }, 'rewriting the unshaped destinations failed; trying again');
      clearTimeout(this.timer);
      this.timer = undefined;
      this.changed(this.o.retryMs ?? RETRY_MS);
      return;
    }
    const before = this.applied;
    this.applied = cidrs;
    this.counters.rewrites++;
    const services = this.state().serviceCidrs;
    this.log.info(
      {
        cidrs,
        added: cidrs.filter((c) => !before?.includes(c)),
        removed: before?.filter((c) => !cidrs.includes(c)) ?? [],
        podCidrs: this.podCidrs?.length ?? 0,
        serviceCidrs: this.servicesFrom === 'api' ? services : `none (${this.servicesFrom})`,
        ms: +(performance.now() - t0).toFixed(1),
      },
      before === undefined
        ? "unshaped destinations: the cluster's pod CIDRs and Service ranges"
        : "unshaped destinations changed with the cluster's ranges",
    );
  }
}
