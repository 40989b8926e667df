import { accessSync, constants as fsConstants } from 'node:fs';
import { stat } from 'node:fs/promises';
import { isIPv4 } from 'node:net';
import { performance } from 'node:perf_hooks';
import { CniRuntime } from '../cni/runtime.js';
import type { CniResult, NetConf, NetConfList, RuntimeConf } from '../cni/types.js';
import { AggregateKubenetError, ConfigError, KubenetError, NetlinkError, NotReadyError, UnknownPodError } from '../errors.js';
import { silentLogger, type Logger } from '../log.js';
import * as nl from '../netlink/index.js';
import { cidrContains, parsePodCidrs, type PodSubnet } from './cidr.js';
import { checkHostPorts, ensureBridgeNetfilter, ensureMasquerade } from './host-setup.js';
import type { HairpinMode, Host, KubenetOptions, NetworkPlugin, PodNetworkStatus } from './types.js';
import { KeyedMutex } from '../util/keyed-mutex.js';
import { bandwidthFromAnnotations, isUnshaped, type BandwidthLimits } from '../shaper/quantity.js';
import { Shaper } from '../shaper/tc.js';

export const NETWORK_NAME = 'kubenet';
export const LOOPBACK_NETWORK_NAME = 'cni-loopback';
const CNI_VERSION = '1.0.0';
const DEFAULT_MTU = 1460;
const DEFAULT_TXQLEN = 1000;
const POD_IFNAME = 'eth0';
/** errno of a missing link (NetlinkError.errno). */
const ENODEV = 19;
const REQUIRED_PLUGINS = ['bridge', 'host-local', 'loopback'] as const;

/** What the plugin remembers about a pod it set up. */
export interface PodRecord {
  namespace: string;
  name: string;
  id: string;
  netns: string;
  ips: string[];
  /** Host side of the pod's veth (a port of the bridge), from the CNI result. */
  hostVeth: string | undefined;
  /** Bandwidth limits from the pod's annotations; empty when unshaped. */
  limits: BandwidthLimits;
  /** Host ports (CNI runtimeConfig.portMappings), set up by the reference portmap plugin. */
  portMappings?: PortMapping[];
}

/** One host port, as CNI runtimeConfig.portMappings carries it. */
export interface PortMapping {
  hostPort: number;
  containerPort: number;
  protocol: 'tcp' | 'udp' | 'sctp';
  hostIP?: string;
}

export interface AttachRequest {
  namespace: string;
  name: string;
  id: string;
  netns: string;
  /** Limits from the runtime (CNI runtimeConfig.bandwidth); when absent, the pod's annotations. */
  limits?: BandwidthLimits;
  /** Host ports; when any, the reference portmap plugin is chained after bridge for this pod. */
  portMappings?: PortMapping[];
}

type State = { phase: 'uninitialized' } | { phase: 'waiting-for-pod-cidr' } | { phase: 'ready'; subnets: PodSubnet[]; bridgeConf: NetConf };

export class KubenetPlugin implements NetworkPlugin {
  readonly bridgeName: string;
  readonly cniBinDirs: string[];
  readonly ipamDataDir: string;
  readonly cniCacheDir: string;
  private readonly log: Logger;
  private readonly cni: CniRuntime;
  private readonly shaper: Shaper;
  private readonly podLocks = new KeyedMutex();
  private readonly pods = new Map<string, PodRecord>();
  private state: State = { phase: 'uninitialized' };
  private host: Host | undefined;
  private hairpinMode: HairpinMode = 'hairpin-veth';
  private mtu = DEFAULT_MTU;
  private readonly manageLoopback: boolean;
  private readonly loopbackConf: NetConf = { cniVersion: CNI_VERSION, name: LOOPBACK_NETWORK_NAME, type: 'loopback' };

  constructor(private readonly opts: KubenetOptions = {}) {
    this.bridgeName = opts.bridgeName ?? 'cbr0';
    this.cniBinDirs = opts.cniBinDirs ?? ['/opt/cni/bin', '/usr/lib/cni'];
    this.ipamDataDir = opts.ipamDataDir ?? '/var/lib/cni/networks';
    this.manageLoopback = opts.manageLoopback ?? true;
    this.cniCacheDir = opts.cniCacheDir ?? '/var/lib/cni';
    this.log = (opts.logger ?? silentLogger()).child({ module: 'kubenet' });
    if (opts.mtu !== undefined && (!Number.isInteger(opts.mtu) || opts.mtu < 68 || opts.mtu > 65535)) {
      throw new ConfigError(`mtu must be an integer between 68 and 65535, got ${opts.mtu}`);
    }
    if (!/^[A-Za-z0-9_.-]{1,15}$/.test(this.bridgeName)) {
      throw new ConfigError(`bridge name ${JSON.stringify(this.bridgeName)} is not a valid interface name (1-15 of [A-Za-z0-9_.-])`);
    }
    this.cni = new CniRuntime({
      binDirs: this.cniBinDirs,
      cacheDir: this.cniCacheDir,
      logger: this.log,
      ...(opts.cniTimeoutMs !== undefined ? { timeoutMs: opts.cniTimeoutMs } : {}),
    });
    this.shaper = new Shaper({
      logger: this.log,
      ...(opts.ifbName !== undefined ? { ifbName: opts.ifbName } : {}),
      ...(opts.shaperStateDir !== undefined ? { stateDir: opts.shaperStateDir } : {}),
    });
  }

  name(): 'kubenet' {
    return 'kubenet';
  }

  capabilities(): Set<'shaping'> {
    return new Set(['shaping']);
  }

  /** Stops the shaper's tc session; the plugin may be used again afterwards (it restarts lazily). */
  close(): void {
    this.shaper.close();
  }

  async init(host: Host, hairpinMode: HairpinMode = 'hairpin-veth', nonMasqueradeCIDR = '10.0.0.0/8'): Promise<void> {
    if (!['promiscuous-bridge', 'hairpin-veth', 'none'].includes(hairpinMode)) {
      throw new ConfigError(`hairpin mode must be promiscuous-bridge, hairpin-veth or none, got ${JSON.stringify(hairpinMode)}`);
    }
    const nonMasq = parsePodCidrs(nonMasqueradeCIDR);
    if (nonMasq.length !== 1 || nonMasq[0]?.family !== 4) {
      throw new ConfigError(`nonMasqueradeCIDR must be one IPv4 CIDR, got ${JSON.stringify(nonMasqueradeCIDR)}`);
    }
    this.host = host;
    this.hairpinMode = hairpinMode;
    if (this.opts.mtu !== undefined) {
      this.mtu = this.opts.mtu;
    } else {
      const detected = nl.minHostMtu();
      this.mtu = detected ?? DEFAULT_MTU;
      this.log.info({ mtu: this.mtu, detected: detected !== undefined }, 'bridge MTU from host links');
    }
    await ensureBridgeNetfilter(this.log);
    await ensureMasquerade(nonMasqueradeCIDR, this.log);
    // The shared egress ifb, and recovery of what an earlier process shaped.
    await this.shaper.init();
    if (this.state.phase === 'uninitialized') this.state = { phase: 'waiting-for-pod-cidr' };
    this.log.info({ hairpinMode, nonMasqueradeCIDR, bridge: this.bridgeName, mtu: this.mtu }, 'kubenet initialized');
  }

  async event(name: 'pod-cidr-change', details: { 'pod-cidr': string }): Promise<void> {
    if (name !== 'pod-cidr-change') {
      this.log.debug({ event: name }, 'ignoring unknown event');
      return;
    }
    if (this.state.phase === 'uninitialized') throw new NotReadyError('kubenet: event() before init()');
    // Parse first: a malformed value is refused and the old configuration stays in force.
    const subnets = parsePodCidrs(details?.['pod-cidr']);
    const cidrs = subnets.map((s) => s.cidr).join(',');
    if (this.state.phase === 'ready' && this.state.subnets.map((s) => s.cidr).join(',') === cidrs) return;
    this.removeStaleBridgeAddresses(subnets);
    this.state = { phase: 'ready', subnets, bridgeConf: this.buildBridgeConf(subnets) };
    this.log.info({ podCIDR: cidrs }, 'pod CIDR set; CNI config generated');
  }

  /** The bridge + host-local config for the pod subnets, as a typed object. */
  buildBridgeConf(subnets: PodSubnet[]): NetConf {
    return {
      cniVersion: CNI_VERSION,
      name: NETWORK_NAME,
      type: 'bridge',
      bridge: this.bridgeName,
      mtu: this.mtu,
      addIf: POD_IFNAME,
      isGateway: true,
      ipMasq: false,
      hairpinMode: this.hairpinMode === 'hairpin-veth',
      ipam: {
        type: 'host-local',
        ranges: subnets.map((s) => [{ subnet: s.cidr }]),
        routes: subnets.map((s) => ({ dst: s.family === 4 ? '0.0.0.0/0' : '::/0' })),
        dataDir: this.ipamDataDir,
      },
    };
  }

  /** The bridge config in force, or undefined while no pod CIDR is known. */
  currentConfig(): NetConf | undefined {
    return this.state.phase === 'ready' ? this.state.bridgeConf : undefined;
  }

  status(): void {
    if (this.state.phase !== 'ready') {
      throw new NotReadyError(
        this.state.phase === 'uninitialized' ? 'kubenet: not initialized' : 'kubenet: no pod CIDR yet (waiting for a pod-cidr-change event)',
      );
    }
    const missing = REQUIRED_PLUGINS.filter((p) => !this.cniBinDirs.some((dir) => isExecutable(`${dir}/${p}`)));
    if (missing.length > 0) {
      throw new NotReadyError(`kubenet: CNI plugin(s) ${missing.join(', ')} not found in ${this.cniBinDirs.join(', ')}`);
    }
  }

  async setUpPod(namespace: string, name: string, id: string): Promise<void> {
    await this.podLocks.run(podKey(namespace, name), () => this.doSetUp(namespace, name, id, {}));
  }

  tearDownPod(namespace: string, name: string, id: string): Promise<void> {
    return this.podLocks.run(podKey(namespace, name), () => this.doTearDown(namespace, name, id, undefined));
  }

  /**
   * Set up as a CNI runtime asks (the node agent): the netns comes with the call, and limits given
   * here (runtimeConfig.bandwidth) take the place of the pod's annotations. Returns the CNI result.
   */
  attach(req: AttachRequest): Promise<{ record: PodRecord; result: CniResult }> {
    return this.podLocks.run(podKey(req.namespace, req.name), () =>
      this.doSetUp(req.namespace, req.name, req.id, {
        netns: req.netns,
        ...(req.limits ? { limits: req.limits } : {}),
        ...(req.portMappings?.length ? { portMappings: req.portMappings } : {}),
      }),
    );
  }

  /** Teardown as a CNI runtime asks; an empty or vanished netns is fine. */
  detach(req: { namespace: string; name: string; id: string; netns: string }): Promise<void> {
    return this.podLocks.run(podKey(req.namespace, req.name), () => this.doTearDown(req.namespace, req.name, req.id, req.netns));
  }

  /**
   * CNI CHECK as a runtime asks: the reference bridge plugin checks the pod's veth, addresses and
   * routes against the result cached at ADD; host ports must have their DNAT rules, and a shaped
   * pod must still be known to the shaper.
   */
  check(req: { namespace: string; name: string; id: string; netns: string }): Promise<void> {
    return this.podLocks.run(podKey(req.namespace, req.name), async () => {
      const known = this.pods.get(req.id);
      if (!known) throw new UnknownPodError(`container ${req.id} is not attached to ${NETWORK_NAME}`);
      const bridgeConf = this.currentConfig();
      if (!bridgeConf) throw new NotReadyError(`kubenet: cannot check pod ${req.namespace}/${req.name}: no pod CIDR yet`);
      await requireNetns(req.netns, `pod ${req.namespace}/${req.name}`);
      await this.cni.checkNetwork(bridgeConf, runtimeConf(req.namespace, req.name, req.id, req.netns));
      // portmap's own CHECK (plugins 1.1.1) fails for every IPv4-only pod, looking for ip6tables
      // chains it never made (containernetworking/plugins#819): check its DNAT rules here instead.
      if (known.portMappings?.length) await checkHostPorts(known.ips, known.portMappings);
      if (!isUnshaped(known.limits) && !this.shaper.list().some((s) => s.id === req.id)) {
        throw new KubenetError(`pod ${req.namespace}/${req.name}: bandwidth limits are recorded but not installed`);
      }
    });
  }

  /**
   * Resolves once the kernel has finished every pod veth deletion this process started (teardown
   * returns before that: see unplugVeth). For a tidy shutdown, and for benchmarks that must not let
   * one call's background kernel work land on the next.
   */
  settled(): Promise<void> {
    return nl.linkDeletionsSettled();
  }

  /** Re-adopts a pod an earlier process set up (from the agent's state dir), so status and DEL know it. */
  restorePod(record: PodRecord): void {
    this.pods.set(record.id, record);
  }

  async getPodNetworkStatus(namespace: string, name: string, id: string): Promise<PodNetworkStatus> {
    const known = this.pods.get(id);
    if (known && known.ips.length > 0) return toStatus(known.ips);
    const host = this.requireHost();
    const netns = host.getNetNS(id);
    const addrs = nl.netnsAddrList(netns, POD_IFNAME).filter((a) => a.scope === 0);
    if (addrs.length === 0) throw new KubenetError(`pod ${namespace}/${name}: no address on ${POD_IFNAME} in ${netns}`);
    return toStatus(addrs.map((a) => a.ip));
  }

  /** Pods this process set up and has not torn down. */
  listPods(): PodRecord[] {
    return [...this.pods.values()];
  }

  private async doSetUp(
    namespace: string,
    name: string,
    id: string,
    given: { netns?: string; limits?: BandwidthLimits; portMappings?: PortMapping[] },
  ): Promise<{ record: PodRecord; result: CniResult }> {
    const started = performance.now();
    const log = this.log.child({ pod: `${namespace}/${name}`, id: shortId(id) });
    if (this.state.phase !== 'ready') {
      throw new NotReadyError(`kubenet: cannot set up pod ${namespace}/${name}: no pod CIDR yet`);
    }
    const bridgeConf = this.state.bridgeConf;
    const host = this.requireHost();
    // Parse the annotations before touching the kernel: an invalid one leaks nothing.
    const limits = given.limits ?? bandwidthFromAnnotations(host.getPodByName(namespace, name)?.annotations);
    const netns = given.netns ?? host.getNetNS(id);
    await requireNetns(netns, `pod ${namespace}/${name}`);
    const rt = runtimeConf(namespace, name, id, netns);

    if (this.manageLoopback) await this.cni.addNetwork(this.loopbackConf, { ...rt, ifName: 'lo' });
    // Host ports: the reference portmap plugin chained after bridge, for this pod only (the others
    // pay no extra exec). The cache keeps the list and the mappings, so DEL finds both.
    const portMappings = given.portMappings ?? [];
    const ports = portMappings.length > 0 ? { list: withPortmap(bridgeConf), rt: { ...rt, capabilityArgs: { portMappings } } } : undefined;
    const delNetwork = () => (ports ? this.cni.delNetworkList(ports.list, ports.rt) : this.cni.delNetwork(bridgeConf, rt));
    let result: CniResult;
    try {
      result = ports ? await this.cni.addNetworkList(ports.list, ports.rt) : await this.cni.addNetwork(bridgeConf, rt);
    } catch (err) {
      // A failed ADD may still have reserved an address or made a veth: DEL cleans both.
      await this.rollback(delNetwork, rt, log);
      throw err;
    }
    try {
      const record = this.recordFromResult(namespace, name, id, netns, result, limits);
      if (portMappings.length > 0) record.portMappings = portMappings;
      this.tuneBridge(log);
      await this.applyShaping(record);
      this.pods.set(id, record);
      log.info({ ips: record.ips, hostVeth: record.hostVeth, limits, ms: round(performance.now() - started) }, 'pod set up');
      return { record, result };
    } catch (err) {
      this.pods.delete(id);
      await this.shaper.remove(id).catch((e: unknown) => log.error({ err: e }, 'rollback of shaping failed'));
      await this.rollback(delNetwork, rt, log);
      throw err;
    }
  }

  /** Shapes the pod as its annotations say; a pod set up again without limits loses any old ones. */
  private async applyShaping(record: PodRecord): Promise<void> {
    if (isUnshaped(record.limits)) {
      await this.shaper.remove(record.id);
      return;
    }
    if (!record.hostVeth) throw new KubenetError(`pod ${record.namespace}/${record.name}: bridge plugin returned no host veth to shape`);
    await this.shaper.ensure({ id: record.id, hostVeth: record.hostVeth, ips: record.ips, limits: record.limits });
  }

  private recordFromResult(namespace: string, name: string, id: string, netns: string, result: CniResult, limits: BandwidthLimits): PodRecord {
    const ips = result.ips.map((i) => i.address.split('/')[0] ?? '').filter((ip) => ip !== '');
    if (ips.length === 0) throw new KubenetError(`pod ${namespace}/${name}: bridge plugin returned no IP`);
    const hostVeth = result.interfaces.find((i) => !i.sandbox && i.name !== this.bridgeName)?.name;
    return { namespace, name, id, netns, ips, hostVeth, limits };
  }

  /** Bridge settings kubenet keeps: MTU, non-zero txqueuelen, promiscuous mode for hairpin. */
  private tuneBridge(log: Logger): void {
    const link = nl.linkByName(this.bridgeName);
    if (link.mtu !== this.mtu) {
      nl.linkSetMtu(this.bridgeName, this.mtu);
      log.info({ from: link.mtu, to: this.mtu }, 'set bridge MTU');
    }
    if (link.txQLen <= 0) {
      nl.linkSetTxQLen(this.bridgeName, DEFAULT_TXQLEN);
      log.info({ txqueuelen: DEFAULT_TXQLEN }, 'set bridge txqueuelen');
    }
    if (this.hairpinMode === 'promiscuous-bridge' && !link.promisc) {
      nl.setPromiscOn(this.bridgeName);
      log.info('bridge set to promiscuous mode for hairpin traffic');
    }
  }

  private async rollback(delNetwork: () => Promise<void>, rt: RuntimeConf, log: Logger): Promise<void> {
    const errors = await runAll([
      delNetwork,
      async () => {
        if (this.manageLoopback) await this.cni.delNetwork(this.loopbackConf, { ...rt, ifName: 'lo' });
      },
    ]);
    for (const err of errors) log.error({ err }, 'rollback of failed setup left something behind');
  }

  private async doTearDown(namespace: string, name: string, id: string, givenNetns: string | undefined): Promise<void> {
    const started = performance.now();
    const log = this.log.child({ pod: `${namespace}/${name}`, id: shortId(id) });
    const known = this.pods.get(id);
    let netns = givenNetns ?? known?.netns ?? '';
    if (!netns && givenNetns === undefined && this.host) {
      try {
        netns = this.host.getNetNS(id);
      } catch (err) {
        log.debug({ err }, 'no netns for pod; tearing down without it');
      }
    }
    // A vanished netns is not an error on teardown: the plugins still release the address.
    if (netns && !(await exists(netns))) netns = '';
    const rt = runtimeConf(namespace, name, id, netns);
    const bridgeConf = this.currentConfig();
    const errors = await runAll([
      // Shaping first: its filters reference the veth the bridge DEL removes.
      () => this.shaper.remove(id),
      // Then the veth, both ends at once, without waiting for the kernel to free it. A pod this
      // process did not set up is found through the cached result the bridge plugin returned.
      async () => {
        const hostVeth = known?.hostVeth ?? (await this.cachedHostVeth(rt));
        if (hostVeth) await this.unplugVeth(hostVeth, log);
      },
      async () => {
        // The cached config and result make DEL exact even after a pod-CIDR change or restart. The
        // bridge plugin releases the address, and deletes the pod's eth0 unless it is gone already.
        const done = await this.cni.delFromCache(NETWORK_NAME, rt);
        if (done || !bridgeConf) return;
        // Without a cache entry, the record still knows a pod's host ports: portmap removes their rules.
        const portMappings = known?.portMappings ?? [];
        if (portMappings.length > 0) await this.cni.delNetworkList(withPortmap(bridgeConf), { ...rt, capabilityArgs: { portMappings } });
        else await this.cni.delNetwork(bridgeConf, rt);
      },
      async () => {
        const done = await this.cni.delFromCache(LOOPBACK_NETWORK_NAME, { ...rt, ifName: 'lo' });
        // Without a cache entry, loopback ran only if this plugin manages it.
        if (!done && this.manageLoopback) await this.cni.delNetwork(this.loopbackConf, { ...rt, ifName: 'lo' });
      },
    ]);
    if (errors.length > 0) {
      for (const err of errors) log.error({ err }, 'teardown step failed');
      throw new AggregateKubenetError(`kubenet: teardown of pod ${namespace}/${name} failed`, errors);
    }
    this.pods.delete(id);
    log.info({ ms: round(performance.now() - started), known: known !== undefined }, 'pod torn down');
  }

  /**
   * Deletes a pod's veth ahead of the bridge plugin's DEL and returns once the link is gone, not once
   * the kernel has freed it (nl.linkDelete): that wait (15–40 ms, an RCU barrier) is most of what a
   * DEL would otherwise cost, and it now runs on a worker thread. The bridge DEL then finds no eth0
   * in the pod and only releases the address. Only a veth enslaved to this plugin's bridge is
   * touched, since a name from the record could by now belong to another link; anything else is left
   * to the bridge plugin.
   */
  private async unplugVeth(hostVeth: string, log: Logger): Promise<void> {
    try {
      let link: nl.LinkInfo;
      let bridge: nl.LinkInfo;
      try {
        link = nl.linkByName(hostVeth);
        bridge = nl.linkByName(this.bridgeName);
      } catch (err) {
        if (err instanceof NetlinkError && err.errno === ENODEV) return;
        throw err;
      }
      if (link.type !== 'veth' || link.master !== bridge.index) {
        log.warn({ hostVeth, type: link.type, master: link.master }, 'recorded host veth is not a veth on the bridge; leaving it to the bridge plugin');
        return;
      }
      const { goneMs, finished } = await nl.linkDelete(link.index);
      finished.catch((err: unknown) => log.error({ err, hostVeth }, 'the kernel failed to finish deleting the pod veth'));
      log.debug({ hostVeth, goneMs: round(goneMs) }, 'pod veth deleted');
    } catch (err) {
      // Only a shortcut: the bridge plugin's DEL, next, deletes the pod's eth0 (and so the veth) itself.
      log.warn({ err, hostVeth }, 'could not delete the pod veth ahead of the bridge plugin; leaving it to the bridge plugin');
    }
  }

  /** The host end of the pod's veth in the bridge plugin's cached result, if there is one. */
  private async cachedHostVeth(rt: RuntimeConf): Promise<string | undefined> {
    const cached = await this.cni.getCachedResult(NETWORK_NAME, rt).catch(() => undefined);
    return cached?.interfaces.find((i) => !i.sandbox && i.name !== this.bridgeName)?.name;
  }

  /** Removes addresses on the bridge outside the new pod subnets (left from an earlier CIDR). */
  private removeStaleBridgeAddresses(subnets: PodSubnet[]): void {
    let addrs: nl.AddrInfo[];
    try {
      addrs = nl.addrList(this.bridgeName);
    } catch (err) {
      if (err instanceof NetlinkError && err.errno === ENODEV) return; // no bridge yet
      throw err;
    }
    for (const a of addrs) {
      if (a.family === 6 && a.ip.toLowerCase().startsWith('fe80:')) continue;
      if (subnets.some((s) => cidrContains(s, a.ip))) continue;
      nl.addrDel(this.bridgeName, a.cidr);
      this.log.info({ bridge: this.bridgeName, address: a.cidr }, 'removed stale bridge address');
    }
  }

  private requireHost(): Host {
    if (!this.host) throw new NotReadyError('kubenet: not initialized (call init first)');
    return this.host;
  }
}

/** The pod network as a list: bridge, then the reference portmap plugin for host ports. */
function withPortmap(bridgeConf: NetConf): NetConfList {
  const { cniVersion, name, ...bridge } = bridgeConf;
  return { cniVersion, name, plugins: [bridge, { type: 'portmap', capabilities: { portMappings: true }, snat: true }] };
}

function podKey(namespace: string, name: string): string {
  return `${namespace}/${name}`;
}

/** The runtime config kubelet's kubenet passed: pod identity in CNI_ARGS, as libcni callers do. */
function runtimeConf(namespace: string, name: string, containerId: string, netns: string): RuntimeConf {
  return {
    containerId,
    netns,
    ifName: POD_IFNAME,
    args: [
      ['IgnoreUnknown', '1'],
      ['K8S_POD_NAMESPACE', namespace],
      ['K8S_POD_NAME', name],
      ['K8S_POD_INFRA_CONTAINER_ID', containerId],
    ],
  };
}

function toStatus(ips: string[]): PodNetworkStatus {
  const primary = ips.find((ip) => isIPv4(ip)) ?? ips[0];
  if (primary === undefined) throw new KubenetError('pod has no IP');
  return { ip: primary, ips };
}

async function requireNetns(path: string, what: string): Promise<void> {
  if (!path) throw new ConfigError(`${what}: no network namespace path`);
  if (!(await exists(path))) throw new ConfigError(`${what}: network namespace ${path} does not exist`);
}

async function exists(path: string): Promise<boolean> {
  return stat(path).then(
    () => true,
    () => false,
  );
}

function isExecutable(path: string): boolean {
  try {
    accessSync(path, fsConstants.X_OK);
    return true;
  } catch {
    return false;
  }
}

/** Runs every step, even after failures, and returns the failures. */
async function runAll(steps: Array<() => Promise<unknown>>): Promise<unknown[]> {
  const errors: unknown[] = [];
  for (const step of steps) {
    try {
      await step();
    } catch (err) {
      errors.push(err);
    }
  }
  return errors;
}

function shortId(id: string): string {
  return id.slice(0, 12);
}

function round(ms: number): number {
  return Math.round(ms * 100) / 100;
}
