/**
 * The dhcp address mode: pods take their addresses, gateway and routes from the LAN's DHCP server,
 * through the reference dhcp IPAM plugin and its lease daemon (addresses/dhcp-leases.ts; the node agent runs the
 * daemon). The uplink is a port of the bridge (uplink.ts); the bridge is no gateway and nothing is
 * masqueraded (a rule left by host-local mode is removed); the network is ready at init, the pod
 * CIDR is informational. An ADD is bounded by the lease timeout; DEL releases the lease through
 * the pod's interface while it still exists, then runs only the plugins after the bridge.
 */
import { PluginTimeoutError } from '../../cni/errors.js';
import { CniRuntime } from '../../cni/runtime.js';
import type { CniResult, NetConf, NetConfList, RuntimeConf } from '../../cni/types.js';
import { KubenetError, NotReadyError } from '../../errors.js';
import type { Logger } from '../../log.js';
import type { Subnet } from '../../net/ip.js';
import type { KeyedMutex } from '../../util/keyed-mutex.js';
import type { AddressMode, ModeContext } from './mode.js';
import { afterBridge, dhcpBridgeConf, dhcpIpamOf, type BridgeSettings } from '../bridge-conf.js';
import { ensureBridge } from '../node/bridge-link.js';
import { DhcpLeaseError, leaseSubnets, readoptLeases, releaseLease, socketAnswers } from './dhcp-leases.js';
import { removeMasquerade } from '../node/host-setup.js';
import type { PodRecord, PodStore } from '../records/record.js';
import type { ReservationFiles } from './reservations.js';
import { PLUGIN_TYPES, type DhcpSettings } from '../requests.js';
import { ensureUplink } from '../node/uplink.js';

export class DhcpMode implements AddressMode {
  readonly name = 'dhcp';
  readonly podCidrAddresses = false;
  readonly uplink: string | undefined;
  /** Plugin execs bounded by the lease timeout (the bridge ADD waits for the lease). */
  private readonly cni: CniRuntime;

  /**
   * @param settings the mode's settings when it is the mode in force; undefined when it only undoes
   *   the attachments of dhcp networks recorded before the node changed modes.
   */
  constructor(
    private readonly ctx: ModeContext,
    private readonly settings: DhcpSettings | undefined,
  ) {
    this.uplink = settings?.uplink;
    this.cni = settings
      ? new CniRuntime({ binDirs: ctx.pluginBinDirs, allowedTypes: PLUGIN_TYPES, logger: ctx.log, timeoutMs: settings.timeoutMs })
      : ctx.cni;
  }

  private inForce(): DhcpSettings {
    if (!this.settings) throw new KubenetError('kubenet: the node is not in ipam dhcp mode');
    return this.settings;
  }

  async setUpNode(o: { settings: BridgeSettings; nonMasqueradeCIDR: string; mtu: number }, log: Logger): Promise<void> {
    const s = this.inForce();
    await removeMasquerade(o.nonMasqueradeCIDR);
    log.info({ uplink: s.uplink }, 'ipam dhcp: pods take addresses from the LAN; no masquerade rule');
    await ensureUplink({ bridgeName: this.ctx.bridgeName, uplink: s.uplink, mtu: o.mtu, stateDir: this.ctx.stateDir }, log);
    await ensureBridge(o.settings, log);
  }

  conf(settings: BridgeSettings): NetConf {
    return dhcpBridgeConf(settings, this.inForce().daemonSocket);
  }

  async precheck(conf: NetConf, pod: string): Promise<void> {
    const lease = dhcpIpamOf(conf);
    if (lease && !(await socketAnswers(lease.daemonSocketPath))) {
      throw new NotReadyError(
        `kubenet: cannot set up pod ${pod}: the DHCP lease daemon does not answer on ${lease.daemonSocketPath} (yet)`,
      );
    }
  }

  startAllocation(): Promise<CniResult> | undefined {
    return undefined;
  }

  /**
   * Bounded by the lease timeout: a bridge plugin still waiting for its lease then is killed, and
   * the ADD fails with a DhcpLeaseError (undone like any failure).
   */
  async add(network: NetConf | NetConfList, rt: RuntimeConf, pod: string): Promise<CniResult> {
    const s = this.inForce();
    try {
      return await this.cni.add(network, rt);
    } catch (err) {
      if (!(err instanceof PluginTimeoutError)) throw err;
      throw new DhcpLeaseError(
        `pod ${pod}: no DHCP lease within ${s.timeoutMs / 1000} s: no DHCP server answered through uplink ${s.uplink} (or the lease daemon is stuck)`,
        { cause: err },
      );
    }
  }

  /** The lease is released through the pod's interface: before its veth goes. */
  releaseBeforeVeth(record: PodRecord, log: Logger): Promise<void> {
    return releaseLease(this.cni, record, log);
  }

  /**
   * Only the plugins after the bridge run (portmap): the bridge plugin's DEL without a netns is
   * only its IPAM DEL, and the lease was released before the veth went, or its daemon is gone.
   */
  async del(network: NetConf | NetConfList, rt: RuntimeConf, prev?: CniResult): Promise<void> {
    const rest = afterBridge(network);
    if (rest) await this.ctx.cni.del(rest, rt, prev);
  }

  /** The dhcp plugin's CHECK has the lease daemon look at the lease (or acquire it again). */
  check(bridge: NetConf, rt: RuntimeConf, prev: CniResult): Promise<void> {
    return this.cni.check(bridge, rt, prev);
  }

  /** No reservations: a lease is only ever held for a recorded pod. */
  reservations(): Promise<ReservationFiles> {
    return Promise.resolve({ held: [], empty: [] });
  }

  removeEmptyReservations(): Promise<string[]> {
    return Promise.resolve([]);
  }

  /** The LAN subnets of the pods' leases. */
  podSubnets(_podCidr: Subnet[], records: PodRecord[]): Subnet[] {
    return leaseSubnets(records);
  }

  readopt(store: PodStore, locks: KeyedMutex): Promise<{ adopted: number; failed: string[] }> {
    if (!this.settings) return Promise.resolve({ adopted: 0, failed: [] });
    return readoptLeases({ cni: this.cni, store, locks, log: this.ctx.log });
  }
}
