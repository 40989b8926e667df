/**
 * The pod bridge's config: the reference `bridge` + `host-local` config kubenet generates for the
 * pod CIDR (typed, then serialized by the CNI runtime), and the names and modes it is built from.
 * Pure; what kubenet does to the bridge link itself is in bridge-kernel.ts.
 */
import type { BridgeNetConf, HostLocalIpamConf, NetConf, NetConfList } from '../cni/types.js';
import type { Subnet } from '../net/ip.js';

/** Network name of the bridge config: host-local keeps reservations under `<ipamDataDir>/kubenet`. */
export const NETWORK_NAME = 'kubenet';
export const CNI_VERSION = '1.0.0';
export const POD_IFNAME = 'eth0';

/** How a pod reaches itself through a service: hairpin on each veth, a promiscuous bridge, or not at all. */
export const HAIRPIN_MODES = ['promiscuous-bridge', 'hairpin-veth', 'none'] as const;
export type HairpinMode = (typeof HAIRPIN_MODES)[number];

export interface BridgeSettings {
  bridgeName: string;
  mtu: number;
  hairpinMode: HairpinMode;
  ipamDataDir: string;
}

/** The bridge + host-local config for the pod subnets. */
export function bridgeConf(s: BridgeSettings, subnets: Subnet[]): BridgeNetConf {
  const ipam: HostLocalIpamConf = {
    type: 'host-local',
    ranges: subnets.map((sub) => [{ subnet: sub.cidr }]),
    routes: subnets.map((sub) => ({ dst: sub.family === 4 ? '0.0.0.0/0' : '::/0' })),
    dataDir: s.ipamDataDir,
  };
  return {
    cniVersion: CNI_VERSION,
    name: NETWORK_NAME,
    type: 'bridge',
    bridge: s.bridgeName,
    mtu: s.mtu,
    isGateway: true,
    ipMasq: false,
    hairpinMode: s.hairpinMode === 'hairpin-veth',
    ipam,
  };
}

/** The pod network as a list: bridge, then the reference portmap plugin for host ports. */
export function withPortmap(conf: NetConf): NetConfList {
  const { cniVersion, name, ...bridge } = conf;
  return { cniVersion, name, plugins: [bridge, { type: 'portmap', capabilities: { portMappings: true }, snat: true }] };
}
