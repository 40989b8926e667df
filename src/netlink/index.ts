/**
 * Typed netlink API over libnl-route (./libnl.ts: the koffi declarations), named after iproute2.
 *
 * Every function but linkDelete is synchronous: one koffi call is a few µs and a netlink round trip a
 * few tens, so there is nothing to gain from the thread pool and a lot to lose (netns switching must
 * never span an await). linkDelete is the exception because the kernel holds its request for tens of
 * milliseconds after the link is already gone (see there). One NETLINK_ROUTE socket serves the
 * process's own namespace; it is opened on first use and reused. Sockets into other namespaces are
 * opened per call and freed before returning.
 *
 * Errors are NetlinkError with a positive Linux errno; libnl's NLE_* codes are translated by an
 * explicit table in ./errno.ts (libnl loses the kernel errno, so the table is the single place that decides).
 * Kernel operations are idempotent where the contract says so: deleting what is absent succeeds.
 */
import {
  AF_INET,
  AF_INET6,
  AF_LLC,
  AF_UNSPEC,
  CLONE_NEWNET,
  IFF_LOOPBACK,
  IFF_POINTOPOINT,
  IFF_PROMISC,
  IFF_UP,
  IFNAMSIZ,
  IFREQ_SIZE,
  lastErrno,
  libcNs,
  NS_GET_NSTYPE,
  nl,
  route,
  RTNL_LINK,
  SIOCGIFINDEX,
  SIOCGIFNAME,
  SIOCGIFTXQLEN,
  SOCK_CLOEXEC,
  SOCK_DGRAM,
  tc,
  type Out,
  type Ptr,
} from './libnl.js';
import { ConfigError, NetlinkError } from '../errors.js';
import { isValidIfName } from '../net/ifname.js';
import { parsePrefixed, type PrefixedAddress } from '../net/ip.js';
import { E, NLE, nlError, sysError } from './errno.js';
import { check, connectSocket, dumpCache, hostSocket, socketInNetns } from './socket.js';
import { toClassStats, type TcClassStats } from './tc-class.js';

export { E, ifPresent, isNoDevice, NLE, nleToErrno } from './errno.js';
export { classGet, type TcClassStats } from './tc-class.js';
export { routeDel, routeList, routeReplace, type RouteInfo, type RouteSpec } from './route.js';

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

export interface AddrInfo {
  family: 4 | 6;
  ip: string;
  prefixLen: number;
  /** "10.1.2.3/24": the address with its prefix length, host bits kept. */
  cidr: string;
  /** rtm scope: 0 universe/global, 200 site, 253 link, 254 host. */
  scope: number;
}

// ---------------------------------------------------------------------------------------------
// Parsing (pure).

/** The kernel's dev_valid_name: 1-15 bytes, not "." or "..", no '/', ':' or whitespace. */
function checkIfname(op: string, name: string): void {
  if (!isValidIfName(name)) throw new ConfigError(`${op}: invalid interface name ${JSON.stringify(name)}`);
}

function afOf(op: string, family: 4 | 6 | undefined): number {
  if (family === undefined) return AF_UNSPEC;
  if (family === 4) return AF_INET;
  if (family === 6) return AF_INET6;
  throw new ConfigError(`${op}: family must be 4 or 6, got ${JSON.stringify(family)}`);
}

function parseAddrCidr(op: string, cidr: string): PrefixedAddress {
  const p = parsePrefixed(cidr);
  if (!p) throw new ConfigError(`${op}: invalid address ${JSON.stringify(cidr)} (want "10.1.2.3/24" or "fd00::1/64")`);
  return p;
}

// ---------------------------------------------------------------------------------------------
// Object conversion.

function toLinkInfo(link: Ptr): LinkInfo {
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
    mac: macOf(link),
  };
}

const macBuf = Buffer.alloc(64);

function macOf(link: Ptr): string {
  const a = route.rtnl_link_get_addr(link) as Ptr; // borrowed
  if (!a) return '';
  const text = nl.nl_addr2str(a, macBuf, macBuf.length) as string;
  return text === 'none' ? '' : text;
}

const addrBuf = Buffer.alloc(128);

function toAddrInfo(addr: Ptr): AddrInfo | undefined {
  const af = route.rtnl_addr_get_family(addr) as number;
  if (af !== AF_INET && af !== AF_INET6) return undefined;
  const local = route.rtnl_addr_get_local(addr) as Ptr; // borrowed
  if (!local) return undefined;
  // nl_addr2str appends "/len" unless the prefix is full; the prefix comes from the rtnl_addr.
  const text = nl.nl_addr2str(local, addrBuf, addrBuf.length) as string;
  const ip = text.split('/')[0] ?? text;
  const prefixLen = route.rtnl_addr_get_prefixlen(addr) as number;
  return { family: af === AF_INET ? 4 : 6, ip, prefixLen, cidr: `${ip}/${prefixLen}`, scope: route.rtnl_addr_get_scope(addr) as number };
}

// ---------------------------------------------------------------------------------------------
// Primitives on a given socket.

/** rtnl_link_get_kernel by name or ifindex; the caller owns the result (rtnl_link_put). Absence → ENODEV. */
function getLink(sk: Ptr, op: string, nameOrIndex: string | number): Ptr {
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

function linkIndex(sk: Ptr, op: string, name: string): number {
  const link = getLink(sk, op, name);
  try {
    return route.rtnl_link_get_ifindex(link) as number;
  } finally {
    route.rtnl_link_put(link);
  }
}

function addrListOn(sk: Ptr, op: string, ifname: string, family: 4 | 6 | undefined): AddrInfo[] {
  checkIfname(op, ifname);
  const af = afOf(op, family);
  const ifindex = linkIndex(sk, op, ifname);
  const cache = dumpCache(sk, op, (out) => route.rtnl_addr_alloc_cache(sk, out) as number);
  try {
    const result: AddrInfo[] = [];
    for (let a = nl.addr_cache_first(cache) as Ptr; a; a = nl.addr_cache_next(a) as Ptr) {
      if ((route.rtnl_addr_get_ifindex(a) as number) !== ifindex) continue;
      if (af !== AF_UNSPEC && (route.rtnl_addr_get_family(a) as number) !== af) continue;
      const info = toAddrInfo(a);
      if (info) result.push(info);
    }
    return result;
  } finally {
    nl.nl_cache_free(cache);
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

function checkUint(op: string, what: string, v: number, max: number): void {
  if (!Number.isInteger(v) || v < 0 || v > max) throw new ConfigError(`${op}: invalid ${what} ${JSON.stringify(v)}`);
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

/**
 * `tc -s class show dev NAME` (NAME, or an ifindex): every class of the device with the kernel's
 * counters, from ONE RTM_GETTCLASS dump (the kernel dumps classes per device). No exec, no text:
 * the counters are the kernel's TCA_STATS2 as libnl parses them. A device without classes gives [];
 * a missing device throws NetlinkError ENODEV.
 */
export function classList(dev: string | number): TcClassStats[] {
  const op = `classList ${dev}`;
  const sk = hostSocket(op);
  let ifindex: number;
  if (typeof dev === 'number') {
    checkUint(op, 'ifindex', dev, 0x7fffffff);
    if (dev === 0) throw new ConfigError(`${op}: ifindex must be positive`);
    ifindex = dev;
  } else {
    checkIfname(op, dev);
    ifindex = linkIndex(sk, op, dev);
  }
  const cache = dumpCache(sk, op, (out) => tc.rtnl_class_alloc_cache(sk, ifindex, out) as number);
  try {
    const result: TcClassStats[] = [];
    for (let c = nl.class_cache_first(cache) as Ptr; c; c = nl.class_cache_next(c) as Ptr) result.push(toClassStats(c));
    return result;
  } finally {
    nl.nl_cache_free(cache);
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

/** `ip addr show dev NAME [-4|-6]`, in kernel order (IPv4 first). Missing link → ENODEV. */
export function addrList(name: string, family?: 4 | 6): AddrInfo[] {
  const op = `addrList ${name}`;
  return addrListOn(hostSocket(op), op, name, family);
}

/** `ip addr show` of every link: each address with the ifindex of its link. */
export function addrListAll(): Array<AddrInfo & { ifindex: number }> {
  const op = 'addrListAll';
  const sk = hostSocket(op);
  const cache = dumpCache(sk, op, (out) => route.rtnl_addr_alloc_cache(sk, out) as number);
  try {
    const result: Array<AddrInfo & { ifindex: number }> = [];
    for (let a = nl.addr_cache_first(cache) as Ptr; a; a = nl.addr_cache_next(a) as Ptr) {
      const info = toAddrInfo(a);
      if (info) result.push({ ...info, ifindex: route.rtnl_addr_get_ifindex(a) as number });
    }
    return result;
  } finally {
    nl.nl_cache_free(cache);
  }
}

/**
 * `ip addr del CIDR dev NAME`. Idempotent: an absent address or an absent link is success.
 * The prefix length is part of the match, as in the kernel: "10.1.2.3/16" does not remove 10.1.2.3/24.
 */
export function addrDel(name: string, cidr: string): void {
  const op = `addrDel ${name} ${cidr}`;
  checkIfname(op, name);
  const parsed = parseAddrCidr(op, cidr);
  const sk = hostSocket(op);
  let ifindex: number;
  try {
    ifindex = linkIndex(sk, op, name);
  } catch (err) {
    if (err instanceof NetlinkError && err.errno === E.ENODEV) return;
    throw err;
  }
  const outAddr: Out = [null];
  const prc = nl.nl_addr_parse(`${parsed.ip}/${parsed.prefixLen}`, parsed.family === 4 ? AF_INET : AF_INET6, outAddr) as number;
  if (prc < 0 || !outAddr[0]) throw nlError(op, prc < 0 ? prc : -NLE.PARSE_ERR);
  const local = outAddr[0];
  try {
    const addr = route.rtnl_addr_alloc() as Ptr;
    if (!addr) throw new NetlinkError(op, E.ENOMEM, 'rtnl_addr_alloc failed');
    try {
      route.rtnl_addr_set_ifindex(addr, ifindex);
      route.rtnl_addr_set_family(addr, parsed.family === 4 ? AF_INET : AF_INET6);
      const src = route.rtnl_addr_set_local(addr, local) as number;
      if (src < 0) throw nlError(op, src);
      route.rtnl_addr_set_prefixlen(addr, parsed.prefixLen);
      const rc = route.rtnl_addr_delete(sk, addr, 0) as number;
      if (rc >= 0) return;
      const nle = Math.abs(rc);
      // EADDRNOTAVAIL (no such address), ENOENT/ESRCH, ENODEV (link gone meanwhile): already absent.
      if (nle === NLE.NOADDR || nle === NLE.OBJ_NOTFOUND || nle === NLE.NODEV) return;
      check(sk, op, rc, E.ENOENT);
    } finally {
      route.rtnl_addr_put(addr);
    }
  } finally {
    nl.nl_addr_put(local);
  }
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

/**
 * `ip -n NS addr show dev IFNAME`: addresses of a link inside the network namespace mounted at
 * `netnsPath` (e.g. /var/run/netns/x or /proc/PID/ns/net). Missing path → errno 2 (ENOENT); a path
 * that is not a network namespace → errno 22 (EINVAL); missing link → errno 19 (ENODEV).
 */
export function netnsAddrList(netnsPath: string, ifname: string, family?: 4 | 6): AddrInfo[] {
  const op = `netnsAddrList ${netnsPath} ${ifname}`;
  checkIfname(op, ifname);
  afOf(op, family);
  const sk = socketInNetns(op, netnsPath);
  try {
    return addrListOn(sk, op, ifname, family);
  } finally {
    nl.nl_socket_free(sk);
  }
}

/**
 * `ip -n NS link show IFNAME`: a link inside the network namespace mounted at `netnsPath`, or
 * undefined when the namespace has no such link. Missing path → errno 2 (ENOENT); a path that is
 * not a network namespace → errno 22 (EINVAL).
 */
export function netnsLinkByName(netnsPath: string, ifname: string): LinkInfo | undefined {
  const op = `netnsLinkByName ${netnsPath} ${ifname}`;
  checkIfname(op, ifname);
  const sk = socketInNetns(op, netnsPath);
  try {
    const link = getLink(sk, op, ifname);
    try {
      return toLinkInfo(link);
    } finally {
      route.rtnl_link_put(link);
    }
  } catch (err) {
    if (err instanceof NetlinkError && err.errno === E.ENODEV) return undefined;
    throw err;
  } finally {
    nl.nl_socket_free(sk);
  }
}

/** A datagram socket of this process's own network namespace for SIOC* requests, opened on first use. */
let ioctlFd = -1;
const ifreq = Buffer.alloc(IFREQ_SIZE);

/**
 * One SIOC* request on a struct ifreq naming the link by `name` (or by index for SIOCGIFNAME);
 * returns the int at offset IFNAMSIZ (ifr_ifindex / ifr_qlen), or undefined when there is no such
 * link (ENODEV). One syscall, no netlink message to build or parse: for the hot path's lookups.
 */
function ifreqInt(op: string, request: number, name: string | undefined, index = 0): number | undefined {
  if (ioctlFd < 0) {
    ioctlFd = libcNs.socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0) as number;
    if (ioctlFd < 0) throw sysError(op, lastErrno(), 'socket');
  }
  ifreq.fill(0);
  if (name !== undefined) ifreq.write(name, 0, IFNAMSIZ - 1, 'latin1');
  else ifreq.writeInt32LE(index, IFNAMSIZ);
  if ((libcNs.ioctlIfreq(ioctlFd, request, ifreq) as number) === 0) return ifreq.readInt32LE(IFNAMSIZ);
  const errno = lastErrno();
  if (errno === E.ENODEV) return undefined;
  throw sysError(op, errno, `ioctl ${request.toString(16)}`);
}

/**
 * Whether a link with this ifindex exists in this process's network namespace: one ioctl
 * (SIOCGIFNAME). For polling a link that is going away.
 */
export function linkIndexExists(ifindex: number): boolean {
  return ifreqInt(`linkIndexExists ${ifindex}`, SIOCGIFNAME, undefined, ifindex) !== undefined;
}

/** The ifindex of the link `name` in this process's network namespace, undefined when there is none (one ioctl). */
export function linkIndexByName(name: string): number | undefined {
  const op = `linkIndexByName ${name}`;
  checkIfname(op, name);
  return ifreqInt(op, SIOCGIFINDEX, name);
}

/** The txqueuelen of the link `name`, undefined when there is no such link (one ioctl). */
export function linkTxQLen(name: string): number | undefined {
  const op = `linkTxQLen ${name}`;
  checkIfname(op, name);
  return ifreqInt(op, SIOCGIFTXQLEN, name);
}

/**
 * `ip -n NS link del IFNAME`: deletes a link inside the network namespace at `netnsPath` (a veth's
 * peer goes with it), waiting for the kernel's answer. Absent link: success. For the rare path where
 * the host side cannot be reached (an ADD cut before its veth joined the bridge).
 */
export function netnsLinkDelete(netnsPath: string, ifname: string): void {
  const op = `netnsLinkDelete ${netnsPath} ${ifname}`;
  checkIfname(op, ifname);
  const sk = socketInNetns(op, netnsPath);
  try {
    let link: Ptr;
    try {
      link = getLink(sk, op, ifname);
    } catch (err) {
      if (err instanceof NetlinkError && err.errno === E.ENODEV) return;
      throw err;
    }
    try {
      const rc = route.rtnl_link_delete(sk, link) as number;
      if (rc < 0 && Math.abs(rc) !== NLE.NODEV && Math.abs(rc) !== NLE.OBJ_NOTFOUND) check(sk, op, rc);
    } finally {
      route.rtnl_link_put(link);
    }
  } finally {
    nl.nl_socket_free(sk);
  }
}

/**
 * Whether the open file descriptor `fd` is a network namespace (ioctl NS_GET_NSTYPE == CLONE_NEWNET).
 * False for any other namespace type and for files that are not namespaces at all.
 */
export function isNetnsFd(fd: number): boolean {
  return (libcNs.ioctl(fd, NS_GET_NSTYPE) as number) === CLONE_NEWNET;
}

// ---------------------------------------------------------------------------------------------
// Deleting a link without waiting for the kernel to free it.

/** libuv's thread pool, shared with fs and dns: deletions may hold all but two of its threads. */
const POOL_SIZE = Number(process.env.UV_THREADPOOL_SIZE) || 4;
const MAX_DELETIONS = Math.max(1, POOL_SIZE - 2);
const deletions = new Set<Promise<void>>();

/** Deletions started by linkDelete whose kernel request has not returned yet (the device not yet freed). */
export function linkDeletionsInFlight(): number {
  return deletions.size;
}

/** Resolves once every deletion started so far has been answered by the kernel (errors go to each caller's `finished`). */
export async function linkDeletionsSettled(): Promise<void> {
  while (deletions.size > 0) await Promise.all([...deletions]);
}

export interface LinkDeletion {
  /** Milliseconds until the link no longer resolved by index (what the caller waited for). */
  goneMs: number;
  /** Settles when the kernel answers the request: the device is freed, or the error. */
  finished: Promise<void>;
}

/**
 * `ip link del` of the link with `ifindex`, returning as soon as the link is gone from the namespace
 * rather than when the kernel has finished freeing it. The kernel unlists a link at the start of the
 * delete (its name, addresses and routes disappear, a veth's peer with it), but answers RTM_DELLINK
 * only after the device's last references are dropped and an RCU barrier has passed: 15–40 ms here,
 * against ~1 ms to unlist. So the request runs on a libuv worker thread (koffi `.async`) with a socket
 * of its own, and this polls the link by index until it is gone, or until the request fails first
 * (rejecting with its NetlinkError; ENODEV counts as gone). At most UV_THREADPOOL_SIZE − 2 deletions
 * are outstanding at once: beyond that this first waits for one to finish. A missing link is gone
 * at once. Only for links in this process's own network namespace.
 */
export async function linkDelete(ifindex: number): Promise<LinkDeletion> {
  const op = `linkDelete ${ifindex}`;
  checkUint(op, 'ifindex', ifindex, 0x7fffffff);
  if (ifindex === 0) throw new ConfigError(`${op}: ifindex must be positive`);
  while (deletions.size >= MAX_DELETIONS) await Promise.race(deletions);
  const started = performance.now();
  const sk = connectSocket(op);
  const link = route.rtnl_link_alloc() as Ptr;
  if (!link) {
    nl.nl_socket_free(sk);
    throw new NetlinkError(op, E.ENOMEM, 'rtnl_link_alloc failed');
  }
  route.rtnl_link_set_ifindex(link, ifindex);
  let outcome: { err?: NetlinkError } | undefined;
  const finished = new Promise<void>((resolve, reject) => {
    route.rtnl_link_delete.async(sk, link, (callErr: unknown, rc: number) => {
      route.rtnl_link_put(link);
      nl.nl_socket_free(sk);
      let err: NetlinkError | undefined;
      if (callErr) err = new NetlinkError(op, E.EIO, `koffi async call failed: ${String(callErr)}`);
      else if (rc < 0 && Math.abs(rc) !== NLE.NODEV && Math.abs(rc) !== NLE.OBJ_NOTFOUND) err = nlError(op, rc);
      outcome = err ? { err } : {};
      if (err) reject(err);
      else resolve();
    });
  });
  const tracked = finished.catch(() => undefined);
  deletions.add(tracked);
  void tracked.then(() => deletions.delete(tracked));
  for (let polls = 0; ; polls++) {
    if (outcome) {
      if (outcome.err) throw outcome.err;
      break;
    }
    // One ioctl per poll (~µs), not a netlink round trip with a whole link to parse.
    if (!linkIndexExists(ifindex)) break;
    // The first polls only yield to the event loop (unlisting takes well under a millisecond of
    // kernel time); after that, back off to timers so a slow delete does not spin a core.
    await new Promise<void>((r) => (polls < 50 ? setImmediate(r) : setTimeout(r, 1)));
  }
  return { goneMs: performance.now() - started, finished };
}
