/**
 * The node agent's lifecycle: one pod network core, a pod-CIDR source, the HTTP API on a unix
 * socket, the CNI binary and conflist for container runtimes (installed once the pod CIDR is known),
 * metrics, live re-shaping (the pod watch in cluster mode, `kubenet shape` always) with its Events,
 * and the measured rates of `kubenet status` / `top`. The pod records are the core's
 * (src/pod/records/record.ts): restarts keep every pod. The node's bandwidth capacity (resolved before the
 * agent is made: the shaper is built with it) is logged at start, published on the Node in cluster
 * mode (node-capacity.ts), and shown with the guarantees committed out of it (status, metrics).
 *
 * In dhcp mode it also runs the reference DHCP lease daemon (dhcp-daemon.ts) before the core
 * starts, installs the CNI config at once (addresses come from the LAN, not the pod CIDR), and has
 * the core acquire every known pod's lease again after each start of the daemon, retrying those
 * that fail (no server answering) with backoff.
 */
import { existsSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { ConfigError } from '../errors.js';
import { join } from 'node:path';
import type { Logger } from '../log.js';
import {
  IPAM_SHIM_TYPE,
  isUnshaped,
  PodNetwork,
  REQUIRED_PLUGINS,
  type LimitSources,
  type PodRecord,
  type PodTraffic,
} from '../pod/index.js';
import { findPlugin } from '../cni/exec.js';
import { attemptTimeoutSec, DhcpDaemon } from './host/dhcp-daemon.js';
import { CniHandler, codeOf } from './cni/handler.js';
import type { PodLookup } from './cluster/pod-lookup.js';
import { checkInstallConfig, CniInstaller, ipamShimDir } from './cni/install.js';
import { dhcpSocketPath, unshapedCidrsOf, type AgentConfig } from './config/config.js';
import { shardsFor } from '../shaper/tc-layout.js';
import { AgentApi } from './http/socket-api.js';
import { noEvents, type EventRecorder } from './kube/events.js';
import { LiveShaping, parseShapeRequest } from './shaping/live-shaping.js';
import { watchEventLoopDelay } from './loop-delay.js';
import { runStopSteps } from './stop-steps.js';
import { AgentMetrics, treesOf, type TreesView } from './http/metrics.js';
import type { MetricsAuthorizer } from './http/metrics-auth.js';
import { MetricsHttp } from './http/metrics-port.js';
import { Coalesced } from '../util/coalesce.js';
import { packageVersion } from '../util/package-root.js';
import type { NamespaceLookup } from './cluster/namespace-lookup.js';
import type { PodCidrSource } from './pod-cidr/source.js';
import { rateKey, RateTracker, type PodRate } from './shaping/rates.js';
import { describeCapacity, type NodeCapacity } from '../bandwidth/capacity.js';
import { bandwidthReport, type BandwidthReport } from './cluster/pod-guarantees.js';
import type { NodeRoutes, RouteStatus } from './cluster/routes.js';
import type { ClusterRanges } from './cluster/cluster-ranges.js';
import { CNI_ERR_INVALID_CONFIG, CNI_ERR_UNKNOWN_CONTAINER, ipamSocketPath, MAX_SOCKET_PATH_BYTES } from './protocol.js';

export interface StatusReport {
  podCIDR: string | undefined;
  bridge: string;
  ready: boolean;
  /** Destinations whose traffic with shaped pods is not shaped (config unshapedCIDRs, or the cluster's ranges as applied; absent while those are not known yet). */
  unshapedCIDRs?: string[];
  /** With `routes: direct`: the routes to other Nodes' pod CIDRs, and the Nodes that have none. */
  routes?: RouteStatus;
  /** The node's bandwidth capacity, the guarantees committed out of it and what is free (bits/s). */
  bandwidth?: BandwidthReport;
  /** With a capacity: each shard's share of it now, and whether the pods that asked for nothing are in the trees. */
  trees?: TreesView;
  pods: Array<{
    namespace: string;
    name: string;
    id: string;
    phase: PodRecord['phase'];
    ips: string[];
    hostVeth: string | undefined;
    limits: PodRecord['limits'];
    /** Where each shaped direction's limit came from: the pod's own, or its namespace's default or ceiling. */
    limitSources?: LimitSources;
    portMappings?: PodRecord['portMappings'];
    /** Measured over the last `rate.seconds`: bits/s (and drops/s) to the pod (ingress) and from it (egress). */
    rate?: PodRate;
  }>;
}

const READOPT_RETRY_MS = 5_000;
const READOPT_RETRY_MAX_MS = 120_000;
/** kubenet-ts 0.1.0's shaper state under the state dir, adopted into the pod records once (and then gone). */
export const legacyShaperStateDir = (stateDir: string): string => join(stateDir, 'shaper');
/** Rates in `kubenet status` are taken over this many seconds unless asked otherwise. */
export const DEFAULT_RATE_WINDOW_S = 5;

export interface AgentOptions {
  /** CNI calls in flight get this long to finish on stop. Default 10 s. */
  shutdownGraceMs?: number;
  /** Where Events on pods go (cluster mode: events.ts KubeEventRecorder). Default: nowhere. */
  events?: EventRecorder;
  /** Routes to the other Nodes' pod CIDRs (`routes: direct`, cluster mode). */
  routes?: NodeRoutes;
  /** The namespaces' bandwidth policy (cluster mode: namespace-lookup.ts). */
  namespaces?: NamespaceLookup;
  /** The cluster's pod and Service ranges, the unshaped destinations (`routes: direct`, unshapedCIDRs unset). */
  ranges?: ClusterRanges;
  /** The node's bandwidth capacity (src/bandwidth/capacity.ts resolveCapacity); unset: unknown, guarantees off. */
  capacity?: NodeCapacity;
  /** Cluster mode: publishes the capacity on the Node's status (node-capacity.ts NodeCapacityPublisher). */
  nodeCapacity?: { publish(c: NodeCapacity): void; stop(): Promise<void> };
  /** `metricsAuth: kubernetes`: who may read /metrics on the TCP port (metrics-auth.ts KubeMetricsAuth). */
  metricsAuth?: MetricsAuthorizer;
}

export class Agent {
  readonly network: PodNetwork;
  private readonly handler: CniHandler;
  private readonly api: AgentApi;
  /** /metrics and /healthz over TCP (config metricsAddress); undefined when "off". */
  private readonly metricsHttp: MetricsHttp | undefined;
  private readonly metrics = new AgentMetrics(
    () => ({
      node: this.config.nodeName,
      version: packageVersion(),
      podCIDR: this.network.podCidr(),
      bridge: this.config.bridgeName,
      ipam: this.config.ipam,
      routes: this.config.routes,
    }),
    () => this.routes?.wayCounts(),
    () => this.network.bandwidthShares(),
    () => ({ failures: this.live.failures, retrying: this.live.retrying, queued: this.live.queued }),
  );
  /** The pods' counters for /metrics and when they were read: at most once per metricsMaxAge while no pod's record changes, a read in flight shared. */
  private readonly scraped: Coalesced<{ traffic: PodTraffic[]; at: number }>;
  readonly live: LiveShaping;
  private readonly rates: RateTracker;
  private readonly events: EventRecorder;
  private readonly routes: NodeRoutes | undefined;
  private readonly namespaces: NamespaceLookup | undefined;
  private readonly ranges: ClusterRanges | undefined;
  private readonly capacity: NodeCapacity | undefined;
  private readonly nodeCapacity: AgentOptions['nodeCapacity'];
  private readonly installer: CniInstaller;
  private readonly dhcpDaemon: DhcpDaemon | undefined;
  private readoptTimer: NodeJS.Timeout | undefined;
  private readoptDelayMs = READOPT_RETRY_MS;
  private stopped = false;
  private stopLoopWatch: (() => void) | undefined;

  constructor(
    private readonly config: AgentConfig,
    private readonly source: PodCidrSource,
    private readonly log: Logger,
    private readonly pods?: PodLookup,
    opts: AgentOptions = {},
  ) {
    const ipam = ipamShimOf(config, log);
    // Fixed by the config, or (undefined) the cluster's ranges once known: the node keeps what it has until then.
    const unshaped = unshapedCidrsOf(config);
    this.scraped = new Coalesced(async () => ({ traffic: await this.network.traffic(), at: Date.now() }), config.metricsMaxAge * 1000);
    this.network = new PodNetwork({
      ...(ipam.prefetchSocket !== undefined ? { ipamPrefetchSocket: ipam.prefetchSocket } : {}),
      bridgeName: config.bridgeName,
      pluginBinDirs: ipam.binDir !== undefined ? [...config.pluginBinDirs, ipam.binDir] : config.pluginBinDirs,
      ipamDataDir: config.ipamDataDir,
      stateDir: config.stateDir,
      ifbName: config.ifbName,
      ifbShards: shardsFor(config.ifbShards, availableParallelism()),
      ...(unshaped ? { unshapedCIDRs: unshaped } : {}),
      ...(opts.capacity
        ? {
            capacity: {
              ...(opts.capacity.egress !== undefined ? { egress: opts.capacity.egress } : {}),
              ...(opts.capacity.ingress !== undefined ? { ingress: opts.capacity.ingress } : {}),
            },
          }
        : {}),
      // kubenet-ts 0.1.0's shaper state, adopted into the pod records once.
      legacyShaperStateDir: legacyShaperStateDir(config.stateDir),
      // The runtime calling us runs loopback for lo itself.
      manageLoopback: false,
      legacyCniCacheDir: config.cniCacheDir,
      ...dedupResync(),
      logger: log,
      ...(config.mtu !== undefined ? { mtu: config.mtu } : {}),
      ...(config.ipam === 'dhcp' && config.uplink !== undefined
        ? {
            ipam: {
              mode: 'dhcp' as const,
              uplink: config.uplink,
              daemonSocket: dhcpSocketPath(config),
              timeoutMs: config.dhcpTimeout * 1000,
            },
          }
        : {}),
    });
    if (config.ipam === 'dhcp') {
      this.dhcpDaemon = new DhcpDaemon({
        binary: findPlugin('dhcp', config.pluginBinDirs),
        socket: dhcpSocketPath(config),
        attemptTimeoutSec: attemptTimeoutSec(config.dhcpTimeout),
        log,
        onRestart: () => this.readoptLeases(),
      });
    }
    this.installer = new CniInstaller(config, log);
    this.events = opts.events ?? noEvents;
    this.routes = opts.routes;
    this.namespaces = opts.namespaces;
    this.ranges = opts.ranges;
    this.capacity = opts.capacity;
    this.nodeCapacity = opts.nodeCapacity;
    const capacity = () => this.capacity;
    this.live = new LiveShaping(this.network, this.events, pods, log, this.namespaces, capacity);
    this.rates = new RateTracker(() => this.network.traffic({ links: true }), log);
    this.handler = new CniHandler(this.network, pods, () => this.notReadyReason(), log, this.live, this.namespaces, capacity);
    const metrics = async () => {
      const { traffic, at } = await this.scraped.get(this.network.store.generation());
      return this.metrics.exposition(this.network.list(), this.network.vethDeletionsInFlight(), traffic, at);
    };
    if (config.metricsAddress !== 'off') {
      this.metricsHttp = new MetricsHttp(
        { metrics, ready: () => this.ready() },
        {
          address: config.metricsAddress,
          log,
          nodeName: config.nodeName,
          ...(opts.metricsAuth ? { auth: opts.metricsAuth } : {}),
          ...(config.metricsTLSCertFile !== undefined && config.metricsTLSKeyFile !== undefined
            ? { tls: { certFile: config.metricsTLSCertFile, keyFile: config.metricsTLSKeyFile } }
            : {}),
        },
      );
    }
    this.api = new AgentApi(
      {
        cni: (req) => this.handler.handle(req),
        health: () => this.ready(),
        metrics,
        status: (windowS) => this.statusReport(windowS),
        limits: (namespace, name, body) => this.limits(namespace, name, body),
        ipam: (req) => this.handler.ipam(req),
        answered: (answer, seconds) => {
          this.metrics.observe(answer.command, seconds, answer.status === 200 ? undefined : (answer.code ?? 999));
          if (answer.status !== 200) this.log.warn({ command: answer.command, body: answer.body }, 'CNI call failed');
          this.metrics.update(this.network.list(), this.network.vethDeletionsInFlight());
        },
      },
      {
        socket: config.socket,
        log,
        ...(ipam.prefetchSocket !== undefined ? { ipamSocket: ipam.prefetchSocket } : {}),
        ...(opts.shutdownGraceMs !== undefined ? { shutdownGraceMs: opts.shutdownGraceMs } : {}),
      },
    );
  }

  async start(): Promise<void> {
    checkInstallConfig(this.config);
    this.stopLoopWatch ??= watchEventLoopDelay((s) => this.metrics.loopDelay.observe(s));
    // The core's reconcile may release leases: the daemon answers before it runs.
    await this.dhcpDaemon?.start();
    try {
      await this.network.init(this.config.hairpinMode, this.config.nonMasqueradeCIDR);
    } catch (err) {
      // A refused uplink, say: no daemon stays behind an agent that did not start.
      await this.dhcpDaemon?.stop();
      throw err;
    }
    const pods = this.network.list();
    if (pods.length > 0) this.log.info({ pods: pods.length }, 'pods set up before this start are known');
    this.metrics.update(pods, 0);
    this.metrics.setCapacity(this.capacity);
    if (this.capacity) {
      this.log.info({ capacity: this.capacity }, `node bandwidth capacity: ${describeCapacity(this.capacity)}`);
      this.nodeCapacity?.publish(this.capacity);
    }
    if (this.dhcpDaemon) {
      // Ready without a pod CIDR: pods take their addresses from the LAN.
      this.installer.install();
      this.readoptLeases();
    }
    this.live.start();
    this.routes?.start();
    this.ranges?.start((cidrs) => this.network.setUnshaped(cidrs));
    await this.namespaces?.start();
    await this.pods?.start?.();
    await this.metricsHttp?.listen();
    await this.api.listen();
    await this.source.start((cidr) => this.onPodCidr(cidr));
  }

  private async onPodCidr(cidr: string): Promise<void> {
    try {
      await this.network.setPodCidr(cidr);
      this.installer.install();
    } catch (err) {
      this.log.error({ err, podCIDR: cidr }, 'pod CIDR refused or CNI config not installed; keeping the previous state');
    }
  }

  /**
   * Has the core acquire the lease of every known pod again (the daemon keeps none across its
   * restarts), in the background; pods whose lease could not be had are tried again with backoff.
   */
  private readoptLeases(): void {
    clearTimeout(this.readoptTimer);
    this.readoptTimer = undefined;
    if (this.stopped) return;
    void this.network.readoptLeases().then(
      ({ failed }) => {
        if (failed.length === 0) {
          this.readoptDelayMs = READOPT_RETRY_MS;
          return;
        }
        if (this.stopped) return;
        this.log.warn(
          { pods: failed.length, retryInMs: this.readoptDelayMs },
          'some DHCP leases could not be acquired again; trying again',
        );
        this.readoptTimer = setTimeout(() => this.readoptLeases(), this.readoptDelayMs);
        this.readoptDelayMs = Math.min(this.readoptDelayMs * 2, READOPT_RETRY_MAX_MS);
      },
      (err: unknown) => this.log.error({ err }, 'acquiring the DHCP leases again failed'),
    );
  }

  /** The TCP metrics port's URL once listening (`http://127.0.0.1:PORT`); undefined with metricsAddress "off". */
  metricsUrl(): string | undefined {
    return this.metricsHttp?.url();
  }

  /** CNI calls being handled right now. */
  callsInFlight(): number {
    return this.api.callsInFlight();
  }

  private notReadyReason(): string | undefined {
    if (this.network.phase !== 'ready') return 'kubenet: no pod CIDR yet';
    // The runtime runs loopback itself; dhcp mode needs the dhcp plugin instead of host-local.
    const needed = REQUIRED_PLUGINS.filter((p) => p !== 'loopback').map((p) => (p === 'host-local' && this.dhcpDaemon ? 'dhcp' : p));
    const missing = needed.filter((p) => {
      try {
        findPlugin(p, this.config.pluginBinDirs);
        return false;
      } catch {
        return true;
      }
    });
    if (missing.length > 0) return `kubenet: CNI plugin(s) ${missing.join(', ')} missing from ${this.config.pluginBinDirs.join(', ')}`;
    return this.installer.notInstalled();
  }

  ready(): { ok: boolean; reason?: string } {
    const reason = this.notReadyReason();
    return reason ? { ok: false, reason } : { ok: true };
  }

  /** What the agent knows, with each ready pod's rates measured over the last `windowS` seconds. */
  async statusReport(windowS = DEFAULT_RATE_WINDOW_S): Promise<StatusReport> {
    const pods = this.network.list();
    const rates = pods.some((p) => p.phase === 'ready') ? await this.rates.rates(windowS) : new Map<string, PodRate>();
    const unshaped = this.ranges ? this.ranges.state().applied : unshapedCidrsOf(this.config);
    return {
      podCIDR: this.network.podCidr(),
      bridge: this.config.bridgeName,
      ...(unshaped ? { unshapedCIDRs: unshaped } : {}),
      ready: this.ready().ok,
      ...(this.routes ? { routes: this.routes.status() } : {}),
      bandwidth: bandwidthReport(this.capacity, pods),
      ...treesOf(this.network.bandwidthShares()),
      pods: this.network.list().map((p) => {
        const rate = rates.get(rateKey(p.containerId, p.ifName));
        return {
          namespace: p.namespace,
          name: p.name,
          id: p.containerId,
          phase: p.phase,
          ips: p.ips,
          hostVeth: p.hostVeth,
          limits: p.limits,
          ...(isUnshaped(p.limits) ? {} : { limitSources: sourcesOf(p) }),
          ...(p.portMappings.length > 0 ? { portMappings: p.portMappings } : {}),
          ...(rate ? { rate } : {}),
        };
      }),
    };
  }

  /** POST /v1/pods/NS/NAME/limits (`kubenet shape`). */
  private async limits(namespace: string, name: string, body: unknown): Promise<{ status: number; body: unknown }> {
    try {
      const pods = await this.live.shape(namespace, name, parseShapeRequest(body));
      return { status: 200, body: { pods } };
    } catch (err) {
      const code = codeOf(err);
      const status = code === CNI_ERR_UNKNOWN_CONTAINER ? 404 : code === CNI_ERR_INVALID_CONFIG ? 400 : 500;
      if (status === 500) this.log.error({ err, pod: `${namespace}/${name}` }, 'changing the limits failed');
      return { status, body: { error: err instanceof Error ? err.message : String(err) } };
    }
  }

  /** Stops taking calls, lets calls in flight finish (bounded), then releases the node resources it holds open; within 25 s in all. */
  async stop(): Promise<void> {
    this.stopped = true;
    this.stopLoopWatch?.();
    clearTimeout(this.readoptTimer);
    await runStopSteps(this.log, [
      { name: 'the pod CIDR source', run: () => this.source.stop() },
      { name: 'the node capacity publisher', run: () => this.nodeCapacity?.stop() },
      { name: 'the node routes', run: () => this.routes?.stop() },
      { name: 'the cluster ranges watch', run: () => this.ranges?.stop() },
      { name: 'the metrics port', run: () => this.metricsHttp?.close() },
      // CNI calls in flight get their own 10 s grace inside.
      { name: 'the agent socket', run: () => this.api.close(), boundMs: 12_000 },
      { name: 'the pod watch', run: () => this.pods?.stop?.() },
      { name: 'the namespace watch', run: () => this.namespaces?.stop() },
      { name: 'live shaping', run: () => this.live.stop() },
      { name: 'the rate tracker', run: () => this.rates.stop() },
      // Events still being posted get a moment (they report what this agent did), then are cut.
      { name: 'events in flight', run: () => this.events.flush(), boundMs: 2_000, cutIsExpected: true },
      { name: 'the event recorder', run: () => this.events.stop() },
      // Leases are not released: the pods keep their addresses, the next agent acquires them again.
      { name: 'the DHCP daemon', run: () => this.dhcpDaemon?.stop() },
      // Veths of pods deleted just before: let the kernel finish them (tens of ms), never for long.
      { name: 'pod links being removed', run: () => this.network.settled(), boundMs: 5_000, cutIsExpected: true },
      { name: 'the netlink socket', run: () => this.network.close() },
    ]);
    this.log.info('agent stopped');
  }
}

/** Where each shaped direction's limit came from; a record without sources (no namespace policy, older agents): the pod's own. */
export function sourcesOf(r: PodRecord): LimitSources {
  const out: LimitSources = {};
  for (const d of ['ingress', 'egress'] as const) if (r.limits[d] !== undefined) out[d] = r.limitSources?.[d] ?? 'pod';
  return out;
}

/**
 * The IPAM shim in host-local mode (src/pod/network.ts ipamPrefetchSocket): its directory, added
 * after the plugin dirs whenever it is built (the DEL of a pod set up through it runs it, whatever
 * this start prefetches), and the socket it asks when the agent prefetches: unless the socket path
 * would not fit a unix socket address, or KUBENET_IPAM_PREFETCH=off (the bridge plugin then execs
 * host-local itself, as kubenet-ts 0.2.0 did; for comparison).
 */
export function ipamShimOf(config: AgentConfig, log: Logger): { binDir?: string; prefetchSocket?: string } {
  if (config.ipam !== 'host-local') return {};
  const binDir = ipamShimDir();
  if (!existsSync(join(binDir, IPAM_SHIM_TYPE))) {
    log.warn(
      { shim: join(binDir, IPAM_SHIM_TYPE) },
      'the IPAM shim is not built: the bridge plugin runs host-local itself (~1 ms more per pod ADD)',
    );
    return {};
  }
  if (process.env.KUBENET_IPAM_PREFETCH === 'off') return { binDir };
  const socket = ipamSocketPath(config.socket);
  if (Buffer.byteLength(socket) > MAX_SOCKET_PATH_BYTES) {
    log.warn({ socket }, 'the IPAM socket path would be too long: the bridge plugin runs host-local itself (~1 ms more per pod ADD)');
    return { binDir };
  }
  return { binDir, prefetchSocket: socket };
}

/** KUBENET_DEDUP_RESYNC_MS: the dedup rules' check period (tests; default PodNetwork's 30 s). */
function dedupResync(): { dedupResyncMs?: number } {
  const v = process.env.KUBENET_DEDUP_RESYNC_MS;
  if (v === undefined || v === '') return {};
  const ms = Number(v);
  if (!Number.isInteger(ms) || ms < 100)
    throw new ConfigError(`KUBENET_DEDUP_RESYNC_MS must be an integer number of milliseconds >= 100, not ${JSON.stringify(v)}`);
  return { dedupResyncMs: ms };
}
