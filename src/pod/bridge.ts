/**
 * The pod bridge: the reference `bridge` + `host-local` config kubenet generates for the pod CIDR
 * (typed, then serialized by the CNI runtime), the bridge settings kubenet keeps (MTU, non-zero
 * txqueuelen, promiscuous mode for hairpin), and the removal of gateway addresses left from an
 * earlier pod CIDR.
 */
import type { BridgeNetConf, HostLocalIpamConf, NetConf, NetConfList } from '../cni/types.js';
import { NetlinkError } from '../errors.js';
import type { Logger } from '../log.js';
import * as nl from '../netlink/index.js';
import { cidrContains, type PodSubnet } from '../plugin/cidr.js';
import type { HairpinMode } from '../plugin/types.js';

/** Network name of the bridge config: host-local keeps reservations under `<ipamDataDir>/kubenet`. */
export const NETWORK_NAME = 'kubenet';
export const CNI_VERSION = '1.0.0';
export const POD_IFNAME = 'eth0';
const DEFAULT_TXQLEN = 1000;

export interface BridgeSettings {
  bridgeName: string;
  mtu: number;
  hairpinMode: HairpinMode;
  ipamDataDir: string;
}

/** The bridge + host-local config for the pod subnets. */
export function bridgeConf(s: BridgeSettings, subnets: PodSubnet[]): BridgeNetConf {
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

/** Bridge settings kubenet keeps: MTU, non-zero txqueuelen, promiscuous mode for hairpin. */
export function tuneBridge(s: BridgeSettings, log: Logger): void {
  const link = nl.linkByName(s.bridgeName);
  if (link.mtu !== s.mtu) {
    nl.linkSetMtu(s.bridgeName, s.mtu);
    log.info({ from: link.mtu, to: s.mtu }, 'set bridge MTU');
  }
  if (link.txQLen <= 0) {
    nl.linkSetTxQLen(s.bridgeName, DEFAULT_TXQLEN);
    log.info({ txqueuelen: DEFAULT_TXQLEN }, 'set bridge txqueuelen');
  }
  if (s.hairpinMode === 'promiscuous-bridge' && !link.promisc) {
    nl.setPromiscOn(s.bridgeName);
    log.info('bridge set to promiscuous mode for hairpin traffic');
  }
}

/** Removes addresses on the bridge outside the pod subnets (left from an earlier pod CIDR). */
export function removeStaleBridgeAddresses(bridgeName: string, subnets: PodSubnet[], log: Logger): void {
  let addrs: nl.AddrInfo[];
  try {
    addrs = nl.addrList(bridgeName);
  } catch (err) {
    if (err instanceof NetlinkError && err.errno === nl.E.ENODEV) return; // no bridge yet
    throw err;
  }
  for (const a of addrs) {
    if (a.family === 6 && a.ip.toLowerCase().startsWith('fe80:')) continue;
    if (subnets.some((sub) => cidrContains(sub, a.ip))) continue;
    nl.addrDel(bridgeName, a.cidr);
    log.info({ bridge: bridgeName, address: a.cidr }, 'removed stale bridge address');
  }
}

/** The bridge's ports that are veths (name and index); [] when there is no bridge. */
export function bridgeVeths(bridgeName: string): nl.LinkInfo[] {
  let bridge: nl.LinkInfo;
  try {
    bridge = nl.linkByName(bridgeName);
  } catch (err) {
    if (err instanceof NetlinkError && err.errno === nl.E.ENODEV) return [];
    throw err;
  }
  return nl.linkList().filter((l) => l.master === bridge.index && l.type === 'veth');
}
