/**
 * Routes between nodes (`routes: direct`): the agent lists + watches every Node and keeps, for each
 * other Node, a route from its pod CIDRs via its InternalIP (src/daemon/cluster/route-plan.ts decides which),
 * so pods on different nodes reach each other with no cloud route controller and no encapsulation,
 * as flannel's host-gw and kindnet do.
 *
 * Ours are the main-table routes with routing protocol {@link ROUTE_PROTOCOL} (`ip route show proto
 * 98`): only those are ever replaced or deleted, so an operator's, DHCP's or a cloud's routes stay
 * as they are. A change is applied as a diff against the kernel's routes of that protocol:
 * - a Node added, removed, or whose address or CIDR changed is reconciled on the next turn of the
 *   event loop (a burst of watch events, or the first list, is one reconcile);
 * - a restart does not flap: routes stay when the agent stops, and the first reconcile after the
 *   first full list changes only what differs; routes of Nodes deleted while the agent was down go
 *   then; nothing is removed before that list has arrived;
 * - every {@link RESYNC_MS} the kernel is read and compared again (a route someone deleted comes
 *   back; the uplink's address changed); in between, a change is diffed against what the last
 *   reconcile left (no dump of every route per change); failed changes are retried after
 *   {@link RETRY_MS}, with the kernel read again.
 * A Node that gets no route has a Warning Event `NodeRouteUnavailable` saying why, once per reason.
 *
 * `routes: auto` (a `tunnel` given) routes a Node on a connected subnet the same way, and every other
 * Node through this node's VXLAN device of the family (src/daemon/cluster/vxlan.ts): the device is made
 * from this node's own InternalIP (and remade when that moves), its neighbour and FDB entries follow
 * the plan as the routes do (listed again at each full reconcile, diffed against the last applied in
 * between), set before the routes that use them; a family without an InternalIP of this node has no
 * device (one left from before is deleted).
 * The same watch tells `onPodCidrs` every Node's pod CIDRs (this node's too) after the list and
 * each change of them: the cluster's pod ranges, which traffic to is unshaped (cluster-ranges.ts).
 */
import type { V1Node } from '@kubernetes/client-node';
import type { Logger } from '../../log.js';
import { moduleLogger } from '../../util/module-logger.js';
import {
  addrListAll,
  linkIndexByName,
  netnsLinkByName,
  routeDel,
  routeList,
  routeReplace,
  type RouteInfo,
  type RouteSpec,
} from '../../netlink/index.js';
import type { Removal } from '../../util/removal.js';
import type { EventRecorder } from '../kube/events.js';
import { KubeApi, ListWatchLoop, loadKubeConfig, type KubeClientOptions } from '../kube/watch.js';
import {
  diffRoutes,
  nodeRouteSource,
  planRoutes,
  sameRouteSource,
  type LocalAddress,
  type NodeRouteSource,
  type RoutePlan,
  type RouteWay,
} from './route-plan.js';
import { DEFAULT_VXLAN_NAMES, VxlanTunnels, type TunnelOptions } from './vxlan.js';
import { execa } from 'execa';

/** Our routing protocol number (iproute2 shows it as "proto 98"); unassigned in /etc/iproute2/rt_protos. */
export const ROUTE_PROTOCOL = 98;
export const REASON_NO_ROUTE = 'NodeRouteUnavailable';
/** A tunnel peer's agent publishes another VXLAN port or VNI: reached with its own, but the cluster's nodes should agree. */
export const REASON_VXLAN_DIFFERS = 'VXLANSettingsDiffer';
const RESYNC_MS = 30_000;
const RETRY_MS = 1_000;

/** The kernel side, replaceable in tests. Every call may wait on the kernel (its RTNL lock): none blocks the event loop. */
export interface RouteKernel {
  list(): Promise<RouteInfo[]>;
  replace(spec: RouteSpec): Promise<void>;
  del(dst: string): Promise<void>;
  /** This node's addresses that may carry a route (not the pod bridge's, not host-scoped ones). */
  localAddresses(): Promise<LocalAddress[]>;
}

/**
 * The RouteKernel over netlink, in this process's namespace, or in the one mounted at `netns` (tests
 * that run a node per namespace in one process). `exclude`: links whose addresses carry no route to
 * other nodes (the VXLAN devices: their addresses, if any, are not underlay).
 */
export function netlinkRouteKernel(bridgeName: string, o: { netns?: string; exclude?: string[] } = {}): RouteKernel {
  const index = async (name: string) => (o.netns === undefined ? linkIndexByName(name) : (await netnsLinkByName(o.netns, name))?.index);
  return {
    list: () => routeList(ROUTE_PROTOCOL, o.netns),
    replace: (spec) => routeReplace(spec, o.netns),
    del: (dst) => routeDel(dst, ROUTE_PROTOCOL, o.netns),
    localAddresses: async () => {
      const skip = new Set(await Promise.all([bridgeName, ...(o.exclude ?? [])].map(index)));
      // Universe scope only: loopback's (host) and IPv6 link-local (link) addresses route nothing.
      return (await addrListAll(o.netns))
        .filter((a) => a.scope === 0 && !skip.has(a.ifindex))
        .map((a) => ({ ifindex: a.ifindex, cidr: a.cidr }));
    },
  };
}

export interface NodeRoutesOptions
  extends Pick<KubeClientOptions, 'nodeName' | 'logger' | 'kubeconfig' | 'kubeConfig' | 'retryMinMs' | 'retryMaxMs' | 'health'> {
  events: EventRecorder;
  kernel: RouteKernel;
  resyncMs?: number;
  /** Every Node's pod CIDRs (canonical, each once), after the first list and each change of a Node's. */
  onPodCidrs?: (cidrs: string[]) => void;
  /** `routes: auto`: Nodes on no connected subnet are reached through VXLAN. */
  tunnel?: TunnelOptions;
}

export interface RouteStatus {
  /** Routes held now (after the last reconcile): `way` direct (via the Node's InternalIP) or tunnel (VXLAN to `underlay`, its InternalIP). */
  routes: Array<{ node: string; dst: string; via: string; way?: RouteWay; underlay?: string; mtu?: number }>;
  /** Nodes without a route and why. */
  problems: Record<string, string>;
}

export class NodeRoutes {
  private readonly log: Logger;
  private readonly loop: ListWatchLoop<V1Node>;
  private readonly nodes = new Map<string, NodeRouteSource>();
  private listed = false;
  private scheduled: NodeJS.Immediate | undefined;
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;
  /** Node → the reason last reported in an Event (reported again only when it changes); the same for VXLAN settings. */
  private readonly reported = new Map<string, string>();
  private readonly reportedVxlan = new Map<string, string>();
  private held: RouteStatus = { routes: [], problems: {} };
  /**
   * Our routes as the kernel held them after the last reconcile; undefined until it has been read
   * (and after a failure). Between full reconciles (start, every RESYNC_MS, after a failure) a
   * change is diffed against this instead of a dump of every route: one Node's change costs O(Nodes)
   * in JS and one netlink request, not a dump of a thousand routes.
   */
  private applied: Map<string, RouteInfo> | undefined;
  private lastFull = 0;
  /** The reconcile running now, and whether another was asked for meanwhile (it runs after). */
  private reconciling: Promise<void> | undefined;
  private again = false;
  /** Reconciles done, routes replaced and removed, failures: for metrics and the bench. */
  readonly counters = { reconciles: 0, replaced: 0, removed: 0, failed: 0 };
  /** `routes: auto`: the VXLAN devices and their entries. */
  private readonly tunnels: VxlanTunnels | undefined;

  constructor(private readonly o: NodeRoutesOptions) {
    this.log = moduleLogger(o.logger, 'routes');
    this.tunnels = o.tunnel ? new VxlanTunnels(o.tunnel, this.log) : undefined;
    this.loop = new ListWatchLoop<V1Node>({
      api: new KubeApi(loadKubeConfig(o)),
      log: this.log,
      path: '/api/v1/nodes',
      fieldSelector: '',
      retry: o,
      onList: (items) => {
        this.nodes.clear();
        for (const n of items) {
          const s = nodeRouteSource(n);
          if (s) this.nodes.set(s.name, s);
        }
        this.listed = true;
        this.schedule();
        this.podCidrsChanged();
      },
      onEvent: (type, n) => {
        const s = nodeRouteSource(n);
        if (!s) return;
        const before = this.nodes.get(s.name);
        if (type === 'DELETED') {
          this.reported.delete(s.name);
          this.reportedVxlan.delete(s.name);
          if (!this.nodes.delete(s.name)) return;
          this.schedule();
        } else {
          if (sameRouteSource(before, s)) return; // a heartbeat
          this.nodes.set(s.name, s);
          this.schedule();
        }
        if (before?.podCIDRs.join() !== (type === 'DELETED' ? undefined : s.podCIDRs.join())) this.podCidrsChanged();
      },
    });
  }

  start(): void {
    this.loop.start();
    this.log.info(
      { protocol: ROUTE_PROTOCOL, ...(this.o.tunnel ? { vni: this.o.tunnel.vni, port: this.o.tunnel.port } : {}) },
      this.o.tunnel
        ? 'routing the pod CIDRs of the other Nodes via their InternalIPs where on a connected subnet, through VXLAN elsewhere'
        : 'routing the pod CIDRs of the other Nodes via their InternalIPs',
    );
  }

  /** Stops watching; the routes stay (the next agent takes them over without a flap). */
  async stop(): Promise<void> {
    this.stopped = true;
    clearImmediate(this.scheduled);
    clearTimeout(this.timer);
    await this.reconciling;
    await this.loop.stop();
  }

  status(): RouteStatus {
    return this.held;
  }

  /** Routes held now, per way (for /metrics). */
  wayCounts(): Record<RouteWay, number> {
    const n = { direct: 0, tunnel: 0 };
    for (const r of this.held.routes) n[r.way ?? 'direct']++;
    return n;
  }

  private podCidrsChanged(): void {
    if (!this.o.onPodCidrs || !this.listed) return;
    this.o.onPodCidrs([...new Set([...this.nodes.values()].flatMap((n) => n.podCIDRs))]);
  }

  private schedule(delayMs = 0): void {
    if (this.stopped) return;
    if (delayMs === 0) {
      if (this.scheduled) return;
      this.scheduled = setImmediate(() => {
        this.scheduled = undefined;
        void this.reconcile();
      });
      return;
    }
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.schedule(), delayMs);
    this.timer.unref();
  }

  /**
   * Brings the kernel's routes of our protocol to the plan; never before the first full list. One
   * at a time: asked while one runs, another runs after it.
   */
  async reconcile(): Promise<void> {
    if (this.reconciling) {
      this.again = true;
      return this.reconciling;
    }
    this.reconciling = this.reconcileOnce();
    try {
      await this.reconciling;
    } finally {
      this.reconciling = undefined;
    }
    if (this.again) {
      this.again = false;
      this.schedule();
    }
  }

  private async reconcileOnce(): Promise<void> {
    if (!this.listed || this.stopped) return;
    const t0 = performance.now();
    const resync = this.o.resyncMs ?? RESYNC_MS;
    const full = this.applied === undefined || t0 - this.lastFull >= resync;
    let failed = 0;
    let current: RouteInfo[];
    let plan: RoutePlan;
    try {
      const local = await this.o.kernel.localAddresses();
      const t = this.tunnels ? await this.tunnels.ensure(this.nodes.get(this.o.nodeName), local, full) : undefined;
      failed += t?.failed ?? 0;
      const vxlan = this.o.tunnel ? { port: this.o.tunnel.port, vni: this.o.tunnel.vni } : undefined;
      plan = planRoutes(this.o.nodeName, this.nodes.values(), local, t ? { tunnels: t.devices, tunnelProblems: t.problems, vxlan } : {});
      if (this.tunnels) failed += await this.tunnels.apply(plan, full);
      current = full || !this.applied ? await this.o.kernel.list() : [...this.applied.values()];
      if (full) this.lastFull = t0;
    } catch (err) {
      this.log.error({ err }, "reading this node's addresses or routes failed; trying again");
      this.applied = undefined;
      this.counters.failed++;
      this.schedule(RETRY_MS);
      return;
    }
    const { replace, remove } = diffRoutes(current, plan.routes);
    const applied = new Map(current.map((r) => [r.dst, r]));
    for (const r of remove) {
      try {
        await this.o.kernel.del(r.dst);
        applied.delete(r.dst);
        this.counters.removed++;
        this.log.info({ dst: r.dst, via: r.gateway }, 'route removed (no Node has this pod CIDR any more, or its route changed)');
      } catch (err) {
        failed++;
        this.log.warn({ err, dst: r.dst }, 'removing a route failed; trying again');
      }
    }
    for (const w of replace) {
      try {
        const extra = { ...(w.mtu !== undefined ? { mtu: w.mtu } : {}), ...(w.onlink ? { onlink: true } : {}) };
        await this.o.kernel.replace({ dst: w.dst, gateway: w.gateway, ifindex: w.ifindex, protocol: ROUTE_PROTOCOL, ...extra });
        applied.set(w.dst, { family: w.family, dst: w.dst, gateway: w.gateway, ifindex: w.ifindex, protocol: ROUTE_PROTOCOL, ...extra });
        this.counters.replaced++;
        this.log.info(
          { node: w.node, dst: w.dst, via: w.gateway, ifindex: w.ifindex, way: w.way, underlay: w.underlay, ...extra },
          "route to a Node's pod CIDR set",
        );
      } catch (err) {
        failed++;
        this.log.warn({ err, node: w.node, dst: w.dst, via: w.gateway }, 'setting a route failed; trying again');
      }
    }
    this.report(
      plan.problems,
      this.reported,
      REASON_NO_ROUTE,
      "no route to a Node's pod CIDR",
      (why) => `no route to this node's pods: ${why}`,
    );
    this.report(
      plan.mismatched,
      this.reportedVxlan,
      REASON_VXLAN_DIFFERS,
      'a Node reached through VXLAN with its own port and VNI',
      (why) => `${why}: reached with its own through VXLAN; set the same vxlanPort and vxlanVNI on every node`,
    );
    this.held = {
      routes: plan.routes.map((r) => ({
        node: r.node,
        dst: r.dst,
        via: r.gateway,
        way: r.way,
        underlay: r.underlay,
        ...(r.mtu !== undefined ? { mtu: r.mtu } : {}),
      })),
      problems: Object.fromEntries(plan.problems),
    };
    // After a failure the kernel is read again next time: what it holds is not known for sure.
    this.applied = failed > 0 ? undefined : applied;
    this.counters.reconciles++;
    this.counters.failed += failed;
    if (replace.length + remove.length > 0 || failed > 0) {
      this.log.debug(
        {
          replaced: replace.length,
          removed: remove.length,
          failed,
          routes: plan.routes.length,
          full,
          ms: +(performance.now() - t0).toFixed(2),
        },
        'routes reconciled',
      );
    }
    if (failed > 0) this.schedule(RETRY_MS);
    else if (full) this.schedule(resync);
  }

  /** A Warning Event on each Node with a problem, once per message; forgotten once the Node has none. */
  private report(
    problems: Map<string, string>,
    reported: Map<string, string>,
    reason: string,
    logMsg: string,
    event: (why: string) => string,
  ): void {
    for (const [node, why] of problems) {
      if (reported.get(node) === why) continue;
      reported.set(node, why);
      this.log.warn({ node, why }, logMsg);
      this.o.events.record({ kind: 'Node', name: node }, 'Warning', reason, `kubenet on ${this.o.nodeName}: ${event(why)}`);
    }
    for (const node of [...reported.keys()]) {
      if (!problems.has(node)) reported.delete(node);
    }
  }
}

/** Deletes every main-table route of {@link ROUTE_PROTOCOL} (`kubenet uninstall`, the agent stopped): no one else's. */
export async function removeNodeRoutes(r: Removal): Promise<void> {
  for (const route of await routeList(ROUTE_PROTOCOL)) {
    const via = route.gateway ? ` via ${route.gateway}` : '';
    await r.remove(`route ${route.dst}${via} proto ${ROUTE_PROTOCOL}`, () => routeDel(route.dst, ROUTE_PROTOCOL));
  }
  // The tunnels of `routes: auto` (vxlan.ts); their neighbour and FDB entries go with them.
  for (const name of Object.values(DEFAULT_VXLAN_NAMES)) {
    if (linkIndexByName(name) === undefined) continue;
    await r.remove(`link ${name}`, () => execa('ip', ['link', 'del', name]));
  }
}
