/**
 * The host-local address modes: pod addresses from the node's pod CIDR, in host-local's ranges and
 * on host-local's disk store (`<ipamDataDir>/kubenet/`), gateway on the bridge, masqueraded when
 * they leave the cluster's non-masquerade CIDR.
 *
 * - `HostLocalMode`: the bridge plugin runs host-local itself (the library's front end).
 * - `AgentHostLocalMode`: the node agent allocates in-process with host-local's own allocator
 *   (host-local/), beside the bridge plugin's exec; the bridge's IPAM is then the shim, which
 *   fetches that result over the agent's socket, so no host-local is exec'd on ADD. DEL releases
 *   in-process too, without the bridge plugin: its DEL without a netns is only its IPAM DEL. The
 *   config still describes bridge + host-local (through the shim), and the real host-local can
 *   release, check and collect what the agent reserved, and the agent what it did.
 */
import type { CniResult, NetConf, NetConfList, RuntimeConf } from '../../cni/types.js';
import type { Logger } from '../../log.js';
import type { Subnet } from '../../net/ip.js';
import type { AddressMode, ModeContext } from './mode.js';
import { afterBridge, bridgeConf, hostLocalIpamNetwork, NETWORK_NAME, prefetchedIpamNetwork, type BridgeSettings } from '../bridge-conf.js';
import { HostLocalAllocator, parseHostLocal } from './allocator/allocator.js';
import { ensureMasquerade } from '../node/host-setup.js';
import { readReservations, removeEmptyReservations, type ReservationFiles } from './reservations.js';

export class HostLocalMode implements AddressMode {
  readonly name = 'host-local';
  readonly podCidrAddresses = true;
  readonly uplink = undefined;

  constructor(protected readonly ctx: ModeContext) {}

  async setUpNode(o: { nonMasqueradeCIDR: string }, log: Logger): Promise<void> {
    await ensureMasquerade(o.nonMasqueradeCIDR, log);
  }

  conf(settings: BridgeSettings, subnets: Subnet[]): NetConf {
    return bridgeConf(settings, subnets);
  }

  precheck(): Promise<void> {
    return Promise.resolve();
  }

  startAllocation(_network: NetConf | NetConfList, _rt: RuntimeConf): Promise<CniResult> | undefined {
    return undefined;
  }

  add(network: NetConf | NetConfList, rt: RuntimeConf): Promise<CniResult> {
    return this.ctx.cni.add(network, rt);
  }

  releaseBeforeVeth(): Promise<void> {
    return Promise.resolve();
  }

  del(network: NetConf | NetConfList, rt: RuntimeConf, prev?: CniResult): Promise<void> {
    return this.ctx.cni.del(network, rt, prev);
  }

  check(bridge: NetConf, rt: RuntimeConf, prev: CniResult): Promise<void> {
    return this.ctx.cni.check(bridge, rt, prev);
  }

  reservations(): Promise<ReservationFiles> {
    return readReservations(this.ctx.ipamDataDir, NETWORK_NAME);
  }

  removeEmptyReservations(empty: string[]): Promise<string[]> {
    return removeEmptyReservations(this.ctx.ipamDataDir, NETWORK_NAME, empty);
  }

  podSubnets(podCidr: Subnet[]): Subnet[] {
    return podCidr;
  }

  readopt(): Promise<{ adopted: number; failed: string[] }> {
    return Promise.resolve({ adopted: 0, failed: [] });
  }
}

export class AgentHostLocalMode extends HostLocalMode {
  /** host-local's allocator, in-process. */
  private readonly allocator = new HostLocalAllocator();

  /** @param prefetchSocket the agent's socket the IPAM shim fetches each ADD's addresses from. */
  constructor(
    ctx: ModeContext,
    private readonly prefetchSocket: string,
  ) {
    super(ctx);
  }

  override conf(settings: BridgeSettings, subnets: Subnet[]): NetConf {
    return bridgeConf({ ...settings, ipamPrefetchSocket: this.prefetchSocket }, subnets);
  }

  /** host-local's ADD for the attachment, in-process, for a network whose IPAM is the shim. */
  override startAllocation(network: NetConf | NetConfList, rt: RuntimeConf): Promise<CniResult> | undefined {
    const ipam = prefetchedIpamNetwork(network);
    return ipam ? this.allocator.add(parseHostLocal(ipam), rt.containerId, rt.ifName) : undefined;
  }

  /**
   * As libcni runs a list's DELs: the plugins after the bridge first (portmap: host-port rules go
   * before the address), then the address, released in-process. With a netns the bridge plugin's
   * own DEL runs (an ADD cut short: its interface may still be in the netns).
   */
  override async del(network: NetConf | NetConfList, rt: RuntimeConf, prev?: CniResult): Promise<void> {
    const ipam = rt.netns === '' ? hostLocalIpamNetwork(network) : undefined;
    if (!ipam) return super.del(network, rt, prev);
    const rest = afterBridge(network);
    if (rest) await this.ctx.cni.del(rest, rt, prev);
    await this.allocator.del(parseHostLocal(ipam), rt.containerId, rt.ifName);
  }
}
