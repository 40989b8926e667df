/**
 * The pod bridge's config: the reference `bridge` + `host-local` config kubenet generates for the
 * pod CIDR, or `bridge` + `dhcp` for pods on the LAN (typed, then serialized by the CNI runtime),
 * and the names and modes it is built from. Pure; what kubenet does to the bridge link itself is in
 * node/bridge-link.ts.
 */
import type { BridgeNetConf, HostLocalIpamConf, IpamConf, NetConf, NetConfList, PluginConf } from '../cni/types.js';
import type { Subnet } from '../net/ip.js';

/** Network name of the bridge config: host-local keeps reservations under `<ipamDataDir>/kubenet`. */
export const NETWORK_NAME = 'kubenet';
export const CNI_VERSION = '1.0.0';
export const POD_IFNAME = 'eth0';

/**
 * How a pod reaches itself through a service: hairpin on each veth, a promiscuous bridge, or not at
 * all. `promiscuous-bridge` keeps kubenet's promiscuous bridge and its dedup rules (node/dedup-rules.ts) and
 * turns hairpin on each veth too: on current kernels a pod's packet DNATed back to itself is bridged
 * by br_netfilter to the port it came from, and dropped there without the port's hairpin flag,
 * promiscuous bridge or not (the kernel it was seen on, and the test that shows it: docs/pod.md).
 */
export const HAIRPIN_MODES = ['promiscuous-bridge', 'hairpin-veth', 'none'] as const;
export type HairpinMode = (typeof HAIRPIN_MODES)[number];

export interface BridgeSettings {
  bridgeName: string;
  mtu: number;
  hairpinMode: HairpinMode;
  ipamDataDir: string;
  /**
   * The agent's socket when it allocates host-local's addresses itself, next to the bridge plugin (prefetch): the
   * bridge's IPAM is then {@link IPAM_SHIM_TYPE}, which fetches that result over this socket.
   */
  ipamPrefetchSocket?: string;
}

/**
 * The IPAM type of the agent's bridge config when host-local is prefetched: native/kubenet-cni.c
 * exec'd as `kubenet-ipam` (native/build/ipam/). For ADD it answers with the result of the
 * host-local allocation the agent started in-process with the bridge plugin's exec (POST
 * /v1/ipam); every other command it hands to host-local itself (the agent's DEL never runs the
 * bridge plugin, so in practice that is CHECK). Its config is host-local's (host-local ignores `type`).
 */
export const IPAM_SHIM_TYPE = 'kubenet-ipam';

/**
 * The bridge + host-local config for the pod subnets. With `ipamPrefetchSocket`, the bridge reaches
 * host-local through the shim: same ranges, routes and data dir, so the same reservations.
 */
export function bridgeConf(s: BridgeSettings, subnets: Subnet[]): BridgeNetConf {
  const ipam: HostLocalIpamConf = {
    type: 'host-local',
    ranges: subnets.map((sub) => [{ subnet: sub.cidr }]),
    routes: subnets.map((sub) => ({ dst: sub.family === 4 ? '0.0.0.0/0' : '::/0' })),
    dataDir: s.ipamDataDir,
  };
  if (s.ipamPrefetchSocket === undefined) return bridgeNetConf(s, true, ipam);
  return { ...bridgeNetConf(s, true, { ...ipam, type: IPAM_SHIM_TYPE }), socket: s.ipamPrefetchSocket };
}

/**
 * The host-local network the agent allocates from for a bridge network whose IPAM is the shim (same name,
 * version and IPAM section, so the same reservations as the bridge's own IPAM calls); undefined
 * for any other network.
 */
export function prefetchedIpamNetwork(network: NetConf | NetConfList): NetConf | undefined {
  const ipam = bridgePlugin(network)?.ipam;
  if (ipam?.type !== IPAM_SHIM_TYPE) return undefined;
  return { cniVersion: network.cniVersion, name: network.name, type: 'host-local', ipam: { ...ipam, type: 'host-local' } };
}

/**
 * The host-local network of a bridge network whose addresses are host-local's, through the shim or
 * not (same name, version and IPAM section, type host-local): what the agent's own allocator
 * (host-local/) releases; undefined for any other network.
 */
export function hostLocalIpamNetwork(network: NetConf | NetConfList): NetConf | undefined {
  const ipam = bridgePlugin(network)?.ipam;
  if (ipam?.type !== IPAM_SHIM_TYPE && ipam?.type !== 'host-local') return undefined;
  return { cniVersion: network.cniVersion, name: network.name, type: 'host-local', ipam: { ...ipam, type: 'host-local' } };
}

/** The bridge plugin's part of both configs; masquerading is kubenet's own rule, never the plugin's. */
function bridgeNetConf(s: BridgeSettings, isGateway: boolean, ipam: IpamConf): BridgeNetConf {
  return {
    cniVersion: CNI_VERSION,
    name: NETWORK_NAME,
    type: 'bridge',
    bridge: s.bridgeName,
    mtu: s.mtu,
    isGateway,
    ipMasq: false,
    hairpinMode: s.hairpinMode !== 'none',
    ipam,
  };
}

/** The reference dhcp IPAM plugin's part of a config: it asks the lease daemon on this socket. */
export interface DhcpIpamConf extends IpamConf {
  type: 'dhcp';
  daemonSocketPath: string;
}

/**
 * The bridge + dhcp config: pods on the LAN behind the uplink, with address, gateway and routes
 * from their lease. The bridge is no gateway (no address on it, no forwarding turned on for it)
 * and nothing is masqueraded.
 */
export function dhcpBridgeConf(s: BridgeSettings, daemonSocketPath: string): BridgeNetConf {
  const ipam: DhcpIpamConf = { type: 'dhcp', daemonSocketPath };
  return bridgeNetConf(s, false, ipam);
}

/** The bridge plugin's config in a network (a list's first plugin); undefined when it has none. */
function bridgePlugin(network: NetConf | NetConfList): PluginConf | undefined {
  const plugins = (network as NetConfList).plugins;
  return Array.isArray(plugins) ? plugins[0] : (network as NetConf);
}

/** The dhcp IPAM config of a network whose bridge takes its addresses from DHCP; else undefined. */
export function dhcpIpamOf(network: NetConf | NetConfList | undefined): DhcpIpamConf | undefined {
  const ipam = network ? bridgePlugin(network)?.ipam : undefined;
  return ipam?.type === 'dhcp' && typeof ipam.daemonSocketPath === 'string' ? (ipam as DhcpIpamConf) : undefined;
}

/**
 * The network as the dhcp IPAM plugin is run on its own (it reads the network's name for the lease's
 * client ID, and its ipam section): to re-acquire a pod's lease and to release it.
 */
export function dhcpIpamNetwork(network: NetConf | NetConfList): NetConf {
  const ipam = dhcpIpamOf(network);
  if (!ipam) throw new TypeError('dhcpIpamNetwork: the network takes no addresses from DHCP');
  return { cniVersion: network.cniVersion, name: network.name, type: 'dhcp', ipam };
}

/**
 * The plugins after the bridge (portmap), as a list, or undefined when there are none. A dhcp
 * network's DEL runs these only: the lease is released by the dhcp plugin itself while the pod's
 * interface still exists, and the bridge plugin's DEL without a netns is only its IPAM DEL.
 */
export function afterBridge(network: NetConf | NetConfList): NetConfList | undefined {
  const plugins = (network as NetConfList).plugins;
  if (!Array.isArray(plugins) || plugins.length < 2) return undefined;
  return { ...(network as NetConfList), plugins: plugins.slice(1) };
}

const PORTMAP = { type: 'portmap', capabilities: { portMappings: true }, snat: true } as const;

/** The pod network as a list: bridge, then the reference portmap plugin for host ports. */
export function withPortmap(conf: NetConf): NetConfList {
  const { cniVersion, name, ...bridge } = conf;
  return { cniVersion, name, plugins: [bridge, { ...PORTMAP }] };
}

/**
 * portmap alone as the pod network: what removing a container's host-port rules takes. portmap's DEL
 * finds them by network name and container ID, so it needs no pod CIDR (unlike bridge + host-local).
 */
export function portmapOnly(): NetConf {
  return { cniVersion: CNI_VERSION, name: NETWORK_NAME, ...PORTMAP };
}
