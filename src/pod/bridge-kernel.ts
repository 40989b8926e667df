/**
 * What kubenet does to the bridge link itself, over netlink: the settings it keeps (MTU, non-zero
 * txqueuelen, promiscuous mode for hairpin), the removal of gateway addresses left from an earlier
 * pod CIDR, and the list of pod veths enslaved to it.
 */
import { NetlinkError } from '../errors.js';
import type { Logger } from '../log.js';
import { cidrContains, type Subnet } from '../net/ip.js';
import * as nl from '../netlink/index.js';
import type { BridgeSettings } from './bridge.js';

const DEFAULT_TXQLEN = 1000;

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
  } else if (s.hairpinMode !== 'promiscuous-bridge' && link.promisc) {
    // Left by promiscuous-bridge mode: without its dedup rules, pods would get packets twice.
    nl.setPromiscOff(s.bridgeName);
    log.info({ hairpinMode: s.hairpinMode }, 'bridge promiscuous mode turned off (not promiscuous-bridge hairpin mode)');
  }
}

/** tuneBridge when the bridge exists (at startup: a mode change applies before the next ADD). */
export function tuneBridgeIfPresent(s: BridgeSettings, log: Logger): void {
  try {
    tuneBridge(s, log);
  } catch (err) {
    if (err instanceof NetlinkError && err.errno === nl.E.ENODEV) return;
    throw err;
  }
}

/** Removes addresses on the bridge outside the pod subnets (left from an earlier pod CIDR). */
export function removeStaleBridgeAddresses(bridgeName: string, subnets: Subnet[], log: Logger): void {
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
