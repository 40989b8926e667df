/**
 * The node's bandwidth capacity on its Node (cluster mode), so kube-scheduler never places more
 * guarantees on the node than it has: the extended resources `kubenet.io/egress-bandwidth` and
 * `kubenet.io/ingress-bandwidth` (src/bandwidth/guarantees.ts; integers of Mbit/s) in the Node's
 * `status.capacity` and `status.allocatable`, set with a JSON merge patch of `nodes/NAME/status`
 * once the agent knows its capacity, and again whenever the Node watch (pod-cidr/node-watch.ts) shows
 * them missing or different. A direction without a capacity publishes nothing, and a value left
 * from before is removed (null in the merge patch).
 *
 * kubelet keeps extended resources it does not manage: its status setter only writes its own keys
 * into `status.capacity`, copies every capacity key into `allocatable` (minus its reservations, of
 * which these have none), and drops from `allocatable` only extended resources no longer in
 * `capacity` (pkg/kubelet/nodestatus MachineInfo). On re-registration of a recreated Node, or a
 * device-plugin state reset, kubelet zeroes extended capacities: the watch sees that and the agent
 * publishes again. RBAC: `patch` on `nodes/status`, nothing more.
 *
 * The same PATCH carries the annotations the agent keeps on its Node (`annotate`: with `routes:
 * auto`, its VXLAN port and VNI for the other nodes, route-plan.ts VXLAN_ANNOTATION): the status
 * subresource takes metadata too (the API server resets only `spec` on it), so RBAC stays `patch` on
 * `nodes/status`, not on whole Nodes.
 *
 * A failed PATCH is retried: while the API server is away when the agent's ApiHealth lets it (as
 * its watches), after another error answer with a jittered backoff (1 s doubling to 60 s); a Node
 * not registered yet is published when the watch brings it; a Forbidden answer is logged once with
 * the RBAC to apply.
 */
import type { V1Node } from '@kubernetes/client-node';
import { resolveCapacity, type NodeCapacity } from '../../bandwidth/capacity.js';
import { BANDWIDTH_RESOURCES, RESOURCE_UNIT_BITS } from '../../bandwidth/guarantees.js';
import { parseQuantity } from '../../bandwidth/quantity.js';
import type { Logger } from '../../log.js';
import { moduleLogger } from '../../util/module-logger.js';
import type { AgentConfig } from '../config/keys.js';
import { type ApiHealth, Backoff, isOutage } from '../kube/api-health.js';
import { healthOf, KubeApi, KubeApiError, loadKubeConfig, sharedAborter, type KubeClientOptions } from '../kube/watch.js';

export type { NodeCapacity };

/** The capacity the config gives (`egressCapacity`, `ingressCapacity`), else the link speed of `capacityDevice` (or the default route's device). */
export function resolveNodeCapacity(
  config: Pick<AgentConfig, 'egressCapacity' | 'ingressCapacity' | 'capacityDevice'>,
): Promise<NodeCapacity> {
  return resolveCapacity({
    ...(config.egressCapacity !== undefined ? { egress: config.egressCapacity } : {}),
    ...(config.ingressCapacity !== undefined ? { ingress: config.ingressCapacity } : {}),
    ...(config.capacityDevice !== undefined ? { uplink: config.capacityDevice } : {}),
  });
}

/** The capacity the config alone gives (the static mode: no link speed is read, so an unset config changes nothing there). */
export function configuredCapacity(config: Pick<AgentConfig, 'egressCapacity' | 'ingressCapacity'>): NodeCapacity | undefined {
  const { egressCapacity: egress, ingressCapacity: ingress } = config;
  if (egress === undefined && ingress === undefined) return undefined;
  return {
    ...(egress !== undefined ? { egress } : {}),
    ...(ingress !== undefined ? { ingress } : {}),
    source: { egress: egress !== undefined ? 'config' : 'unknown', ingress: ingress !== undefined ? 'config' : 'unknown' },
  };
}

/** resource name → integer Mbit/s as a string, or null: none that way (removed). */
export type PublishedCapacity = Record<string, string | null>;

const RETRY_MIN_MS = 1_000;
const RETRY_MAX_MS = 60_000;

/** What the Node should show for a capacity: each direction's resource, in whole Mbit/s (rounded down), or null. */
export function publishedCapacity(c: Pick<NodeCapacity, 'egress' | 'ingress'>): PublishedCapacity {
  const out: PublishedCapacity = {};
  for (const d of ['egress', 'ingress'] as const) {
    const v = c[d];
    out[BANDWIDTH_RESOURCES[d]] = v === undefined ? null : String(Math.floor(v / RESOURCE_UNIT_BITS));
  }
  return out;
}

/** The JSON merge patch of `nodes/NAME/status` that sets them. */
export function capacityPatch(p: PublishedCapacity): { status: { capacity: PublishedCapacity; allocatable: PublishedCapacity } } {
  return { status: { capacity: { ...p }, allocatable: { ...p } } };
}

/** Whether the Node's annotations show other values than `want` (null: absent). */
export function annotationsDiffer(node: V1Node, want: Record<string, string | null>): boolean {
  return Object.entries(want).some(([k, v]) => (node.metadata?.annotations?.[k] ?? null) !== v);
}

/** Whether the Node's status shows other values (compared as quantities: the API server writes 1000 as "1k"). */
export function capacityDiffers(node: V1Node, p: PublishedCapacity): boolean {
  const same = (have: string | undefined, want: string | null) =>
    want === null ? have === undefined : have !== undefined && parseQuantity(have) === BigInt(want);
  return Object.entries(p).some(
    ([name, want]) => !same(node.status?.capacity?.[name], want) || !same(node.status?.allocatable?.[name], want),
  );
}

export class NodeCapacityPublisher {
  private readonly log: Logger;
  private readonly api: KubeApi;
  private readonly path: string;
  private readonly aborter = sharedAborter(1);
  private wanted: PublishedCapacity | undefined;
  private annotations: Record<string, string | null> | undefined;
  /** The PATCH in flight; `again`: another is needed after it. */
  private running: Promise<void> | undefined;
  private again = false;
  private timer: NodeJS.Timeout | undefined;
  private readonly backoff = new Backoff(RETRY_MIN_MS, RETRY_MAX_MS);
  private readonly health: ApiHealth;
  private forbiddenLogged = false;

  constructor(opts: Pick<KubeClientOptions, 'nodeName' | 'logger' | 'kubeconfig' | 'kubeConfig' | 'health'>) {
    this.log = moduleLogger(opts.logger, 'node-capacity', { node: opts.nodeName });
    this.api = new KubeApi(loadKubeConfig(opts));
    this.health = healthOf(opts);
    this.path = `/api/v1/nodes/${encodeURIComponent(opts.nodeName)}/status`;
  }

  /** The capacity is known: publish it now (and keep it published). */
  publish(c: Pick<NodeCapacity, 'egress' | 'ingress'>): void {
    this.wanted = publishedCapacity(c);
    this.kick();
  }

  /**
   * Annotations to keep on the Node, published now and whenever the Node shows others; a null one is
   * removed once the Node is seen with it (no PATCH for an annotation that is not there).
   */
  annotate(a: Record<string, string | null>): void {
    this.annotations = { ...this.annotations, ...a };
    if (Object.values(a).some((v) => v !== null)) this.kick();
  }

  /** The Node as its watch saw it: published again when it shows other values. */
  nodeSeen(node: V1Node | undefined): void {
    if (!node) return;
    if ((this.wanted && capacityDiffers(node, this.wanted)) || (this.annotations && annotationsDiffer(node, this.annotations))) this.kick();
  }

  /** Resolves once the PATCH in flight (if any) is answered: tests. */
  async settled(): Promise<void> {
    while (this.running) await this.running;
  }

  /** Aborts a PATCH in flight and any retry. */
  async stop(): Promise<void> {
    this.aborter.abort();
    clearTimeout(this.timer);
    await this.settled();
  }

  private kick(): void {
    if (this.aborter.signal.aborted) return;
    if (this.running) {
      this.again = true;
      return;
    }
    clearTimeout(this.timer);
    this.timer = undefined;
    this.running = this.patch().finally(() => {
      this.running = undefined;
      if (this.again) {
        this.again = false;
        this.kick();
      }
    });
  }

  private async patch(): Promise<void> {
    const wanted = this.wanted;
    const annotations = this.annotations;
    if (!wanted && !annotations) return;
    try {
      const body = { ...(annotations ? { metadata: { annotations } } : {}), ...(wanted ? capacityPatch(wanted) : {}) };
      await this.api.mergePatch(this.path, body, this.aborter.signal);
      this.health.answered();
      this.backoff.reset();
      if (wanted) this.log.info({ resources: wanted }, 'node bandwidth capacity published on the Node');
      if (annotations) this.log.info({ annotations }, 'annotations published on the Node');
    } catch (err) {
      if (this.aborter.signal.aborted) return;
      if (isOutage(err)) {
        // The API server is away: tried again when the agent's ApiHealth lets it (its watches wait the same way).
        this.health.failed(err);
        this.log.debug({ err }, 'publishing the node bandwidth capacity failed: the API server is away; retrying when it answers');
        this.health.turn(this.aborter.signal).then(
          () => this.kick(),
          () => undefined,
        );
        return;
      }
      this.health.answered();
      if (err instanceof KubeApiError && err.status === 404) {
        this.log.info('the Node is not registered yet; its bandwidth capacity is published when it is');
        return; // the watch brings it
      }
      if (err instanceof KubeApiError && err.status === 403) {
        if (!this.forbiddenLogged)
          this.log.warn(
            { err },
            "the ClusterRole does not allow patching nodes/status: the scheduler does not see this node's bandwidth capacity (apply manifests/kubenet.yaml's RBAC)",
          );
        this.forbiddenLogged = true;
      }
      const delay = this.backoff.next();
      if (!(err instanceof KubeApiError && err.status === 403))
        this.log.warn({ err, retryInMs: delay }, 'publishing the node bandwidth capacity failed; retrying');
      this.timer = setTimeout(() => this.kick(), delay);
    }
  }
}
