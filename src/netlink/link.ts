/**
 * Links, named after iproute2: `ip link show` (by name, by ifindex, all), `ip -s link` counters,
 * `ip link set` (mtu, txqueuelen, address, promisc); and the link primitives on a given socket that
 * addresses, namespaces and tc classes share (getLinkOn, linkIndexOn, toLinkInfo). Every request
 * but the counters' runs off the event loop on a socket of its own (./socket.ts withHostSocket);
 * `linkStats` stays synchronous on the shared host socket for its synchronous callers (the traffic
 * counters), as do the primitives it and the tc class reads use (getLink, linkIndex). Setters send
 * nothing when the link is already in the wanted state, but for linkSetMac (see there).
 */
import {
  AF_LLC,
  AF_UNSPEC,
  IFF_LOOPBACK,
  IFF_POINTOPOINT,
  IFF_PROMISC,
  IFF_UP,
  nl,
  route,
  RTNL_LINK,
  type Out,
  type Ptr,
} from './libnl.js';
import { ConfigError, NetlinkError } from '../errors.js';
import { E, NLE, nlError } from './errno.js';
import { checkIfname, checkUint } from './parse.js';
import { check, hostSocket, withHostSocket, type Lease } from './socket.js';

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

/** rtnl_link_get_kernel by name or ifindex, off the event loop; the caller owns the result (rtnl_link_put). Absence → ENODEV. */
export async function getLinkOn(l: Lease, nameOrIndex: string | number): Promise<Ptr> {
  const out: Out = [null];
  const rc =
    typeof nameOrIndex === 'number'
      ? await l.call(route.rtnl_link_get_kernel, l.sk, nameOrIndex, null, out)
      : await l.call(route.rtnl_link_get_kernel, l.sk, 0, nameOrIndex, out);
  l.check(rc, E.ENODEV);
  if (!out[0]) throw new NetlinkError(l.op, E.ENODEV, 'Object not found');
  return out[0];
}

/** The link by name or ifindex as LinkInfo, off the event loop. Absence → ENODEV. */
export async function linkInfoOn(l: Lease, nameOrIndex: string | number): Promise<LinkInfo> {
  const link = await getLinkOn(l, nameOrIndex);
  try {
    return toLinkInfo(link);
  } finally {
    route.rtnl_link_put(link);
  }
}

/** The ifindex of the link `name`, off the event loop. Absence → ENODEV. */
export async function linkIndexOn(l: Lease, name: string): Promise<number> {
  const link = await getLinkOn(l, name);
  try {
    return route.rtnl_link_get_ifindex(link) as number;
  } finally {
    route.rtnl_link_put(link);
  }
}

/** rtnl_link_get_kernel by name or ifindex on the event loop (for the synchronous counters); the caller owns the result. Absence → ENODEV. */
export function getLink(sk: Ptr, op: string, nameOrIndex: string | number): Ptr {
  const out: Out = [null];
  const rc =
    typeof nameOrIndex === 'number'
      ? route.rtnl_link_get_kernel(sk, nameOrIndex, null, out)
      : route.rtnl_link_get_kernel(sk, 0, nameOrIndex, out);
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
 * in the wanted state (no request, no netlink event). Both requests off the event loop, one socket.
 */
async function changeLink(op: string, name: string, already: (cur: LinkInfo) => boolean, build: (change: Ptr) => void): Promise<void> {
  checkIfname(op, name);
  await withHostSocket(op, async (l) => {
    const orig = await getLinkOn(l, name);
    try {
      if (already(toLinkInfo(orig))) return;
      const change = route.rtnl_link_alloc() as Ptr;
      if (!change) throw new NetlinkError(op, E.ENOMEM, 'rtnl_link_alloc failed');
      try {
        build(change);
        l.check(await l.call(route.rtnl_link_change, l.sk, orig, change, 0), E.ENODEV);
      } finally {
        route.rtnl_link_put(change);
      }
    } finally {
      route.rtnl_link_put(orig);
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Public API.

/** `ip link show NAME`. Rejects with NetlinkError errno 19 (ENODEV) when there is no such link. */
export async function linkByName(name: string): Promise<LinkInfo> {
  const op = `linkByName ${name}`;
  checkIfname(op, name);
  return withHostSocket(op, (l) => linkInfoOn(l, name));
}

/** `ip link show` by ifindex. Rejects with NetlinkError errno 19 (ENODEV) when there is no such link. */
export async function linkByIndex(ifindex: number): Promise<LinkInfo> {
  const op = `linkByIndex ${ifindex}`;
  checkUint(op, 'ifindex', ifindex, 0x7fffffff);
  if (ifindex === 0) throw new ConfigError(`${op}: ifindex must be positive`);
  return withHostSocket(op, (l) => linkInfoOn(l, ifindex));
}

/** `ip link show`: every link of this network namespace, in kernel (ifindex) order. */
export async function linkList(): Promise<LinkInfo[]> {
  return withHostSocket('linkList', async (l) => {
    const cache = await l.dump((out) => l.call(route.rtnl_link_alloc_cache, l.sk, AF_UNSPEC, out));
    try {
      const result: LinkInfo[] = [];
      for (let k = nl.link_cache_first(cache) as Ptr; k; k = nl.link_cache_next(k) as Ptr) result.push(toLinkInfo(k));
      return result;
    } finally {
      nl.nl_cache_free(cache);
    }
  });
}

/**
 * `ip -s link show NAME` (NAME, or an ifindex): the link's counters. Throws NetlinkError ENODEV when
 * there is no such link. Synchronous, on the event loop: its callers (the pods' traffic counters,
 * src/pod/lifecycle/inspect.ts) are.
 */
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
export async function linkSetMtu(name: string, mtu: number): Promise<void> {
  const op = `linkSetMtu ${name} ${mtu}`;
  checkUint(op, 'MTU', mtu, 0xffffffff);
  await changeLink(
    op,
    name,
    (cur) => cur.mtu === mtu,
    (c) => route.rtnl_link_set_mtu(c, mtu),
  );
}

/** `ip link set NAME txqueuelen QLEN`. */
export async function linkSetTxQLen(name: string, qlen: number): Promise<void> {
  const op = `linkSetTxQLen ${name} ${qlen}`;
  checkUint(op, 'txqueuelen', qlen, 0xffffffff);
  await changeLink(
    op,
    name,
    (cur) => cur.txQLen === qlen,
    (c) => route.rtnl_link_set_txqlen(c, qlen),
  );
}

/**
 * `ip link set NAME address MAC`, sent even when the link already has that address: the kernel then
 * marks it as set by the user, which is what pins a bridge's address (a bridge whose address was
 * never set takes the lowest address of its ports, so it changes as ports come and go).
 */
export async function linkSetMac(name: string, mac: string): Promise<void> {
  const op = `linkSetMac ${name} ${mac}`;
  if (typeof mac !== 'string' || !/^([0-9a-f]{2}:){5}[0-9a-f]{2}$/i.test(mac))
    throw new ConfigError(`${op}: invalid MAC address ${JSON.stringify(mac)}`);
  const out: Out = [null];
  const rc = nl.nl_addr_parse(mac, AF_LLC, out) as number;
  if (rc < 0 || !out[0]) throw nlError(op, rc < 0 ? rc : -NLE.PARSE_ERR);
  const addr = out[0];
  try {
    await changeLink(
      op,
      name,
      () => false,
      (c) => route.rtnl_link_set_addr(c, addr),
    );
  } finally {
    nl.nl_addr_put(addr);
  }
}

/** `ip link set NAME promisc on`. */
export async function setPromiscOn(name: string): Promise<void> {
  await changeLink(
    `setPromiscOn ${name}`,
    name,
    (cur) => cur.promisc,
    (c) => route.rtnl_link_set_flags(c, IFF_PROMISC),
  );
}

/** `ip link set NAME promisc off`. */
export async function setPromiscOff(name: string): Promise<void> {
  await changeLink(
    `setPromiscOff ${name}`,
    name,
    (cur) => !cur.promisc,
    (c) => route.rtnl_link_unset_flags(c, IFF_PROMISC),
  );
}

/**
 * The smallest MTU among links that are administratively up and neither loopback nor point-to-point
 * (kubenet's detection of the pod MTU); undefined when there is no such link.
 */
export async function minHostMtu(): Promise<number | undefined> {
  let min: number | undefined;
  for (const l of await linkList()) {
    if (!l.up || l.loopback || l.pointToPoint) continue;
    if (min === undefined || l.mtu < min) min = l.mtu;
  }
  return min;
}
