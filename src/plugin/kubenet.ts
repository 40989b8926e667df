/**
 * `KubenetPlugin`: kubelet's network-plugin interface (init, event, setUpPod, tearDownPod,
 * getPodNetworkStatus, status) over the pod network core (src/pod/network.ts). It adds what kubelet
 * supplied to kubenet: the pod's netns and annotations from the `Host`, and the pod's loopback.
 */
import { accessSync, constants as fsConstants } from 'node:fs';
import type { NetConf } from '../cni/types.js';
import { ConfigError, KubenetError, NotReadyError } from '../errors.js';
import { silentLogger, type Logger } from '../log.js';
import { moduleLogger } from '../util/module-logger.js';
import { checkIfName } from '../net/ifname.js';
import {
  bandwidthFromAnnotations,
  HAIRPIN_MODES,
  NETWORK_NAME,
  POD_IFNAME,
  PodNetwork,
  REQUIRED_PLUGINS,
  sameLimits,
  type PodRecord,
} from '../pod/index.js';
import { familyOf, parsePodCidrs } from '../net/ip.js';
import type { HairpinMode, Host, KubenetOptions, NetworkPlugin, PodNetworkStatus } from './types.js';

export { NETWORK_NAME };

export class KubenetPlugin implements NetworkPlugin {
  readonly bridgeName: string;
  readonly cniBinDirs: string[];
  readonly ipamDataDir: string;
  readonly stateDir: string;
  /** The pod network core (records, attach/detach, GC). */
  readonly network: PodNetwork;
  private readonly log: Logger;
  private host: Host | undefined;
  private initialized = false;

  constructor(opts: KubenetOptions = {}) {
    this.bridgeName = opts.bridgeName ?? 'cbr0';
    this.cniBinDirs = opts.cniBinDirs ?? ['/opt/cni/bin', '/usr/lib/cni'];
    this.ipamDataDir = opts.ipamDataDir ?? '/var/lib/cni/networks';
    this.stateDir = opts.stateDir ?? '/var/lib/kubenet';
    this.log = moduleLogger(opts.logger ?? silentLogger(), 'kubenet');
    if (opts.mtu !== undefined && (!Number.isInteger(opts.mtu) || opts.mtu < 68 || opts.mtu > 65535)) {
      throw new ConfigError(`mtu must be an integer between 68 and 65535, got ${opts.mtu}`);
    }
    checkIfName(this.bridgeName, 'bridge name');
    if (!Array.isArray(this.cniBinDirs) || this.cniBinDirs.length === 0)
      throw new ConfigError('cniBinDirs must name at least one directory');
    this.network = new PodNetwork({
      bridgeName: this.bridgeName,
      pluginBinDirs: this.cniBinDirs,
      ipamDataDir: this.ipamDataDir,
      stateDir: this.stateDir,
      manageLoopback: opts.manageLoopback ?? true,
      logger: opts.logger ?? silentLogger(),
      // 0.1.0 kept its CNI cache here (libcni's default); read once to upgrade.
      legacyCniCacheDir: opts.cniCacheDir ?? '/var/lib/cni',
      ...(opts.ifbName !== undefined ? { ifbName: opts.ifbName } : {}),
      // 0.1.0's shaper kept one file per pod here; adopted into the records once.
      legacyShaperStateDir: opts.shaperStateDir ?? '/run/kubenet/shaper',
      ...(opts.mtu !== undefined ? { mtu: opts.mtu } : {}),
      ...(opts.cniTimeoutMs !== undefined ? { cniTimeoutMs: opts.cniTimeoutMs } : {}),
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
    this.network.close();
  }

  async init(host: Host, hairpinMode: HairpinMode = 'hairpin-veth', nonMasqueradeCIDR = '10.0.0.0/8'): Promise<void> {
    if (!(HAIRPIN_MODES as readonly string[]).includes(hairpinMode)) {
      throw new ConfigError(`hairpin mode must be promiscuous-bridge, hairpin-veth or none, got ${JSON.stringify(hairpinMode)}`);
    }
    const nonMasq = parsePodCidrs(nonMasqueradeCIDR);
    if (nonMasq.length !== 1 || nonMasq[0]?.family !== 4) {
      throw new ConfigError(`nonMasqueradeCIDR must be one IPv4 CIDR, got ${JSON.stringify(nonMasqueradeCIDR)}`);
    }
    this.host = host;
    await this.network.init(hairpinMode, nonMasqueradeCIDR);
    this.initialized = true;
    this.log.info({ hairpinMode, nonMasqueradeCIDR, bridge: this.bridgeName }, 'kubenet initialized');
  }

  async event(name: 'pod-cidr-change', details: { 'pod-cidr': string }): Promise<void> {
    if (name !== 'pod-cidr-change') {
      this.log.debug({ event: name }, 'ignoring unknown event');
      return;
    }
    if (!this.initialized) throw new NotReadyError('kubenet: event() before init()');
    await this.network.setPodCidr(details?.['pod-cidr']);
  }

  /** The bridge config in force, or undefined while no pod CIDR is known. */
  currentConfig(): NetConf | undefined {
    return this.network.currentConfig();
  }

  status(): void {
    if (!this.initialized) throw new NotReadyError('kubenet: not initialized');
    if (this.network.phase !== 'ready') throw new NotReadyError('kubenet: no pod CIDR yet (waiting for a pod-cidr-change event)');
    this.network.status(() => REQUIRED_PLUGINS.filter((p) => !this.cniBinDirs.some((dir) => isExecutable(`${dir}/${p}`))));
  }

  /**
   * Sets the pod up, shaped as its annotations say (parsed first: an invalid one changes nothing).
   * Set up again with the same sandbox and other annotations, the running pod gets the new limits.
   */
  async setUpPod(namespace: string, name: string, id: string): Promise<void> {
    const host = this.requireHost();
    if (!this.initialized || this.network.phase !== 'ready')
      throw new NotReadyError(`kubenet: cannot set up pod ${namespace}/${name}: no pod CIDR yet`);
    const limits = bandwidthFromAnnotations(host.getPodByName(namespace, name)?.annotations);
    const netns = host.getNetNS(id);
    const existing = this.network.get(id);
    if (existing?.phase === 'ready' && existing.netns === netns && !sameLimits(existing.limits, limits)) {
      await this.network.reshape(id, POD_IFNAME, limits);
      return;
    }
    await this.network.attach({ containerId: id, ifName: POD_IFNAME, namespace, name, netns, limits, portMappings: [] });
  }

  async tearDownPod(_namespace: string, _name: string, id: string): Promise<void> {
    await this.network.detach({ containerId: id, ifName: POD_IFNAME });
  }

  async getPodNetworkStatus(namespace: string, name: string, id: string): Promise<PodNetworkStatus> {
    const known = this.network.get(id);
    if (known?.phase === 'ready' && known.ips.length > 0) return toStatus(known.ips);
    const netns = this.requireHost().getNetNS(id);
    const addrs = await this.network.addressesIn(netns);
    if (addrs.length === 0) throw new KubenetError(`pod ${namespace}/${name}: no address on ${POD_IFNAME} in ${netns}`);
    return toStatus(addrs);
  }

  /** Pods attached and recorded (including any an earlier process set up). */
  listPods(): PodRecord[] {
    return this.network.list();
  }

  /** Resolves once the kernel has finished every pod veth deletion this process started. */
  settled(): Promise<void> {
    return this.network.settled();
  }

  private requireHost(): Host {
    if (!this.host) throw new NotReadyError('kubenet: not initialized (call init first)');
    return this.host;
  }
}

function toStatus(ips: string[]): PodNetworkStatus {
  const primary = ips.find((ip) => familyOf(ip) === 4) ?? ips[0];
  if (primary === undefined) throw new KubenetError('pod has no IP');
  return { ip: primary, ips };
}

function isExecutable(path: string): boolean {
  try {
    accessSync(path, fsConstants.X_OK);
    return true;
  } catch {
    return false;
  }
}
