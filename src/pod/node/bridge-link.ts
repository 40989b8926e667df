/**
 * What kubenet does to the bridge link itself: it makes the bridge before the first pod and pins its
 * MAC (a bridge whose address was never set takes the lowest MAC of its ports, so it would change as
 * pods come and go, and the reference bridge plugin's CHECK compares it with the MAC recorded at ADD),
 * keeps its settings (MTU, non-zero txqueuelen, promiscuous mode for hairpin) over netlink, removes
 * gateway addresses left from an earlier pod CIDR, and lists the pod veths enslaved to it.
 */
import { execa } from 'execa';
import { ConfigError, ToolError } from '../../errors.js';
import type { Logger } from '../../log.js';
import { cidrContains, type Subnet } from '../../net/ip.js';
import * as nl from '../../netlink/index.js';
import type { BridgeSettings } from '../bridge-conf.js';

const DEFAULT_TXQLEN = 1000;

/**
 * Bridges this process has checked over netlink (a bridge, its MAC pinned), by name, as last seen.
 * A re-created bridge has another ifindex (an index is not reused while its link exists): checked
 * and pinned again.
 */
const checked = new Map<string, nl.LinkInfo>();

/**
 * The bridge as kubenet keeps it: made when missing (the bridge plugin then finds it), its MAC pinned
 * once, up, and tuned (tuneBridge). Idempotent. Once this process has checked the bridge, a call
 * reads it by four ioctls (no netlink request, no RTNL lock on an ADD's way to its exec) and goes to
 * netlink only to change a setting, or when the bridge is another one or down.
 */
export async function ensureBridge(s: BridgeSettings, log: Logger): Promise<nl.LinkInfo> {
  const before = checked.get(s.bridgeName);
  const now = before && nl.linkBasics(s.bridgeName);
  if (before && now?.index === before.index && now.up) {
    const same: nl.LinkInfo = { ...before, ...now };
    checked.set(s.bridgeName, same);
    await tuneBridge(s, log, same);
    return same;
  }
  let link = await nl.ifPresent(nl.linkByName(s.bridgeName));
  if (!link) {
    const args = ['link', 'add', 'name', s.bridgeName, 'mtu', String(s.mtu), 'type', 'bridge'];
    const r = await execa('ip', args, { reject: false });
    link = await nl.linkByName(s.bridgeName); // made by us, or by a concurrent caller meanwhile
    if (r.exitCode !== 0 && link.type !== 'bridge') throw new ToolError('ip', args, r.exitCode, r.stderr);
    log.info({ bridge: s.bridgeName, mtu: s.mtu }, 'created the pod bridge');
  }
  if (link.type !== 'bridge') throw new ConfigError(`${s.bridgeName} exists and is not a bridge (${link.type ?? 'no kind'})`);
  if (before?.index !== link.index && link.mac) await nl.linkSetMac(s.bridgeName, link.mac);
  if (!link.up) {
    const args = ['link', 'set', 'dev', s.bridgeName, 'up'];
    const r = await execa('ip', args, { reject: false });
    if (r.exitCode !== 0) throw new ToolError('ip', args, r.exitCode, r.stderr);
  }
  await tuneBridge(s, log, link);
  checked.set(s.bridgeName, link);
  return link;
}

/** Bridge settings kubenet keeps: MTU, non-zero txqueuelen, promiscuous mode for hairpin. */
export async function tuneBridge(s: BridgeSettings, log: Logger, known?: nl.LinkInfo): Promise<void> {
  const link = known ?? (await nl.linkByName(s.bridgeName));
  if (link.mtu !== s.mtu) {
    await nl.linkSetMtu(s.bridgeName, s.mtu);
    log.info({ from: link.mtu, to: s.mtu }, 'set bridge MTU');
  }
  if (link.txQLen <= 0) {
    await nl.linkSetTxQLen(s.bridgeName, DEFAULT_TXQLEN);
    log.info({ txqueuelen: DEFAULT_TXQLEN }, 'set bridge txqueuelen');
  }
  if (s.hairpinMode === 'promiscuous-bridge' && !link.promisc) {
    await nl.setPromiscOn(s.bridgeName);
    log.info('bridge set to promiscuous mode for hairpin traffic');
  } else if (s.hairpinMode !== 'promiscuous-bridge' && link.promisc) {
    // Left by promiscuous-bridge mode: without its dedup rules, pods would get packets twice.
    await nl.setPromiscOff(s.bridgeName);
    log.info({ hairpinMode: s.hairpinMode }, 'bridge promiscuous mode turned off (not promiscuous-bridge hairpin mode)');
  }
}

/** tuneBridge when the bridge exists (at startup: a mode change applies before the next ADD). */
export async function tuneBridgeIfPresent(s: BridgeSettings, log: Logger): Promise<void> {
  await nl.ifPresent(tuneBridge(s, log));
}

/** Removes addresses on the bridge outside the pod subnets (left from an earlier pod CIDR). */
export async function removeStaleBridgeAddresses(bridgeName: string, subnets: Subnet[], log: Logger): Promise<void> {
  const addrs = await nl.ifPresent(nl.addrList(bridgeName));
  if (!addrs) return; // no bridge yet
  for (const a of addrs) {
    if (a.family === 6 && a.ip.toLowerCase().startsWith('fe80:')) continue;
    if (subnets.some((sub) => cidrContains(sub, a.ip))) continue;
    await nl.addrDel(bridgeName, a.cidr);
    log.info({ bridge: bridgeName, address: a.cidr }, 'removed stale bridge address');
  }
}

/** The bridge's ports that are veths (name and index); [] when there is no bridge. */
export async function bridgeVeths(bridgeName: string): Promise<nl.LinkInfo[]> {
  const bridge = await nl.ifPresent(nl.linkByName(bridgeName));
  if (!bridge) return [];
  return (await nl.linkList()).filter((l) => l.master === bridge.index && l.type === 'veth');
}
