/**
 * Address modes: where a pod's addresses come from, one implementation of `AddressMode` per mode
 * (as flannel's backends are), so the core (network.ts) holds no mode branches:
 * - `HostLocalMode` (host-local-mode.ts): the pod CIDR, through the bridge plugin's own host-local
 *   (the library's front end);
 * - `AgentHostLocalMode` (host-local-mode.ts): the pod CIDR, allocated in-process by host-local's
 *   own allocator on host-local's own store beside the bridge plugin's exec (the node agent);
 * - `DhcpMode` (dhcp-mode.ts): the LAN's DHCP server through the reference dhcp IPAM plugin and
 *   its lease daemon; the uplink is a port of the bridge.
 *
 * The core asks the mode in force for node setup, the network config and each ADD, and the mode of
 * a record's own network (`AddressModes.of`) for everything done to that attachment later (DEL,
 * CHECK, the lease released before its veth goes): a record made before the node changed modes
 * keeps its network, so its addresses go back where they came from.
 *
 * Adding a mode: one implementation here, its settings in `IpamSettings` (requests.ts), its config
 * key in daemon/config/keys.ts, and its case in `addressModes` (addresses/modes.ts).
 */
import type { CniRuntime } from '../../cni/runtime.js';
import type { CniResult, NetConf, NetConfList, RuntimeConf } from '../../cni/types.js';
import type { Logger } from '../../log.js';
import type { Subnet } from '../../net/ip.js';
import type { KeyedMutex } from '../../util/keyed-mutex.js';
import type { BridgeSettings } from '../bridge-conf.js';
import type { PodRecord, PodStore } from '../records/record.js';
import type { ReservationFiles } from './reservations.js';

/** What every mode works with: the node's names and directories and the core's plugin runtime. */
export interface ModeContext {
  bridgeName: string;
  stateDir: string;
  ipamDataDir: string;
  pluginBinDirs: string[];
  /** The core's plugin runtime (its default timeout). */
  cni: CniRuntime;
  log: Logger;
}

export interface AddressMode {
  readonly name: 'host-local' | 'dhcp';
  /**
   * Whether the pods' addresses are the pod CIDR's, gateway on the bridge: the network is then
   * ready only once the pod CIDR is known, and promiscuous-bridge mode keeps dedup rules for it.
   * Otherwise the network is ready at init and the pod CIDR is informational.
   */
  readonly podCidrAddresses: boolean;
  /** The host interface this mode makes a port of the bridge (an older one is released at init). */
  readonly uplink: string | undefined;
  /** Node setup at init, before the bridge is needed: masquerading, the uplink. */
  setUpNode(o: { settings: BridgeSettings; nonMasqueradeCIDR: string; mtu: number }, log: Logger): Promise<void>;
  /** The pod network's config for the pod CIDR's subnets ([] before any is known). */
  conf(settings: BridgeSettings, subnets: Subnet[]): NetConf;
  /** What must hold before an ADD changes anything; throws NotReadyError otherwise. */
  precheck(conf: NetConf, pod: string): Promise<void>;
  /**
   * The addresses allocated beside the bridge plugin's exec, which fetches them through the shim;
   * undefined when the bridge plugin's own IPAM allocates them.
   */
  startAllocation(network: NetConf | NetConfList, rt: RuntimeConf): Promise<CniResult> | undefined;
  /** The network's ADD (the bridge plugin and what follows it). */
  add(network: NetConf | NetConfList, rt: RuntimeConf, pod: string): Promise<CniResult>;
  /** Before the pod's veth goes: what must leave through it (a DHCP release). */
  releaseBeforeVeth(record: PodRecord, log: Logger): Promise<void>;
  /** The network's DEL; `rt.netns` is '' for an attachment whose veth the core removed itself. */
  del(network: NetConf | NetConfList, rt: RuntimeConf, prev?: CniResult): Promise<void>;
  /** The bridge plugin's CHECK of the attachment. */
  check(bridge: NetConf, rt: RuntimeConf, prev: CniResult): Promise<void>;
  /** The reservations this mode keeps on disk (none for dhcp): for the sweep and DELs of unknown attachments. */
  reservations(): Promise<ReservationFiles>;
  /** Removes reservation files a killed allocator left empty; returns the addresses freed. */
  removeEmptyReservations(empty: string[]): Promise<string[]>;
  /** The subnets whose host-port rules forward to this node's pods. */
  podSubnets(podCidr: Subnet[], records: PodRecord[]): Subnet[];
  /** After the address source restarted (dhcp's lease daemon): every known pod's address taken again. */
  readopt(store: PodStore, locks: KeyedMutex): Promise<{ adopted: number; failed: string[] }>;
}
