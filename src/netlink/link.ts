/**
 * Links, named after iproute2: `ip link show` (by name, by ifindex, all), `ip -s link` counters,
 * `ip link set` (mtu, txqueuelen, address, promisc), over the shared host socket (./socket.ts); and
 * the link primitives on a given socket that addresses, namespaces and tc classes share (getLink,
 * linkIndex, toLinkInfo). Setters send nothing when the link is already in the wanted state, but
 * for linkSetMac (see there).
 */
import { AF_LLC, AF_UNSPEC, IFF_LOOPBACK, IFF_POINTOPOINT, IFF_PROMISC, IFF_UP, nl, route, RTNL_LINK, type Out, type Ptr } from './libnl.js';
import { ConfigError, NetlinkError } from '../errors.js';
import { E, NLE, nlError } from './errno.js';
import { checkIfname, checkUint } from './parse.js';
import { check, dumpCache, hostSocket } from './socket.js';

export interface LinkInfo {
  name: string;
  index: number;
  mtu: number;
  txQLen: number;
  /** ifi_flags as the kernel reports them (IFF_*). */
  flags: number;
  /** Administratively up (IFF_UP). */
  up: boolean;
  /** Promiscuous mode set by a user (`ip link set promisc on`), not the bridge-port refcount. */
  promisc: boolean;
  loopback: boolean;
  pointToPoint: boolean;
  /** ifindex of the master (bridge, bond), 0 if none. */
  master: number;
  /** IFLA_INFO_KIND ('bridge', 'veth', ...); undefined for links without one (physical NICs, lo). */
  type: string | undefined;
  /** IFLA_LINK: for a veth the ifindex of its peer, in the peer's namespace; 0 when absent. */
  peerIndex: number;
  /** IFLA_LINK_NETNSID is there: the peer is in another network namespace than this link. */
  peerElsewhere: boolean;
  /** The link-layer address ("aa:bb:cc:dd:ee:ff"); '' when the link has none. */
  mac: string;
}

/** A link's own counters (`ip -s link`): rx = received by this device, tx = sent by it. */
export interface LinkStats {
  rxBytes: number;
  txBytes: number;
  rxPackets: number;
  txPackets: number;
  rxDropped: number;
  txDropped: number;
}

// ---------------------------------------------------------------------------------------------
// Object conversion.

export function toLinkInfo(link: Ptr): LinkInfo {
  const flags = route.rtnl_link_get_flags(link) as number;
  const type = route.rtnl_link_get_type(link) as string | null;
  return {
    name: route.rtnl_link_get_name(link) as string,
    index: route.rtnl_link_get_ifindex(link) as number,
    mtu: route.rtnl_link_get_mtu(link) as number,
    txQLen: route.rtnl_link_get_txqlen(link) as number,
    flags,
    up: (flags & IFF_UP) !== 0,
    promisc: (flags & IFF_PROMISC) !== 0,
    loopback: (flags & IFF_LOOPBACK) !== 0,
    pointToPoint: (flags & IFF_POINTOPOINT) !== 0,
    master: route.rtnl_link_get_master(link) as number,
    type: type ?? undefined,
    peerIndex: route.rtnl_link_get_link(link) as number,
    peerElsewhere: (route.rtnl_link_get_link_netnsid(link, netnsidOut) as number) === 0,
    mac: macOf(link),
  };
}

const netnsidOut: [number] = [0];
const macBuf = Buffer.alloc(64);

function macOf(link: Ptr): string {
  const a = route.rtnl_link_get_addr(link) as Ptr; // borrowed
  if (!a) return '';
  const text = nl.nl_addr2str(a, macBuf, macBuf.length) as string;
  return text === 'none' ? '' : text;
}

// ---------------------------------------------------------------------------------------------
// Primitives on a given socket.

/** rtnl_link_get_kernel by name or ifindex; the caller owns the result (rtnl_link_put). Absence → ENODEV. */
export function getLink(sk: Ptr, op: string, nameOrIndex: string | number): Ptr {
  const out: Out = [null];
  const rc = typeof nameOrIndex === 'number' ? route.rtnl_link_get_kernel(sk, nameOrIndex, null, out) : route.rtnl_link_get_kernel(sk, 0, nameOrIndex, out);
  check(sk, op, rc as number, E.ENODEV);
  if (!out[0]) throw new NetlinkError(op, E.ENODEV, 'Object not found');
  return out[0];
}

/** A u64 from koffi: a number, or a BigInt beyond 2^53 (counters are exact far below that). */
function u64(v: unknown): number {
  return typeof v === 'bigint' ? Number(v) : (v as number);
}

export function linkIndex(sk: Ptr, op: string, name: string): number {
  const link = getLink(sk, op, name);
  try {
    return route.rtnl_link_get_ifindex(link) as number;
  } finally {
    route.rtnl_link_put(link);
  }
}

/**
 * Applies a change built on a fresh rtnl_link to the named link, unless `already` says the link is
 * in the wanted state (no request, no netlink event).
 */
function changeLink(op: string, name: string, already: (cur: LinkInfo) => boolean, build: (change: Ptr) => void): void {
  checkIfname(op, name);
  const sk = hostSocket(op);
  const orig = getLink(sk, op, name);
  try {
    if (already(toLinkInfo(orig))) return;
    const change = route.rtnl_link_alloc() as Ptr;
    if (!change) throw new NetlinkError(op, E.ENOMEM, 'rtnl_link_alloc failed');
    try {
      build(change);
      check(sk, op, route.rtnl_link_change(sk, orig, change, 0) as number, E.ENODEV);
    } finally {
      route.rtnl_link_put(change);
    }
  } finally {
    route.rtnl_link_put(orig);
  }
}

// ---------------------------------------------------------------------------------------------
// Public API.

/** `ip link show NAME`. Throws NetlinkError errno 19 (ENODEV) when there is no such link. */
export function linkByName(name: string): LinkInfo {
  const op = `linkByName ${name}`;
  checkIfname(op, name);
  const link = getLink(hostSocket(op), op, name);
  try {
    return toLinkInfo(link);
  } finally {
    route.rtnl_link_put(link);
  }
}

/** `ip link show` by ifindex. Throws NetlinkError errno 19 (ENODEV) when there is no such link. */
export function linkByIndex(ifindex: number): LinkInfo {
  const op = `linkByIndex ${ifindex}`;
  checkUint(op, 'ifindex', ifindex, 0x7fffffff);
  if (ifindex === 0) throw new ConfigError(`${op}: ifindex must be positive`);
  const link = getLink(hostSocket(op), op, ifindex);
  try {
    return toLinkInfo(link);
  } finally {
    route.rtnl_link_put(link);
  }
}

/** `ip link show`: every link of this network namespace, in kernel (ifindex) order. */
export function linkList(): LinkInfo[] {
  const op = 'linkList';
  const sk = hostSocket(op);
  const cache = dumpCache(sk, op, (out) => route.rtnl_link_alloc_cache(sk, AF_UNSPEC, out) as number);
  try {
    const result: LinkInfo[] = [];
    for (let l = nl.link_cache_first(cache) as Ptr; l; l = nl.link_cache_next(l) as Ptr) result.push(toLinkInfo(l));
    return result;
  } finally {
    nl.nl_cache_free(cache);
  }
}

/** `ip -s link show NAME` (NAME, or an ifindex): the link's counters. Throws NetlinkError ENODEV when there is no such link. */
export function linkStats(dev: string | number): LinkStats {
  const op = `linkStats ${dev}`;
  if (typeof dev === 'number') {
    checkUint(op, 'ifindex', dev, 0x7fffffff);
    if (dev === 0) throw new ConfigError(`${op}: ifindex must be positive`);
  } else {
    checkIfname(op, dev);
  }
  const link = getLink(hostSocket(op), op, dev);
  try {
    const stat = (id: number) => u64(route.rtnl_link_get_stat(link, id));
    return {
      rxBytes: stat(RTNL_LINK.RX_BYTES),
      txBytes: stat(RTNL_LINK.TX_BYTES),
      rxPackets: stat(RTNL_LINK.RX_PACKETS),
      txPackets: stat(RTNL_LINK.TX_PACKETS),
      rxDropped: stat(RTNL_LINK.RX_DROPPED),
      txDropped: stat(RTNL_LINK.TX_DROPPED),
    };
  } finally {
    route.rtnl_link_put(link);
  }
}

/** `ip link set NAME mtu MTU`. The kernel refuses an MTU outside the device's range with EINVAL. */
export function linkSetMtu(name: string, mtu: number): void {
  const op = `linkSetMtu ${name} ${mtu}`;
  checkUint(op, 'MTU', mtu, 0xffffffff);
  changeLink(op, name, (cur) => cur.mtu === mtu, (c) => route.rtnl_link_set_mtu(c, mtu));
}

/** `ip link set NAME txqueuelen QLEN`. */
export function linkSetTxQLen(name: string, qlen: number): void {
  const op = `linkSetTxQLen ${name} ${qlen}`;
  checkUint(op, 'txqueuelen', qlen, 0xffffffff);
  changeLink(op, name, (cur) => cur.txQLen === qlen, (c) => route.rtnl_link_set_txqlen(c, qlen));
}

/**
 * `ip link set NAME address MAC`, sent even when the link already has that address: the kernel then
 * marks it as set by the user, which is what pins a bridge's address (a bridge whose address was
 * never set takes the lowest address of its ports, so it changes as ports come and go).
 */
export function linkSetMac(name: string, mac: string): void {
  const op = `linkSetMac ${name} ${mac}`;
  if (typeof mac !== 'string' || !/^([0-9a-f]{2}:){5}[0-9a-f]{2}$/i.test(mac)) throw new ConfigError(`${op}: invalid MAC address ${JSON.stringify(mac)}`);
  const out: Out = [null];
  const rc = nl.nl_addr_parse(mac, AF_LLC, out) as number;
  if (rc < 0 || !out[0]) throw nlError(op, rc < 0 ? rc : -NLE.PARSE_ERR);
  const addr = out[0];
  try {
    changeLink(op, name, () => false, (c) => route.rtnl_link_set_addr(c, addr));
  } finally {
    nl.nl_addr_put(addr);
  }
}

/** `ip link set NAME promisc on`. */
export function setPromiscOn(name: string): void {
  changeLink(`setPromiscOn ${name}`, name, (cur) => cur.promisc, (c) => route.rtnl_link_set_flags(c, IFF_PROMISC));
}

/** `ip link set NAME promisc off`. */
export function setPromiscOff(name: string): void {
  changeLink(`setPromiscOff ${name}`, name, (cur) => !cur.promisc, (c) => route.rtnl_link_unset_flags(c, IFF_PROMISC));
}

/**
 * The smallest MTU among links that are administratively up and neither loopback nor point-to-point
 * (kubenet's detection of the pod MTU); undefined when there is no such link.
 */
export function minHostMtu(): number | undefined {
  let min: number | undefined;
  for (const l of linkList()) {
    if (!l.up || l.loopback || l.pointToPoint) continue;
    if (min === undefined || l.mtu < min) min = l.mtu;
  }
  return min;
}
